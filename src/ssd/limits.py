"""Size bounds, named in one place and checked before anything is allocated.

Each bound protects the machine from a value that is valid in type but absurd in size (a typo, an edited file, a
hostile input). A check that fails raises the caller's error type with a message that names the option or file, the
value and the bound. The type tests those checks share are here too: :func:`is_whole`, :func:`is_real`.
"""

from __future__ import annotations

import numbers
import reprlib
import sys
from typing import Any

__all__ = ["MAX_INPUT_SIDE", "MAX_PRIORS", "MAX_TILES_PER_IMAGE", "MIN_TILE", "MAX_STREAMS", "MAX_BOXES_PER_IMAGE",
           "MAX_WAIT_MS", "MAX_CROP_CACHE_BYTES", "MAX_SAVED_CROPS", "MAX_DETECTIONS", "MAX_ONNX_RUNTIME_BYTES",
           "MAX_YAML_ALIASES", "MAX_YAML_NODES", "MAX_VALUE_CHARS", "MAX_EPOCHS", "MAX_TRAIN_MINUTES",
           "MAX_DETECTIONS_FILE_BYTES", "MAX_DETECTIONS_PER_IMAGE", "MAX_NAME_CHARS", "MAX_GLOB_PATHS",
           "MAX_WORKERS", "MAX_DISK_CACHE_BYTES", "MAX_CLASSES",
           "MAX_UPLOAD_BYTES", "MAX_CONNECTIONS", "value_text", "is_whole", "is_real"]

MAX_INPUT_SIDE = 4096
"""Largest side of the network input in pixels (``--image-size``, a checkpoint's ``image_size``)."""

MAX_PRIORS = 1_000_000
"""Most default boxes one model may have (SSD512 has 24,564)."""

MAX_TILES_PER_IMAGE = 1024
"""Most tiles one image may be cut into by ``--tile`` / ``--tile-overlap``."""

MIN_TILE = 32
"""Smallest tile side in pixels of ``--tile`` (smaller ones would cut an image into thousands of crops)."""

MAX_WAIT_MS = 10_000
"""The longest ``ssd serve --max-wait-ms``: how long a request may wait for others to batch with."""
MAX_STREAMS = 64
"""Most live sources one ``ssd predict`` reads at once (the lines of a ``.streams`` file), each with its thread."""

MAX_BOXES_PER_IMAGE = 10_000
"""Most annotated objects in one image."""

MAX_DETECTIONS = 10_000
"""Most detections per image an exported NMS graph may return (``--max-det`` of ``ssd export --nms``, the ``max_det``
of a model card): its output is ``[B, max_det, 6]``, allocated whatever the image holds."""

MAX_ONNX_RUNTIME_BYTES = 8 * 2**30
"""Most memory ONNX Runtime's CPU arena may hold for the sessions of a process (the arena limit of
:class:`ssd.inference.backends.onnx.OnnxBackend`): a graph that asks for more fails with one line instead of taking the
machine's memory."""

MAX_GRAPH_BYTES = 4 * 2**30
"""Most memory the tensors of an exported graph may take at batch 1, every intermediate result and weight summed as
if none were freed (``.pt2`` programs, OpenVINO IR, NCNN graphs; read from the graph's shapes before it runs): a file
re-sealed to allocate more (one ``[40000, 40000]`` float tensor is 6 GiB) is refused with one line. ``ssd_tiny``
(128 px) takes about 14 MiB, SSDLite 120 MiB, SSD512 VGG16 720 MiB."""

MAX_ARCHIVE_MEMBER_BYTES = 256 * 2**20
"""Largest member of a ``.pt2`` archive that is read whole before loading it (its JSON and sample inputs, checked
by :func:`ssd.inference.backends.pt2.check_archive`), by the size its zip directory states, before reading it."""

MAX_CROP_CACHE_BYTES = 4 * 2**30
"""Most RAM the image cache of ``--cache-images ram`` may take (at the input size, or with ``--crop-scale`` near
native resolution): larger caches are downscaled by one common factor, reported (:func:`ssd.data.crops.fit_in_bytes`),
and refused below :data:`ssd.data.image_cache.MIN_CACHE_DOWNSCALE`."""

MAX_DISK_CACHE_BYTES = 256 * 2**30
"""Largest file ``--cache-images disk`` may write (the decoded images, :mod:`ssd.data.disk_cache`): larger caches
are refused, naming their size (a typo in ``--image-size`` or ``--crop-scale native`` on huge photos)."""

MAX_SAVED_CROPS = 100_000
"""Most detection crops one ``ssd predict --save-crop`` run saves; the others are counted and reported."""

MAX_UPLOAD_BYTES = 16 * 2**20
"""Largest request body ``ssd serve`` accepts (an image upload): refused with 413 from its ``Content-Length``, or once
that many bytes have arrived, before the body is read whole."""

MAX_CONNECTIONS = 512
"""Most connections and requests ``ssd serve`` holds at once (uvicorn's ``limit_concurrency``): a request past it is
answered 503 by uvicorn itself, before the app, so that idle connections cannot use up the process's file descriptors
(1024 by default) and starve ``/health``."""

MAX_YAML_ALIASES = 100
"""Most alias references a YAML file may use (an alias bomb expands a dozen lines to billions of items)."""

MAX_YAML_NODES = 100_000
"""Most values (scalars, lists, mappings) a YAML file may hold with every alias expanded."""

MAX_VALUE_CHARS = 80
"""Longest rendering of a user value inside an error message (longer values are cut before formatting)."""

MAX_EPOCHS = 100_000
"""Most epochs a training option may count (``--epochs``, ``--warmup-epochs``, ``--schedule-epochs``, ...)."""

MAX_TRAIN_MINUTES = 366 * 24 * 60
"""Longest training budget ``--time`` may give, in minutes (a year; ``1e308`` would overflow the clock's sums)."""

MAX_DETECTIONS_FILE_BYTES = 256 * 2**20
"""Largest detections file ``ssd val --detections`` reads (a COCO results list; 2.5 million detections of ~100 bytes).
Checked before the file is read."""

MAX_DETECTIONS_PER_IMAGE = 10_000
"""Most detections one image may have in a detections file (COCO scores at most 100)."""

MAX_NAME_CHARS = 200
"""Longest class name, in characters (a dataset's, a checkpoint's, ``--classes``)."""

MAX_GLOB_PATHS = 1_000_000
"""Most paths one glob pattern of ``ssd predict`` may expand to (a symlink loop would otherwise never end)."""

MAX_SAVED_FRAMES = 100_000
"""Most frame images of videos and live streams one ``ssd predict`` run saves (``--save-txt``'s images and labels,
Label Studio's frames), as :data:`MAX_SAVED_CROPS` bounds crops: a stream runs for ever. The others are counted and
reported; their detections stay in the JSONL."""

MAX_TRACKER_FILE_BYTES = 64 * 2**10
"""Largest ``--tracker`` YAML (ten settings take under a kilobyte; a 20 MB file took 73 s to parse). Checked before
it is read, and before the model loads."""

MAX_TRACK_FRAMES = 100_000
"""Most frames in a tracker's ``lost_track_buffer`` and ``minimum_consecutive_frames`` (about an hour at 30 fps)."""

MAX_WORKERS = 64
"""Most data-loading processes or decoding threads one command may start (``--workers``)."""

MAX_CLASSES = 10_000
"""Most object classes a dataset may have (LVIS has 1,203): checked when the names are read (a YAML's ``names``, COCO
``categories``, ``classes.txt``, the names in the annotations), and a YOLO class id at or beyond it is out of range
for any dataset."""


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxlong, _SHORT.maxother = 2, MAX_VALUE_CHARS, 40, MAX_VALUE_CHARS


def value_text(value: Any) -> str:
    """``repr(value)`` for an error message, cut to :data:`MAX_VALUE_CHARS` characters: containers are shortened while
    formatting (:mod:`reprlib`), so a huge or deeply nested value costs no more than a short one."""
    text = _SHORT.repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


def is_whole(value: Any, *, integral: bool = False) -> bool:
    """Whether ``value`` is a whole number: an ``int`` that is not a ``bool`` (``True`` is an ``int`` to Python, never
    a count to a user). ``integral``: any :class:`numbers.Integral` (NumPy's integers too), where such values are
    taken (an input size); otherwise they are refused, as the JSON and YAML values checked are plain ints."""
    return isinstance(value, numbers.Integral if integral else int) and not isinstance(value, bool)


def is_real(value: Any, *, any_real: bool = False, finite: bool = False) -> bool:
    """Whether ``value`` is an ``int`` or a ``float`` (NumPy's ``float64`` too) that is not a ``bool``; NaN and
    infinity are, for the caller's range check to refuse, unless ``finite``: then only finite values a float can
    hold (an int of 400 digits is not: ``math.isfinite`` and ``float`` would raise ``OverflowError`` on it).
    ``any_real``: any :class:`numbers.Real` (NumPy's other floats and its integers too), where such values are taken
    (a prior setting computed with NumPy)."""
    return (isinstance(value, numbers.Real if any_real else (int, float)) and not isinstance(value, bool)
            and (not finite or abs(value) <= sys.float_info.max))  # exact: no conversion to float


def check_graph_bytes(needed: int, source: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` naming ``source`` when an exported graph's tensors take ``needed`` bytes, more than
    :data:`MAX_GRAPH_BYTES` (checked before the graph is compiled or run)."""
    if needed > MAX_GRAPH_BYTES:
        raise error(f"{source} is refused: its graph's tensors take {needed / 2**30:.1f} GiB at batch 1, more than "
                    f"limits.MAX_GRAPH_BYTES ({MAX_GRAPH_BYTES / 2**30:g} GiB); an SSD exported by ssd takes far "
                    "less: export the model again")

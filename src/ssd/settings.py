"""One table of defaults, read by the CLI and the Python API alike, and the error for a bad option value.

Thresholds use one vocabulary everywhere: ``score_threshold`` (keep scores strictly above; ``--conf``),
``iou_threshold`` (per-class NMS; ``--iou``) and ``max_detections`` (per image; ``--max-det``).

- ``PREDICT``: what a user sees (``ssd predict``, ``ssd.load(...).predict()``, ``Detector``, exported NMS graphs, the
  drawn validation figures of a run). A model that stores its own operating point (the confidence that maximised F1
  in its final validation) uses that confidence instead; an explicit value always wins.
- ``EVALUATE``: what is scored (``ssd val``, ``ssd.evaluate``, training's validation): a low confidence and many
  detections per image, as mAP needs the whole precision-recall curve.

The tile options of tiled prediction (``--tile``, ``--tile-overlap``) have one rule too, :func:`check_tile`, and so
do an ONNX export's opset, :func:`check_onnx_options`, and INT8's calibration images,
:func:`check_calib_images`. The options of each command are in :mod:`ssd.schemas`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ssd.errors import ConfigError
from ssd.limits import MAX_DETECTIONS, MAX_WAIT_MS, MIN_TILE, is_real, is_whole, value_text
from ssd.sizes import as_hw

__all__ = ["Thresholds", "PREDICT", "EVALUATE", "CANDIDATES_PER_CLASS", "THRESHOLD_OPTIONS", "check_thresholds",
           "TILE_OVERLAP", "check_tile",
           "check_onnx_options", "check_calib_images", "check_batch_sizes",
           "check_batching"]


@dataclass(frozen=True)
class Thresholds:
    """Post-processing settings: ``score_threshold`` and ``iou_threshold`` in [0, 1], ``max_detections`` >= 1."""

    score_threshold: float
    iou_threshold: float
    max_detections: int

    def as_kwargs(self) -> dict[str, float | int]:
        return {"score_threshold": self.score_threshold, "iou_threshold": self.iou_threshold,
                "max_detections": self.max_detections}


PREDICT = Thresholds(score_threshold=0.25, iou_threshold=0.45, max_detections=100)
EVALUATE = Thresholds(score_threshold=0.01, iou_threshold=0.45, max_detections=200)

CANDIDATES_PER_CLASS = 400
"""The best boxes per image and class that enter NMS: post-processing's default (PyTorch's and numpy's) and exported
graphs' NMS."""

THRESHOLD_OPTIONS = {"score_threshold": "--conf", "iou_threshold": "--iou", "max_detections": "--max-det"}
"""How the CLI spells each threshold, on every subcommand that takes it."""

TILE_OVERLAP = 0.2
"""Share of a tile's side that neighbouring tiles share (at least), :mod:`ssd.inference.tiling`."""


def check_thresholds(score_threshold: float, iou_threshold: float, max_detections: int, batch_size: int = 1, *,
                     names: Mapping[str, str] | None = None) -> None:
    """Raise :class:`ConfigError` for a score or IoU threshold outside ``[0, 1]`` (or NaN), a ``max_detections``
    or ``batch_size`` that is not a positive integer, or a ``max_detections`` above
    :data:`ssd.limits.MAX_DETECTIONS`. ``names`` renames the options in the message (the CLI's
    flags, e.g. :data:`THRESHOLD_OPTIONS`)."""
    names = names or {}
    for key, value in (("score_threshold", score_threshold), ("iou_threshold", iou_threshold)):
        if not (is_real(value) and 0 <= value <= 1):  # NaN too
            raise ConfigError(f"{names.get(key, key)} must be a number in [0, 1], got {value}")
    for key, value in (("max_detections", max_detections), ("batch_size", batch_size)):
        if not is_whole(value) or value < 1:
            raise ConfigError(f"{names.get(key, key)} must be a positive integer, got {value}")
    if max_detections > MAX_DETECTIONS:  # 2**63 overflowed a kernel's int64; 10**8 an NMS graph's allocation
        raise ConfigError(f"{names.get('max_detections', 'max_detections')} {max_detections} is above "
                          f"{MAX_DETECTIONS} (limits.MAX_DETECTIONS), the most detections per image ssd keeps (an "
                          "exported NMS graph allocates its output [B, max_det, 6] whatever the image holds)")


def check_tile(tile: int | str | Sequence[int] | None, overlap: float = TILE_OVERLAP, *,
               names: Mapping[str, str] | None = None) -> str | tuple[int, int] | None:
    """Validate a ``tile`` option: ``None`` (no tiling), ``"auto"``, a side ``N`` or ``(height, width)`` / ``"HxW"``
    pixels (at least :data:`ssd.limits.MIN_TILE`), and ``overlap`` in ``[0, 1)``. Returns ``None``, ``"auto"`` or
    ``(height, width)``; raises :class:`ConfigError` naming the bad value and the rule (``names`` renames ``tile``
    and ``tile_overlap`` in the message, as in :func:`check_thresholds`)."""
    names = names or {}
    if not (is_real(overlap) and 0 <= overlap < 1):
        raise ConfigError(f"{names.get('tile_overlap', 'tile_overlap')} must be a number in [0, 1) (the share of a "
                          f"tile its neighbour also covers), got {overlap!r}")
    if tile is None or (isinstance(tile, str) and tile.strip().lower() == "auto"):
        return None if tile is None else "auto"
    try:
        shape = as_hw(tile)
    except ValueError:
        shape = None
    if shape is None or min(shape) < MIN_TILE:
        raise ConfigError(f"{names.get('tile', 'tile')} must be 'auto', a side N or 'HxW' (height x width) in pixels, "
                          f"each at least {MIN_TILE}, got {tile!r}")
    return shape


def check_onnx_options(opset: int) -> None:
    """Raise :class:`ConfigError` for an ONNX ``opset`` that ``torch.onnx`` cannot write: an option of an ONNX
    export, checked before any work is done (its ``max_detections`` bound is every command's,
    :func:`check_thresholds`)."""
    from torch.onnx._constants import ONNX_MAX_OPSET, ONNX_MIN_OPSET

    if not is_whole(opset) or not ONNX_MIN_OPSET <= opset <= ONNX_MAX_OPSET:
        raise ConfigError(f"opset {opset} cannot be written: torch.onnx writes opsets {ONNX_MIN_OPSET} to "
                          f"{ONNX_MAX_OPSET} (18 and newer natively, lower ones by down-conversion); default 18")


def check_batching(max_batch: int, max_wait_ms: float) -> None:
    """Raise :class:`ConfigError` unless ``max_batch`` (``ssd serve --max-batch``) is a positive integer and
    ``max_wait_ms`` (``--max-wait-ms``) a number of milliseconds in ``[0, MAX_WAIT_MS]``: the rule of the command and
    of :class:`ssd.serve.batching.Batcher`."""
    if not is_whole(max_batch) or max_batch < 1:
        raise ConfigError(f"--max-batch must be a positive integer, got {value_text(max_batch)}")
    if not is_real(max_wait_ms, finite=True) or not 0 <= max_wait_ms <= MAX_WAIT_MS:  # NaN too
        raise ConfigError(f"--max-wait-ms must be in [0, {MAX_WAIT_MS}] milliseconds, got {value_text(max_wait_ms)}")


def check_batch_sizes(batch_sizes: Sequence[int]) -> None:
    """Raise :class:`ConfigError` unless ``batch_sizes`` (``ssd benchmark --batch-sizes``) are one or more positive
    integers: the rule of the command and its API."""
    if not batch_sizes or not all(is_whole(b) and b >= 1 for b in batch_sizes):
        raise ConfigError(f"--batch-sizes must be positive integers, such as 1,8, got {value_text(list(batch_sizes))}")


def check_calib_images(count: int | None) -> None:
    """Raise :class:`ConfigError` unless ``count`` (``--calib-images``, the INT8 calibration images) is ``None`` (the
    default number) or a positive integer: the rule of ``ssd export``, ``ssd benchmark`` and their API."""
    if count is not None and (not is_whole(count) or count < 1):
        raise ConfigError(f"--calib-images must be a positive integer, got {value_text(count)}")

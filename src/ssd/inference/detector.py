"""Detection for users: :class:`Detector` (a backend plus the input handling: paths, PIL images, numpy arrays,
tensors; batching and tiling) and :func:`load`, which makes one from anything
:func:`~ssd.inference.backends.open_backend` opens. Each batch runs :func:`ssd.detect.detect_batch`, the one
pipeline.

Thresholds have one vocabulary (:mod:`ssd.settings`, defaults :data:`~ssd.settings.PREDICT`): ``score_threshold``
(keep scores strictly above it; default the model's stored best-F1 confidence when it has one, see
:meth:`Detector.confidence`), ``iou_threshold`` (per-class NMS overlap), ``max_detections`` (per image). Every
output box is pixel ``xyxy`` of the original image; labels are ``0..K-1``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image

from ssd.arrays import detect_arrays, pil_to_array
from ssd.card import ModelCard
from ssd.errors import ConfigError, InputError, MissingDependencyError
from ssd.inference.backends import Backend, open_backend
from ssd.inference.results import Result
from ssd.names import did_you_mean
from ssd.optional import has_torch
from ssd.schemas import PredictConfig
from ssd.settings import PREDICT, TILE_OVERLAP, check_thresholds, check_tile

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["Detector", "load", "to_image"]


def to_image(item, index: int = 0) -> Tensor:
    """One input -> ``[3, H, W]`` tensor: a path (decoded with :func:`ssd.data.images.read_image`), a PIL image, a
    numpy ``[H, W, 3]`` uint8 RGB array or a tensor (checked by :func:`ssd.preprocess.check_image`); a bad input
    raises ``ValueError`` naming it by ``index``. Without PyTorch: a ``uint8 [3, H, W]`` numpy array."""
    if isinstance(item, (str, Path)):
        from ssd.data.images import read_image

        return read_image(item)
    if isinstance(item, Image.Image):
        array = pil_to_array(item)
        return _tensor(array) if has_torch() else array
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8 or item.ndim != 3 or item.shape[2] != 3:
            raise InputError(f"input {index}: numpy image must be HWC uint8 RGB (shape [H, W, 3]), "
                             f"got shape {list(item.shape)} dtype {item.dtype}")
        array = np.ascontiguousarray(item.transpose(2, 0, 1))
        return _tensor(array) if has_torch() else array
    if "torch" in sys.modules and isinstance(item, sys.modules["torch"].Tensor):
        return item
    raise InputError(f"input {index}: unsupported type {type(item).__name__} (give a path, a PIL image, a numpy HWC "
                     f"uint8 array or a [3, H, W] tensor)")


def _tensor(array: np.ndarray) -> Tensor:
    import torch

    return torch.from_numpy(array)


class Detector:
    """A backend ready for images (see :func:`load`): ``Detector(backend)``, or ``Detector(model)`` for an SSD module
    (run as a :class:`~ssd.inference.backends.pytorch.TorchBackend` on its own device)."""

    def __init__(self, backend: Backend | nn.Module):
        self.backend = open_backend(backend)

    @property
    def card(self) -> ModelCard:
        """What the model is (:class:`ssd.card.ModelCard`), the backend's."""
        return self.backend.card

    @property
    def class_names(self) -> list[str]:
        return list(self.card.class_names)

    @property
    def category_ids(self) -> list[int] | None:
        """The dataset's category id of each label (from the checkpoint), or ``None`` (the labels themselves)."""
        ids = self.card.category_ids
        return None if ids is None else list(ids)

    def confidence(self, score_threshold: float | None = None, given: str = "score_threshold") -> tuple[float, str]:
        """The score threshold a prediction uses and where it comes from: :meth:`ssd.card.ModelCard.confidence`."""
        return self.card.confidence(score_threshold, given)

    def class_indices(self, classes: Sequence[int | str] | None) -> list[int] | None:
        """The labels of ``classes``, given as class names or labels ``0..K-1`` (ints or digit strings; a name that
        is digits means the name); ``None`` stays ``None`` (every class). An unknown name or a label out of range
        raises :class:`~ssd.errors.ConfigError` with the closest names."""
        if classes is None:
            return None
        names, labels = self.class_names, []
        for item in classes:
            if str(item) in names:
                labels.append(names.index(str(item)))
            elif str(item).isascii() and str(item).isdigit():  # "²" is a digit int() refuses
                if int(item) >= len(names):
                    raise ConfigError(f"classes: label {item} is out of range for the model's {len(names)} classes "
                                      f"(labels 0..{len(names) - 1}: {', '.join(names)})")
                labels.append(int(item))
            else:
                raise ConfigError(f"classes: the model has no class {item!r}{did_you_mean(str(item), names)}")
        return labels

    def preprocess(self, images: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """``[3, H, W]`` tensors -> ``(batch [B, 3, S, S], sizes [B, 2] (h, w))`` for this backend."""
        from ssd.preprocess import preprocess

        card = self.card
        return preprocess(images, card.image_size, card.mean, card.std, device=self.backend.device)

    def detect(self, images: Sequence[Tensor], paths: Sequence[str | None] | None = None, *,
               score_threshold: float | None = None, iou_threshold: float = PREDICT.iou_threshold,
               max_detections: int = PREDICT.max_detections, tile: int | str | Sequence[int] | None = None,
               tile_overlap: float = TILE_OVERLAP, batch_size: int | None = None,
               classes: Sequence[int] | None = None, tta: bool = False) -> list[Result]:
        """One batch of ``[3, H, W]`` tensors (uint8 or float in ``0..1``) -> one :class:`Result` per image
        (``score_threshold`` ``None``: :meth:`confidence`); ``classes``: keep only these labels
        (:meth:`class_indices` reads names), before the ``max_detections`` cut (a kept class is never crowded out).

        ``tile``: ``None``, ``"auto"``, ``N`` or ``(h, w)`` pixels: also detect on overlapping tiles of each image
        and merge (:func:`ssd.inference.tiling.detect_tiled`), ``batch_size`` crops at a time (default: as many as
        ``images``). ``tta``: test-time augmentation of every image or crop (:mod:`ssd.inference.tta`)."""
        thresholds = dict(score_threshold=self.confidence(score_threshold)[0], iou_threshold=iou_threshold,
                          max_detections=max_detections)
        if not has_torch():
            if tta:
                raise MissingDependencyError("test-time augmentation (tta) needs PyTorch, not installed on this "
                                             "runtime: pip install ssd-detect (with PyTorch)")
            return self._detect_arrays(images, paths, tile, classes, thresholds)
        from ssd.detect import detect_batch
        from ssd.inference.tiling import detect_tiled
        from ssd.inference.tta import detect_tta

        def network(batch: Tensor, sizes: Tensor) -> list[dict[str, Tensor]]:
            # classes kept before the top-k cut (ssd.postprocess)
            return detect_batch(self.backend, batch, sizes, classes=classes, **thresholds)

        def run(crops: list[Tensor]) -> list[dict[str, Tensor]]:
            batch, sizes = self.preprocess(crops)
            return detect_tta(network, batch, sizes, **thresholds) if tta else network(batch, sizes)

        if tile is None:
            detections = run(list(images))
        else:  # each crop's detections are of the wanted classes already
            detections = detect_tiled(run, images, tile=tile, input_size=self.card.image_size, overlap=tile_overlap,
                                      iou_threshold=iou_threshold, max_detections=max_detections,
                                      batch_size=batch_size or len(images))
        paths = paths if paths is not None else [None] * len(images)
        return [
            Result(d["boxes"].float().cpu(), d["scores"].float().cpu(), d["labels"].cpu(),
                   [self.class_names[i] for i in d["labels"].tolist()], image.shape[-1], image.shape[-2], path)
            for d, image, path in zip(detections, images, paths)
        ]

    def _detect_arrays(self, images: Sequence[np.ndarray], paths: Sequence[str | None] | None, tile, classes,
                       options: dict) -> list[Result]:
        """:meth:`detect` without PyTorch (:func:`ssd.arrays.detect_arrays`): numpy in, numpy :class:`Result`."""
        if tile is not None:
            raise MissingDependencyError("tiled prediction (tile) needs PyTorch, not installed on this runtime: "
                                         "pip install ssd-detect (with PyTorch)")
        paths = paths if paths is not None else [None] * len(images)
        results = []
        for d, image, path in zip(detect_arrays(self.backend, images, classes=classes, **options), images, paths):
            results.append(Result(d["boxes"].astype(np.float32), d["scores"].astype(np.float32), d["labels"],
                                  [self.class_names[i] for i in d["labels"].tolist()], image.shape[-1],
                                  image.shape[-2], path))
        return results

    def predict(self, source, *, score_threshold: float | None = None,
                iou_threshold: float = PREDICT.iou_threshold, max_detections: int = PREDICT.max_detections,
                batch_size: int = PredictConfig.batch_size, tile: int | str | Sequence[int] | None = None,
                tile_overlap: float = TILE_OVERLAP, tta: bool = False) -> list[Result]:
        """Detect objects in ``source``: one or a list of paths, PIL images, numpy ``[H, W, 3]`` uint8 RGB arrays,
        tensors ``[3, H, W]`` (uint8, or float in ``0..1``). Returns one :class:`Result` per image, in order;
        inputs are decoded ``batch_size`` at a time (and their crops run ``batch_size`` at a time when tiling).

        ``tile``: ``"auto"`` (tile images more than twice the network input along a side), a tile side ``N`` or
        ``(h, w)`` in pixels, or ``None`` (no tiling); ``tile_overlap``: the share of a tile its neighbours also
        cover. See :mod:`ssd.inference.tiling`. ``tta``: also detect on the mirrored and a shrunk copy of each image
        and fuse the boxes (:mod:`ssd.inference.tta`; about three times the network time).
        ``score_threshold``: default the model's best-F1 confidence when it
        stores one, else ``settings.PREDICT``'s (:meth:`confidence`); a given value wins."""
        score_threshold = self.confidence(score_threshold)[0]
        check_thresholds(score_threshold, iou_threshold, max_detections, batch_size)
        check_tile(tile, tile_overlap)
        items = list(source) if isinstance(source, (list, tuple)) else [source]
        results = []
        for start in range(0, len(items), batch_size):
            chunk = items[start:start + batch_size]
            paths = [str(item) if isinstance(item, (str, Path)) else None for item in chunk]
            images = [to_image(item, start + offset) for offset, item in enumerate(chunk)]
            results += self.detect(images, paths, score_threshold=score_threshold, iou_threshold=iou_threshold,
                                   max_detections=max_detections, tile=tile, tile_overlap=tile_overlap,
                                   batch_size=batch_size, tta=tta)
        return results

    def track(self, source, *, tracker: str | Path | dict | None = None, stream: bool = False, batch_size: int = 1,
              score_threshold: float | None = None, iou_threshold: float = PREDICT.iou_threshold,
              max_detections: int = PREDICT.max_detections) -> list[Result] | Iterator[Result]:
        """Detect and track objects across the frames of ``source``: a video file, a live source (a camera index, an
        ``rtsp://`` / ``http(s)://`` URL or a ``.streams`` file, see :mod:`ssd.inference.streams`: frames arriving
        while the model is busy are dropped) or a list of images in frame order (what :meth:`predict` takes).
        Each frame's :class:`Result` has ``track_ids`` (ByteTrack, :mod:`ssd.inference.tracking`; ``-1`` for a
        detection not yet confirmed as a track; one tracker per stream).

        ``tracker``: ByteTrack's settings, a dict or a YAML file (:func:`~ssd.inference.tracking.tracker_settings`).
        ``stream``: return a generator instead of a list (a live source never ends: iterate it and stop when
        done). One image has nothing to track across: a single path that is not a video raises ``ValueError``."""
        from ssd.data.images import is_image
        from ssd.inference.results import Frame
        from ssd.inference.streams import is_live
        from ssd.inference.tracking import track_frames, tracker_settings
        from ssd.inference.videos import source_frames

        options = dict(score_threshold=self.confidence(score_threshold)[0], iou_threshold=iou_threshold,
                       max_detections=max_detections)
        check_thresholds(*options.values(), batch_size)
        settings = tracker_settings(tracker)  # a dict is checked as a file's settings are
        if isinstance(source, (list, tuple)):
            batches = ([Frame(to_image(item, start + i), 0, start + i, 0.0,
                              str(item) if isinstance(item, (str, Path)) else None)
                        for i, item in enumerate(source[start:start + batch_size])]
                       for start in range(0, len(source), batch_size))
        elif is_live(source) or not is_image(Path(source)):
            batches = source_frames(source, batch_size)
        else:
            raise ConfigError(f"track: {source} is one image, and tracking follows objects across frames: give a "
                              f"video file, a live source or a list of images in frame order (predict detects in "
                              f"single images)")
        results = (result for result, _, _ in track_frames(self, batches, settings, **options))
        return results if stream else list(results)


def load(path: str | Path, device: str | torch.device = "cpu", half: bool = False) -> Detector:
    """A :class:`Detector` for a checkpoint (``.pt``), a run directory (its best checkpoint) or an exported model
    (``.onnx``, any runtime of :data:`ssd.inference.backends.BACKENDS`): see
    :func:`ssd.inference.backends.open_backend`.

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available). ``half``: float16 inference
    (PyTorch on CUDA only). A checkpoint's ``category_ids`` (the dataset's ids, when training stored them) become
    :attr:`Detector.category_ids`. Raises ``CheckpointError`` for a missing file or one not written by this library.
    """
    return Detector(open_backend(path, device, half))

"""The inference pipeline on numpy arrays, for the runtime install without PyTorch (``pip install
'ssd-detect[runtime]'``): images -> the network's input batch -> the graph's own detections -> pixels.

It runs exported graphs that hold decoding and NMS (``ssd export --nms``): what remains outside the graph is a
resize and a normalization (Pillow and numpy) and a scale to pixels, so no post-processing is copied here. A graph
that returns raw head outputs needs :func:`ssd.postprocess.postprocess_detections`, which is PyTorch: it is refused
with what to do. Images are ``uint8 [3, H, W]`` RGB arrays, the layout of the tensors of the PyTorch path, so that
sizes read the same (``image.shape[-2:]`` is ``(h, w)``).

The resize is Pillow's bilinear filter widened when shrinking (the antialiasing that ``torchvision``'s
``antialias=True`` reproduces); pixels may differ by one level from the PyTorch path's, so boxes and scores agree
to about 1e-2, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ssd.errors import InputError, MissingDependencyError
from ssd.settings import check_thresholds
from ssd.sizes import as_hw

__all__ = ["pil_to_array", "check_array", "preprocess_arrays", "detect_arrays"]


def pil_to_array(image: Image.Image) -> np.ndarray:
    """A Pillow image -> ``uint8 [3, H, W]`` RGB."""
    return np.ascontiguousarray(np.asarray(image.convert("RGB")).transpose(2, 0, 1))


def check_array(image: Any, index: int) -> None:
    """Raise ``ValueError`` naming image ``index`` unless it is a ``uint8 [3, H, W]`` numpy array."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise InputError(f"image {index} must be a uint8 [3, H, W] numpy array (RGB, channels first) without PyTorch, "
                         f"got {type(image).__name__} {list(getattr(image, 'shape', []))} "
                         f"{getattr(image, 'dtype', '')}".rstrip())


def preprocess_arrays(images: Sequence[np.ndarray], image_size: int | tuple[int, int], mean: Sequence[float],
                      std: Sequence[float], uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Resize (plain, no letterbox) and normalize, as :func:`ssd.preprocess.preprocess`.

    Args:
        images: ``uint8 [3, H, W]`` arrays (sizes may differ).
        image_size: the network input, ``S`` or ``(H, W)``.
        mean: per channel, of images scaled to ``[0, 1]``.
        std: the same.
        uint8: resize only, for a graph that normalizes itself (``--uint8-input``).

    Returns:
        ``(batch [B, 3, H, W] float32 normalized, or [B, H, W, 3] uint8 with uint8, sizes [B, 2] int64 (h, w) of
        the originals)``.
    """
    if len(images) == 0:
        raise InputError("images must be a non-empty list of uint8 [3, H, W] arrays")
    for index, image in enumerate(images):
        check_array(image, index)
    height, width = as_hw(image_size)
    resized = np.stack([np.asarray(Image.fromarray(image.transpose(1, 2, 0)).resize((width, height),
                                                                                  Image.Resampling.BILINEAR))
                        for image in images])  # [B, H, W, 3] uint8
    sizes = np.array([image.shape[-2:] for image in images], dtype=np.int64)
    if uint8:
        return resized, sizes
    scale = np.float32(1 / 255)
    batch = (resized.astype(np.float32) * scale - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2)), sizes


def detect_arrays(network: Any, images: Sequence[np.ndarray], *, score_threshold: float, iou_threshold: float,
                  max_detections: int) -> list[dict[str, np.ndarray]]:
    """Detections of ``images`` (``uint8 [3, H, W]`` arrays) by a backend whose graph holds NMS (``card.nms`` set
    and ``nms_arrays``, as :class:`ssd.inference.backends.onnx.OnnxBackend`), in pixels of the originals: per image
    ``boxes [N, 4]`` float32 xyxy, ``scores [N]``, ``labels [N]`` int64, by decreasing score.

    Raises:
        MissingDependencyError: the graph returns head outputs (post-processing them needs PyTorch).
    """
    check_thresholds(score_threshold, iou_threshold, max_detections)
    card = network.card
    if card.nms is None or not hasattr(network, "nms_arrays"):
        raise MissingDependencyError(
            f"{getattr(network, 'source', None) or 'this model'} returns head outputs, whose post-processing needs "
            "PyTorch (not installed): export it with the pipeline in the graph (`ssd export --nms`), or pip install "
            "ssd-detect (with PyTorch)")
    batch, sizes = preprocess_arrays(images, card.image_size, card.mean, card.std,
                                     getattr(network, "uint8_input", False))
    detections = network.nms_arrays(batch, score_threshold=score_threshold, iou_threshold=iou_threshold,
                                    max_detections=max_detections)
    for detection, (height, width) in zip(detections, sizes):
        detection["boxes"] = detection["boxes"] * np.array([width, height, width, height], dtype=np.float32)
    return detections

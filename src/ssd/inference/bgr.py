"""OpenCV's images and ssd's, one conversion each way: OpenCV reads, writes and shows ``[H, W, 3]`` uint8 BGR arrays,
ssd works on ``[3, H, W]`` uint8 RGB tensors (:func:`ssd.data.images.read_image`), or numpy arrays of that layout
without PyTorch (the runtime install, :mod:`ssd.arrays`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ssd.optional import has_torch, require

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["from_bgr", "to_bgr"]


def from_bgr(array: np.ndarray) -> Tensor:
    """An OpenCV ``[H, W, 3]`` uint8 BGR array (a video frame) as a ``[3, H, W]`` uint8 RGB tensor."""
    cv2 = require("cv2", "video", "reading video")
    rgb = cv2.cvtColor(array, cv2.COLOR_BGR2RGB).transpose(2, 0, 1)
    if not has_torch():
        return np.ascontiguousarray(rgb)
    import torch

    return torch.from_numpy(rgb)


def to_bgr(image: Tensor) -> np.ndarray:
    """A ``[3, H, W]`` uint8 RGB tensor (or array) as the ``[H, W, 3]`` uint8 BGR array OpenCV writes and shows."""
    cv2 = require("cv2", "video", "writing or showing video")
    return cv2.cvtColor(np.ascontiguousarray(np.asarray(image).transpose(1, 2, 0)), cv2.COLOR_RGB2BGR)

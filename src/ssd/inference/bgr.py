"""OpenCV's images and ssd's, one conversion each way: OpenCV reads, writes and shows ``[H, W, 3]`` uint8 BGR arrays,
ssd works on ``[3, H, W]`` uint8 RGB tensors (:func:`ssd.data.images.read_image`)."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ssd.optional import require

__all__ = ["from_bgr", "to_bgr"]


def from_bgr(array: np.ndarray) -> Tensor:
    """An OpenCV ``[H, W, 3]`` uint8 BGR array (a video frame) as a ``[3, H, W]`` uint8 RGB tensor."""
    cv2 = require("cv2", "video", "reading video")
    return torch.from_numpy(cv2.cvtColor(array, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)


def to_bgr(image: Tensor) -> np.ndarray:
    """A ``[3, H, W]`` uint8 RGB tensor as the ``[H, W, 3]`` uint8 BGR array OpenCV writes and shows."""
    cv2 = require("cv2", "video", "writing or showing video")
    return cv2.cvtColor(np.ascontiguousarray(image.permute(1, 2, 0).numpy()), cv2.COLOR_RGB2BGR)

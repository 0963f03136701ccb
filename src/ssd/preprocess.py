"""The two ends of inference around a network: :func:`preprocess` (images -> the square, normalized input batch and
the original sizes) and :func:`to_pixels` (its inverse for boxes: normalized detections -> pixel ``xyxy`` of each
original image).

Shared by :meth:`ssd.models.SSD.predict` and every backend of :mod:`ssd.inference.detector` (PyTorch or ONNX Runtime),
so that all of them see the same pixels and give boxes in the same coordinates. The resize is plain (no letterbox):
a box normalized to the network input maps to the original image by scaling with its width and height.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.transforms.v2 import functional as TF

from ssd.boxes import pixel_scale
from ssd.errors import InputError
from ssd.sizes import as_hw

__all__ = ["preprocess", "check_image", "to_pixels"]


def preprocess(images: Sequence[Tensor] | Tensor, image_size: int | tuple[int, int], mean: Sequence[float],
               std: Sequence[float],
               device: torch.device | str | None = None) -> tuple[Tensor, Tensor]:
    """Resize (plain, no letterbox) to ``image_size`` and normalize images for a network.

    Args:
        images: a list of ``[3, H, W]`` tensors (sizes may differ), uint8 ``0..255`` or floating point in
            ``[0, 1]``, or one ``[B, 3, H, W]`` tensor.
        image_size: the network input, ``S`` (square) or ``(H, W)``.
        mean: per-channel mean of images scaled to ``[0, 1]``.
        std: per-channel standard deviation of images scaled to ``[0, 1]``.
        device: where the batch is made (default: where the images are).

    Returns:
        ``(batch [B, 3, S, S] float32 normalized, sizes [B, 2] int64 (h, w) of the originals, on the CPU)``.

    Raises:
        ValueError: naming the first bad image (see :func:`check_image`).
    """
    if isinstance(images, Tensor) and images.dim() == 4:
        images = list(images)
    if isinstance(images, Tensor) or len(images) == 0:
        raise InputError("images must be a non-empty list of [3, H, W] tensors or a [B, 3, H, W] tensor")
    for index, image in enumerate(images):
        check_image(image, index)
    size = list(as_hw(image_size))
    sizes = torch.tensor([list(image.shape[-2:]) for image in images], dtype=torch.int64)
    batch = torch.cat([_resized(image.to(device), size) for image in images])
    return TF.normalize(batch, list(mean), list(std)).contiguous(), sizes


def _resized(image: Tensor, size: list[int]) -> Tensor:
    """``image [3, H, W]`` resized (antialiased) to ``[1, 3, *size]`` float32 in ``[0, 1]``."""
    image = image.unsqueeze(0)
    if image.dtype == torch.uint8 and image.device.type == "cpu":
        # PyTorch's vectorized antialiased uint8 resize takes channels-last input: the same pixels, 2-4x faster
        # than the contiguous image (or a stacked batch) on the development CPU (benchmarks/README.md)
        image = image.contiguous(memory_format=torch.channels_last)
    return TF.to_dtype(TF.resize(image, size, antialias=True), torch.float32, scale=True)


def check_image(image: Tensor, index: int) -> None:
    """Raise ``ValueError`` naming image ``index`` unless it is a ``[3, H, W]`` tensor, uint8 or float in ``[0, 1]``."""
    if not isinstance(image, Tensor):
        raise InputError(f"image {index} must be a tensor, got {type(image).__name__}")
    if image.dim() != 3 or image.shape[0] != 3:
        raise InputError(f"image {index} must have shape [3, H, W] (RGB, channels first), got {list(image.shape)}")
    if image.dtype != torch.uint8 and not image.is_floating_point():
        raise InputError(f"image {index} must be uint8 (0..255) or floating point (0..1), got {image.dtype}")
    if image.is_floating_point() and image.numel():
        low, high = (value.item() for value in torch.aminmax(image))
        if not (low >= 0 and high <= 1):  # also refuses NaN
            raise InputError(f"image {index} is floating point with values in [{low:.4g}, {high:.4g}]; "
                             "floating point images must be scaled to [0, 1] (or pass uint8 0..255)")


def to_pixels(detections: list[dict[str, Tensor]], sizes: Tensor) -> list[dict[str, Tensor]]:
    """Scale each image's ``boxes [N, 4]`` (xyxy normalized to the network input) to pixels of its original image.

    ``sizes [B, 2]`` holds ``(h, w)`` (as returned by :func:`preprocess`); ``detections`` (one dict per image, as
    :func:`ssd.postprocess.postprocess_detections` returns) are updated in place and returned.
    """
    for detection, factor in zip(detections, pixel_scale(sizes)):
        detection["boxes"] = detection["boxes"] * factor.to(detection["boxes"].device)
    return detections

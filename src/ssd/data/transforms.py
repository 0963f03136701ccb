"""SSD train / eval transforms with ``torchvision.transforms.v2`` (image + ``tv_tensors.BoundingBoxes`` together).

A transform is called as ``transform(image, target)`` with ``image`` a ``tv_tensors.Image`` uint8 ``[3, H, W]`` and
``target`` a dict holding ``boxes`` (``tv_tensors.BoundingBoxes`` pixel xyxy), ``labels`` int64 ``[N]`` and
``difficult`` bool ``[N]``; it returns both with the image float ``[3, H, W]`` normalized (``(H, W)`` the network
input size) and the boxes in pixels of that image. Boxes that become degenerate (or leave the crop) are dropped
with their labels and flags.

Augmentation levels (``augment``):
- ``"ssd"``: photometric distortion, zoom-out up to 4x (canvas filled with the mean), IoU-constrained random crop,
  horizontal flip (the original SSD recipe);
- ``"light"``: horizontal flip and a mild scale/translation jitter;
- ``"none"``: nothing (the evaluation transform).

With native-resolution crops (``crop``, :mod:`ssd.data.crops`) the crop comes first, then the level without its
zoom-out and IoU crop (see :func:`build_transform`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torchvision import tv_tensors
from torchvision.ops import box_iou
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F
from torchvision.transforms.v2 import get_bounding_boxes, query_size

from ssd.data.crops import CropScale, NativeCrop
from ssd.errors import ConfigError
from ssd.sizes import as_hw

__all__ = ["AUGMENT_LEVELS", "build_transform"]

AUGMENT_LEVELS = ("ssd", "light", "none")

# Boxes narrower or shorter than this many pixels after a step are dropped (SanitizeBoundingBoxes' min_size).
MIN_BOX_SIZE = 1.0


def boxes_labels_difficult(inputs):
    """``labels_getter`` for ``SanitizeBoundingBoxes``: labels and difficult flags follow the kept boxes."""
    target = inputs[1] if isinstance(inputs, (tuple, list)) and len(inputs) > 1 else inputs[0][1]
    return target["labels"], target["difficult"]


class IoUCropWithBoxes(v2.RandomIoUCrop):
    """``RandomIoUCrop`` with its rules, its trials drawn at once, and images without boxes left unchanged.

    Same acceptance rule as torchvision's: pick a minimum IoU option (or "no crop"), then among ``trials`` random
    crops (side scale in ``[min_scale, max_scale]``, aspect in ``[min_aspect, max_aspect]``) take the first one that
    contains at least one box centre and reaches the minimum IoU with one of those boxes. The trials are evaluated
    together rather than in a per-trial Python loop.
    """

    def forward(self, *inputs):
        sample = inputs if len(inputs) > 1 else inputs[0]
        if sample[1]["boxes"].shape[0] == 0:
            return sample
        return super().forward(*inputs)

    def make_params(self, flat_inputs: list) -> dict:
        orig_h, orig_w = query_size(flat_inputs)
        boxes = get_bounding_boxes(flat_inputs)
        xyxy = F.convert_bounding_box_format(boxes.as_subclass(torch.Tensor), boxes.format,
                                             tv_tensors.BoundingBoxFormat.XYXY).float()
        cx, cy = (xyxy[:, 0] + xyxy[:, 2]) / 2, (xyxy[:, 1] + xyxy[:, 3]) / 2
        while True:
            min_iou = self.options[int(torch.randint(len(self.options), (1,)))]
            if min_iou >= 1.0:  # the "leave as is" option
                return {}
            r = self.min_scale + (self.max_scale - self.min_scale) * torch.rand(self.trials, 2)
            new_w, new_h = (orig_w * r[:, 0]).floor(), (orig_h * r[:, 1]).floor()
            pos = torch.rand(self.trials, 2)
            left, top = ((orig_w - new_w) * pos[:, 0]).floor(), ((orig_h - new_h) * pos[:, 1]).floor()
            right, bottom = left + new_w, top + new_h
            aspect = new_w / new_h.clamp_min(1)
            ok = (aspect >= self.min_aspect_ratio) & (aspect <= self.max_aspect_ratio) & (new_w > 0) & (new_h > 0)
            inside = ((left[:, None] < cx) & (cx < right[:, None]) & (top[:, None] < cy) & (cy < bottom[:, None]))
            ious = box_iou(torch.stack([left, top, right, bottom], dim=1), xyxy)  # [trials, N]
            ok &= ((ious >= min_iou) & inside).any(dim=1)
            if ok.any():
                t = int(ok.nonzero()[0])
                return dict(top=int(top[t]), left=int(left[t]), height=int(new_h[t]), width=int(new_w[t]),
                            is_within_crop_area=inside[t])


def build_transform(image_size: int | tuple[int, int], mean: Sequence[float], std: Sequence[float],
                    train: bool = False, augment: str = "ssd", crop: CropScale | None = None) -> v2.Compose:
    """The SSD pipeline to an ``image_size`` input (an int: square; or ``(height, width)``); ``mean``/``std`` are per
    channel for images in ``[0, 1]``.

    ``train=False`` (or ``augment="none"`` without ``crop``) is resize + normalize. With ``crop``
    (:mod:`ssd.data.crops`, training only) the native-resolution crop comes first and is resized to the input at
    once, so the level's photometric and flip steps work on input-sized images; it replaces the level's zoom-out
    (which shrinks the small objects that crops are for) and IoU crop (a second crop, at scales tiled prediction
    never shows).
    """
    if augment not in AUGMENT_LEVELS:
        raise ConfigError(f"augment must be one of {AUGMENT_LEVELS}, got {augment!r}")
    hw = as_hw(image_size)
    fill = {tv_tensors.Image: [round(255 * m) for m in mean], "others": 0}
    crops = train and crop is not None
    steps: list = [NativeCrop(crop, hw), v2.Resize(hw, antialias=True)] if crops else []
    if train and augment == "ssd":
        steps += [v2.RandomPhotometricDistort(p=0.5)]
        if not crops:
            steps += [v2.RandomZoomOut(fill=fill, side_range=(1.0, 4.0), p=0.5), IoUCropWithBoxes()]
        steps += [v2.RandomHorizontalFlip()]
    elif train and augment == "light":
        steps += [v2.RandomHorizontalFlip(), v2.RandomAffine(degrees=0, translate=(0.05, 0.05), scale=(0.85, 1.15),
                                                             fill=fill)]
    if not crops:
        steps += [v2.Resize(hw, antialias=True)]
    steps += [v2.ClampBoundingBoxes(),
              v2.SanitizeBoundingBoxes(min_size=MIN_BOX_SIZE, labels_getter=boxes_labels_difficult),
              v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True),
              v2.Normalize(mean=list(mean), std=list(std))]
    return v2.Compose(steps)

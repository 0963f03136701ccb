"""Native-resolution training crops (``ssd train --crop-scale``): the training-side twin of tiled prediction.

A large photo resized whole to a small network input shrinks its small objects to a few pixels. With crops, each
training image is decoded at (up to) its native resolution, a random window of it is cut out and only that window
is resized to the input, so the network sees objects at the scale tiled prediction (``--tile``) shows them.

The crop (:class:`NativeCrop`, a ``torchvision.transforms.v2`` transform):

- keeps the image's aspect ratio; its *scale* is its side as a fraction of the image's side, drawn uniformly in the
  image's range (:meth:`CropScale.bounds`) and placed uniformly in the image;
- the range is ``[MIN, MAX]`` of ``--crop-scale MIN[,MAX]`` (fractions in ``(0, 1]``, ``MAX`` 1 by default: the
  whole image), or with ``--crop-scale native`` from the whole image down to the network input's own size in
  original pixels. A crop never goes below the input's size in original pixels (upsampling adds no detail): for an
  image too small for ``MIN`` the range starts at that size, and the trainer reports how many images that is;
- box rule: a box cut by the crop is kept, clipped to the crop, when its part inside the crop covers at least
  :data:`MIN_VISIBLE` of the box's area, or of the crop's (an object larger than the crop that fills it stays an
  object, not background), else it is dropped with its label; the boxes dropped so (part inside, too little) are
  counted in the target (``crop_dropped``, summed per batch by :func:`ssd.data.loader.collate` and reported by the
  trainer once per epoch). Boxes wholly outside the crop are not in the crop's picture at all and are not counted.

Decoding and the image cache (:func:`decode_sizes`): the smallest crop of an image must still hold the input's
pixels, so an image is decoded at ``input / min scale`` (never above its native size); ``--cache-images`` keeps
those images, and when they would take more than :data:`ssd.limits.MAX_CROP_CACHE_BYTES` every image is
downscaled by one common factor, which :func:`decode_sizes` returns for the trainer to report.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from ssd.errors import ConfigError
from ssd.limits import MAX_CROP_CACHE_BYTES, is_real, value_text
from ssd.sizes import as_hw, size_text

__all__ = ["MIN_VISIBLE", "NATIVE", "CachePlan", "CropScale", "NativeCrop", "crop_rule", "decode_sizes",
           "describe_plan", "fit_in_bytes", "parse_crop_scale"]

MIN_VISIBLE = 0.5
"""A box cut by a crop is kept (clipped) when at least this share of its area lies inside the crop, else dropped."""

NATIVE = "native"
"""``--crop-scale native``: crops from the whole image down to the network input's size in original pixels."""

_NUMBER = r"\s*(\d+(?:\.\d*)?|\.\d+)\s*"


@dataclass(frozen=True)
class CropScale:
    """The range of crop scales (side of the crop / side of the image): ``min_scale`` ``None`` is ``native``."""

    min_scale: float | None
    max_scale: float = 1.0

    @property
    def text(self) -> str:
        """The option's canonical text: ``native``, ``0.25`` or ``0.25,0.8``."""
        if self.min_scale is None:
            return NATIVE
        return f"{self.min_scale:g}" if self.max_scale == 1.0 else f"{self.min_scale:g},{self.max_scale:g}"

    def bounds(self, orig_hw: Tensor, input_hw: tuple[int, int]) -> tuple[Tensor, Tensor]:
        """``(lo [N], hi [N])`` scale range of images of original sizes ``orig_hw [N, 2]`` (h, w) for an input of
        ``input_hw``: ``[MIN, MAX]`` raised to ``native`` (the input's size in original pixels, at most 1) where
        that is larger."""
        hw = orig_hw.to(torch.float64).reshape(-1, 2)
        native = (torch.tensor(input_hw, dtype=torch.float64) / hw).amax(dim=1).clamp(max=1.0)
        lo = native if self.min_scale is None else native.clamp(min=self.min_scale)
        return lo, lo.clamp(min=self.max_scale)


def parse_crop_scale(value: object, option: str = "--crop-scale") -> CropScale | None:
    """``None``, ``native``, ``MIN`` or ``MIN,MAX`` (text, a number or a pair) as a :class:`CropScale`;
    :class:`ConfigError` naming ``option`` unless ``0 < MIN <= MAX <= 1``."""
    if value is None or isinstance(value, CropScale):
        return value
    if isinstance(value, str) and value.strip().lower() == NATIVE:
        return CropScale(None)
    if is_real(value):
        parts = [value]
    elif isinstance(value, (list, tuple)) and all(is_real(v) for v in value):
        parts = list(value)
    elif isinstance(value, str) and re.fullmatch(f"{_NUMBER}(?:,{_NUMBER})?", value):
        parts = [float(v) for v in value.split(",")]
    else:
        raise ConfigError(f"crop_scale={value_text(value)} is invalid: give native, MIN or MIN,MAX (fractions of "
                          f"the image side, e.g. 0.25 or 0.25,1) ({option})")
    if len(parts) not in (1, 2) or not all(is_real(p, finite=True) and 0 < p <= 1 for p in parts):
        raise ConfigError(f"crop_scale={value_text(value)} is invalid: crop scales are fractions of the image side "
                          f"in (0, 1] (1 is the whole image) ({option})")
    if len(parts) == 2 and parts[0] > parts[1]:
        raise ConfigError(f"crop_scale={value_text(value)} is invalid: MIN {parts[0]:g} is larger than MAX "
                          f"{parts[1]:g} ({option} MIN,MAX)")
    return CropScale(float(parts[0]), float(parts[1]) if len(parts) == 2 else 1.0)


def crop_rule(xyxy: Tensor, window: Tensor, min_visible: float = MIN_VISIBLE) -> tuple[Tensor, Tensor]:
    """The box rule for boxes ``xyxy [N, 4]`` and a crop ``window [4]`` (x1, y1, x2, y2), same pixels: ``(keep [N],
    cut [N])`` bool, ``keep`` where the part of a box (of positive area) inside the window is at least
    ``min_visible`` of the smaller of the box and the window, ``cut`` where part of it is inside but too little (the
    boxes the rule drops)."""
    xyxy, window = xyxy.double(), window.double()
    inter = (torch.minimum(xyxy[:, 2:], window[2:]) - torch.maximum(xyxy[:, :2], window[:2])).clamp(min=0)
    inside, area = inter.prod(dim=1), (xyxy[:, 2:] - xyxy[:, :2]).clamp(min=0).prod(dim=1)
    keep = (inside >= min_visible * area.clamp(max=(window[2:] - window[:2]).prod())) & (area > 0)
    return keep, ~keep & (inside > 0)


class NativeCrop(v2.Transform):
    """Cut a random window out of a (native-resolution) image; the box rule of the module docstring.

    Called as ``crop(image, target)`` with ``target["orig_size"]`` the image's original ``(h, w)`` (the scale range
    depends on it for ``native``; the decoded image may be smaller, the window is a fraction of it all the same).
    Returns the cropped image and a new target: ``boxes`` clipped to the crop, ``labels`` / ``difficult`` of the
    kept boxes, ``crop_dropped`` (int) the number of boxes cut by the crop and dropped by the rule.
    """

    def __init__(self, scale: CropScale, input_size: int | tuple[int, int], min_visible: float = MIN_VISIBLE):
        super().__init__()
        self.scale, self.input_hw, self.min_visible = scale, as_hw(input_size), min_visible

    def forward(self, *inputs):
        image, target = inputs if len(inputs) > 1 else inputs[0]
        params = self.make_params([image, target["boxes"], target["orig_size"]])
        keep = params["keep"]
        boxes = self.transform(target["boxes"], params)
        cropped = {**target, "boxes": tv_tensors.wrap(boxes[keep], like=boxes), "labels": target["labels"][keep],
                   "difficult": target["difficult"][keep], "crop_dropped": int(params["cut"].sum())}
        return self.transform(image, params), cropped

    def make_params(self, flat_inputs: list) -> dict:
        image, boxes, orig_size = flat_inputs
        h, w = image.shape[-2:]
        lo, hi = self.scale.bounds(torch.as_tensor(orig_size), self.input_hw)
        scale = float(lo + (hi - lo) * torch.rand((), dtype=torch.float64))
        height, width = max(1, min(h, round(h * scale))), max(1, min(w, round(w * scale)))
        top, left = (torch.rand(2, dtype=torch.float64) * torch.tensor([h - height + 1, w - width + 1])).long()
        top, left = min(int(top), h - height), min(int(left), w - width)
        keep, cut = crop_rule(boxes.as_subclass(Tensor), torch.tensor([left, top, left + width, top + height]),
                              self.min_visible)
        return dict(top=top, left=left, height=height, width=width, keep=keep, cut=cut)

    def transform(self, inpt, params: dict):
        return F.crop(inpt, top=params["top"], left=params["left"], height=params["height"], width=params["width"])


@dataclass(frozen=True)
class CachePlan:
    """What :func:`decode_sizes` decided: ``sizes`` ``[N, 2]`` (h, w) to decode each image at, ``nbytes`` of them
    as uint8 RGB, ``downscale`` the common factor applied to stay within the memory bound (1.0: none)."""

    sizes: Tensor
    nbytes: int
    downscale: float
    too_small: int

    @property
    def megabytes(self) -> float:
        return self.nbytes / 2**20


def fit_in_bytes(sizes: Tensor, max_bytes: int | None) -> tuple[Tensor, int, float]:
    """``(sizes, nbytes, downscale)``: image sizes ``[N, 2]`` multiplied by one factor ``downscale`` (1.0: none) so
    that they take at most ``max_bytes`` as uint8 RGB (``nbytes``); None: no bound."""
    downscale = 1.0
    nbytes = int((3 * sizes.double().prod(dim=1)).sum())
    if max_bytes is not None and nbytes > max_bytes:
        downscale = math.sqrt(max_bytes / nbytes)
        sizes = (sizes * downscale).floor().clamp(min=1)
        nbytes = int((3 * sizes.double().prod(dim=1)).sum())
    return sizes, nbytes, downscale


def decode_sizes(orig_hw: Sequence[Sequence[int]] | Tensor, scale: CropScale, input_size: int | tuple[int, int],
                 max_bytes: int | None = MAX_CROP_CACHE_BYTES) -> CachePlan:
    """Decoding sizes for images of original sizes ``orig_hw [N, 2]`` (h, w) trained with crops ``scale``.

    Each image is decoded so that its smallest crop still holds the input's pixels: the native size times
    ``max(input / (lo * orig))`` per axis, at most 1 (``lo`` from :meth:`CropScale.bounds`). When ``max_bytes`` is
    given (the cache) and the images would exceed it, all sizes are multiplied by one factor that fits them
    (``downscale`` < 1; the smallest crops then reach the network below its resolution). ``too_small`` counts the
    images whose crops are held at the input's size because ``MIN`` would be smaller (see the module docstring).
    """
    hw = torch.as_tensor(orig_hw, dtype=torch.float64).reshape(-1, 2)
    input_hw = as_hw(input_size)
    lo, _ = scale.bounds(hw, input_hw)
    factor = (torch.tensor(input_hw, dtype=torch.float64) / (lo[:, None] * hw)).amax(dim=1).clamp(max=1.0)
    sizes = (hw * factor[:, None]).ceil().clamp(max=hw)
    sizes, nbytes, downscale = fit_in_bytes(sizes, max_bytes)
    too_small = 0 if scale.min_scale is None else int((lo > scale.min_scale).sum())
    return CachePlan(sizes.long(), nbytes, downscale, too_small)


def describe_plan(plan: CachePlan, scale: CropScale, input_size: int | tuple[int, int], cached: bool) -> str:
    """The line the trainer logs about crops: decoding sizes, the cache's megabytes, a downscale, small images."""
    largest = f" (largest {size_text(plan.sizes[plan.sizes.prod(dim=1).argmax()].tolist())})" if len(plan.sizes) else ""
    text = f"crops {scale.text} at {size_text(as_hw(input_size))}: {len(plan.sizes)} training images decoded{largest}"
    if cached:
        text += f", cache {plan.megabytes:.1f} MB"
    if plan.downscale < 1:
        text += (f", downscaled by {plan.downscale:.3f} to fit ssd.limits.MAX_CROP_CACHE_BYTES "
                 f"({MAX_CROP_CACHE_BYTES / 2**20:.0f} MB): the smallest crops reach the network below its resolution")
    if plan.too_small:
        text += (f"; {plan.too_small} image(s) too small for crops of {scale.min_scale:g} of their side at this input "
                 "keep crops of at least the input's size")
    return text

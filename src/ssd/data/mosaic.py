"""Mosaic augmentation (YOLOv4, Ultralytics): a training image and three others on one ``2S x 2S`` canvas.

With probability ``p`` an item is combined with three other random items of the dataset: the four decoded uint8
images, each resized to fit the network input ``S`` (aspect kept), are placed top-left, top-right, bottom-left and
bottom-right of a random centre in ``[0.5 S, 1.5 S]`` per axis, on a canvas filled with the dataset mean (as the
zoom-out fills its canvas); their boxes are shifted with them, clamped to the canvas and sanitized by the rule of
every transform (:data:`ssd.data.transforms.MIN_BOX_SIZE`, labels and difficult flags follow the boxes). The
mosaic is the canvas' central ``S x S`` window, as Ultralytics' affine step takes it: it holds part of each of the four
images, at the scale each had alone. Handing the whole canvas to the final resize would halve every object, and the
zoom-out of ``--augment ssd`` shrinks it further. The result goes through the normal training transform.

Where the mode lives: :class:`~ssd.data.loader.SeededSampler` yields ``(index, seed, p)``, ``p`` the probability in
effect for the epoch (0 once ``--close-mosaic`` switched it off). The sampler runs in the main process, whereas
DataLoader workers (persistent between epochs) each hold their own copy of the dataset, so a flag set on the dataset
at an epoch start would never reach them; carried in the key, it does, with any number of workers and after
``--resume`` (the schedule is a function of the epoch). The draws (apply or not, partners, centre) come from the
item's seed, so the same seed gives the same batches whatever the workers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor
from torchvision import tv_tensors
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F

from ssd.data.transforms import MIN_BOX_SIZE, boxes_labels_difficult
from ssd.errors import InputError
from ssd.sizes import as_hw

__all__ = ["Mosaic", "MosaicPlan", "CLOSE_MOSAIC_SHARE", "close_mosaic_epochs", "mosaic_probability"]

# Share of the epochs trained without mosaic at the end when --close-mosaic is not given (Ultralytics: 10 of 100).
CLOSE_MOSAIC_SHARE = 0.1

# The mosaic draws use their own generator; the salt keeps its stream apart from the transform's, seeded by the
# same item seed, so whether an item is a mosaic is not tied to the transform's first random numbers.
_SALT = 0x5DEECE66D

Sample = tuple[Tensor, dict]


def close_mosaic_epochs(close_mosaic: int | None, epochs: int) -> int:
    """Epochs at the end without mosaic: ``close_mosaic``, or by default a tenth of ``epochs`` (rounded)."""
    return round(epochs * CLOSE_MOSAIC_SHARE) if close_mosaic is None else close_mosaic


def mosaic_probability(probability: float, epoch: int, epochs: int, close_mosaic: int | None) -> float:
    """The mosaic probability of 0-based ``epoch`` of ``epochs``: ``probability``, 0 in the last
    :func:`close_mosaic_epochs`. Read at every epoch start, so a changed ``epochs`` moves the switch."""
    return probability if epoch < epochs - close_mosaic_epochs(close_mosaic, epochs) else 0.0


class MosaicPlan(NamedTuple):
    """What :meth:`Mosaic.plan` drew for one item: three other item indices and the centre ``(cy, cx)``."""

    partners: list[int]
    centre: tuple[int, int]


class Mosaic:
    """The mosaic step for an ``image_size`` network input (an int: square; or ``(height, width)``); ``mean`` per
    channel in ``[0, 1]`` fills the canvas."""

    def __init__(self, image_size: int | tuple[int, int], mean: Sequence[float]) -> None:
        self.hw = as_hw(image_size)
        self.fill = torch.tensor([round(255 * m) for m in mean], dtype=torch.uint8).view(3, 1, 1)
        self._sanitize = v2.SanitizeBoundingBoxes(min_size=MIN_BOX_SIZE, labels_getter=boxes_labels_difficult)

    def plan(self, index: int, length: int, seed: int, probability: float) -> MosaicPlan | None:
        """Draw from ``seed`` whether item ``index`` of ``length`` becomes a mosaic (``probability``), and if so
        three other items (with replacement; the item itself only when it is the only one) and the centre."""
        g = torch.Generator().manual_seed((seed ^ _SALT) % 2**63)
        if float(torch.rand((), generator=g)) >= probability:
            return None
        others = torch.randint(max(length - 1, 1), (3,), generator=g)
        if length > 1:  # skip the item itself
            others += others >= index
        h, w = self.hw
        cy = int(torch.randint(h // 2, h + h // 2 + 1, (), generator=g))
        cx = int(torch.randint(w // 2, w + w // 2 + 1, (), generator=g))
        return MosaicPlan(others.tolist(), (cy, cx))

    def __call__(self, samples: Sequence[Sample], centre: tuple[int, int]) -> tuple[tv_tensors.Image, dict]:
        """The mosaic of four samples (see :meth:`canvas`): the central ``(Image uint8 [3, Sh, Sw], target)`` window of
        the canvas, boxes in its pixels (clamped, those left smaller than ``MIN_BOX_SIZE`` dropped)."""
        image, target = self.canvas(samples, centre)
        (sh, sw) = self.hw
        window = F.crop(image, sh // 2, sw // 2, sh, sw), F.crop(target["boxes"], sh // 2, sw // 2, sh, sw)
        return self._sanitize(window[0], {**target, "boxes": F.clamp_bounding_boxes(window[1])})

    def canvas(self, samples: Sequence[Sample], centre: tuple[int, int]) -> tuple[tv_tensors.Image, dict]:
        """Four ``(image uint8 [3, h, w], target)`` (target: ``boxes`` pixel xyxy ``[N, 4]``, ``labels`` ``[N]``,
        ``difficult`` ``[N]``) around ``centre = (cy, cx)`` on the canvas -> ``(Image uint8 [3, 2Sh, 2Sw], target)``
        with the boxes in canvas pixels (clamped, those left smaller than ``MIN_BOX_SIZE`` dropped)."""
        if len(samples) != 4:
            raise InputError(f"a mosaic takes 4 images, got {len(samples)}")
        (sh, sw), (cy, cx) = self.hw, centre
        height, width = 2 * sh, 2 * sw
        canvas = self.fill.expand(3, height, width).clone()
        scales, shifts = torch.empty(4, 2), torch.empty(4, 2)  # per image (x, y)
        for k, (image, _) in enumerate(samples):
            h0, w0 = image.shape[-2:]
            r = min(sh / h0, sw / w0)
            h, w = max(1, round(h0 * r)), max(1, round(w0 * r))
            if (h, w) != (h0, w0):
                image = F.resize(image, [h, w], antialias=True)
            top, left = cy - h if k < 2 else cy, cx - w if k % 2 == 0 else cx  # k: 0 TL, 1 TR, 2 BL, 3 BR
            y0, x0, y1, x1 = max(top, 0), max(left, 0), min(top + h, height), min(left + w, width)
            canvas[:, y0:y1, x0:x1] = image[:, y0 - top:y1 - top, x0 - left:x1 - left]
            scales[k] = torch.tensor([w / w0, h / h0])
            shifts[k] = torch.tensor([left, top], dtype=torch.float32)
        counts = torch.tensor([len(t["boxes"]) for _, t in samples])
        boxes = torch.cat([t["boxes"].as_subclass(Tensor).float().reshape(-1, 4) for _, t in samples])
        boxes = boxes * scales.repeat(1, 2).repeat_interleave(counts, dim=0) \
            + shifts.repeat(1, 2).repeat_interleave(counts, dim=0)
        target = {
            "boxes": F.clamp_bounding_boxes(tv_tensors.BoundingBoxes(boxes, format="XYXY",
                                                                     canvas_size=(height, width))),
            "labels": torch.cat([t["labels"] for _, t in samples]),
            "difficult": torch.cat([t["difficult"] for _, t in samples]),
        }
        return self._sanitize(tv_tensors.Image(canvas), target)

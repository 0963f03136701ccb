"""A dataset's boxes and a model's default boxes: coverage (``ssd check``), a non-square input suggestion and the fit
of ``ssd check --fit-priors`` / ``ssd train --priors auto``.

Boxes are ``xyxy`` normalized to their image, which is what the model sees after its plain resize to its input.
Model-dependent default boxes come from :func:`ssd.models.build.default_priors` (a meta-device probe: no weights
are built).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from ssd.data.records import DatasetSpec, Issue
from ssd.matching import MATCH_IOU
from ssd.models import MODEL_CONFIGS
from ssd.models.build import default_priors
from ssd.priors import PriorConfig
from ssd.priors.coverage import coverage
from ssd.priors.fit import FitResult, fit_priors
from ssd.sizes import as_hw, size_text

if TYPE_CHECKING:
    from ssd.data.crops import CropScale

__all__ = ["coverage_issue", "fit_for_model", "prior_coverage", "spec_boxes", "suggest_image_size",
           "training_boxes"]

TRAIN_SPLIT = "train"


def spec_boxes(spec: DatasetSpec, splits: list[str] | None = None, exclude: set | None = None, *,
               crop_scale: CropScale | None = None, image_size: int | tuple[int, int] | str | None = None) -> Tensor:
    """The boxes of ``splits`` (default: all; an image in two splits counts once) as ``[N, 4]`` xyxy normalized by
    their image's size, as the model's plain resize to its input does; ``exclude``: ``(image path, object
    index)`` pairs to leave out (the invalid objects).

    ``crop_scale`` (with ``image_size``, the input): the boxes as training crops show them, at each image's median
    crop scale ``s`` (the middle of :meth:`~ssd.data.crops.CropScale.bounds`): sizes divided by ``s`` about their
    centres, clipped to ``[0, 1]``.
    """
    exclude = exclude or set()
    seen, rows, sizes = set(), [], []
    for split in spec.splits if splits is None else splits:
        for rec in spec.records(split):
            if rec.path in seen or not rec.width or not rec.height:
                continue
            seen.add(rec.path)
            objects = [[o.box[0] / rec.width, o.box[1] / rec.height, o.box[2] / rec.width, o.box[3] / rec.height]
                       for i, o in enumerate(rec.objects) if (rec.path, i) not in exclude]
            rows += objects
            sizes += [[rec.height, rec.width]] * len(objects)
    boxes = torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)
    if crop_scale is None or not rows:
        return boxes
    lo, hi = crop_scale.bounds(torch.tensor(sizes), as_hw(image_size))
    half = (boxes[:, 2:] - boxes[:, :2]) / (lo + hi).float()[:, None]  # half the size over the median scale
    centre = (boxes[:, :2] + boxes[:, 2:]) / 2
    return torch.cat([centre - half, centre + half], dim=1).clamp(0, 1)


def training_boxes(spec: DatasetSpec) -> Tensor:
    """``[N, 4]`` xyxy normalized boxes of the training split (every split when there is no ``train`` split)."""
    return spec_boxes(spec, [TRAIN_SPLIT] if TRAIN_SPLIT in spec.splits else None)


def prior_coverage(spec: DatasetSpec, priors: PriorConfig, image_size: int | tuple[int, int] | str,
                   iou_threshold: float = MATCH_IOU, exclude: set | None = None,
                   crop_scale: CropScale | None = None) -> dict:
    """:func:`ssd.priors.coverage.coverage` of every box of ``spec`` (:func:`spec_boxes`) with the default boxes of
    ``priors`` at ``image_size``; ``exclude``: ``(image path, object index)`` pairs to leave out; ``crop_scale``:
    the boxes at the median crop scale of training crops (the report's ``crop_scale`` is then its text)."""
    boxes = spec_boxes(spec, exclude=exclude, crop_scale=crop_scale, image_size=image_size)
    report = coverage(boxes, priors.boxes(image_size), iou_threshold)
    return report if crop_scale is None else {**report, "crop_scale": crop_scale.text}


def coverage_issue(report: dict, root: str) -> Issue | None:
    """The ``low_prior_coverage`` warning of a :func:`prior_coverage` report with badly covered boxes, or None."""
    if not report["worst"]:
        return None
    worst = "; ".join(f"{w['name']} objects ({w['covered']:.0%} of {w['boxes']})" for w in report["worst"])
    return Issue("warning", "low_prior_coverage", f"{report['covered']:.0%} of the boxes reach IoU "
                 f"{report['iou_threshold']} with a default box; worst covered: {worst} (too small or too elongated "
                 "for the default boxes: consider a larger image size or a model with finer default boxes)", root)


def fit_for_model(data: DatasetSpec | Tensor, model: str, image_size: int | tuple[int, int] | str | None = None, *,
                  free: bool = False, seed: int = 0) -> FitResult:
    """:func:`ssd.priors.fit.fit_priors` for ``model`` at ``image_size`` (default: its own; an int, ``(h, w)`` or
    ``"HxW"``) on a dataset's training split (or on boxes ``[N, 4]`` xyxy normalized to their images)."""
    boxes = data if isinstance(data, Tensor) else training_boxes(data)
    base = default_priors(model, image_size)
    size = MODEL_CONFIGS[model].image_size if image_size is None else image_size
    return fit_priors(boxes, size, base, free=free, seed=seed)


def suggest_image_size(spec: DatasetSpec, model: str, image_size: int | tuple[int, int] | str | None = None,
                       iou_threshold: float = MATCH_IOU, exclude: set | None = None) -> dict | None:
    """A non-square input size for ``model`` when most training images share an aspect ratio far from 1.

    Rule: at least 60% of the training images (every image without a ``train`` split) have a width / height within
    10% of one ratio ``r`` outside ``[0.8, 1.25]``. The size keeps about the pixels of the model's input
    (``image_size``, default the model's) with sides multiples of 32, so the default boxes keep their sizes in
    pixels (:meth:`ssd.priors.PriorConfig.scaled_to`), or the smallest such size the model takes (VGG's last levels
    need ~270 px). Returns ``dict(image_size (h, w), text "HxW", ratio r (median of those images), share, coverage
    (the :func:`prior_coverage` dict at that size), current (its share at the current size), message)``, or
    ``None`` (no dominant ratio, the same size, or a size the model cannot take).
    """
    records = spec.splits.get(TRAIN_SPLIT) or [r for recs in spec.splits.values() for r in recs]
    ratios = torch.tensor([r.width / r.height for r in records if r.width and r.height], dtype=torch.float64)
    if len(ratios) == 0 or model not in MODEL_CONFIGS:
        return None
    ratios = ratios.sort().values
    counts = torch.searchsorted(ratios, ratios * 1.1, right=True) - torch.searchsorted(ratios, ratios * 0.9)
    best = int(counts.argmax())  # the ratio with the most images within 10% of it
    share = float(counts[best]) / len(ratios)
    ratio = float(ratios[(ratios >= ratios[best] * 0.9) & (ratios <= ratios[best] * 1.1)].median())
    if share < 0.6 or 0.8 <= ratio <= 1.25:
        return None
    height, width = as_hw(MODEL_CONFIGS[model].image_size if image_size is None else image_size)
    side = round(math.sqrt(height * width / ratio) / 32)  # h * w = pixels and w / h = ratio, in units of 32
    for rows in range(max(1, side), side + 8):  # the first size the model takes (VGG needs ~270 px per side)
        size = (rows * 32, max(1, round(rows * ratio)) * 32)
        try:
            priors = default_priors(model, size)
            break
        except ValueError:  # too small for the model's last levels
            continue
    else:
        return None
    if size == (height, width):
        return None
    suggested = prior_coverage(spec, priors, size, iou_threshold, exclude)
    current = prior_coverage(spec, default_priors(model, (height, width)), (height, width), iou_threshold,
                             exclude)["covered"]
    text = size_text(size)
    message = (f"{share:.0%} of the {len(ratios)} training images are {ratio:.2f}:1 (width / height, within 10%), "
               f"which the {size_text((height, width))} input of {model} distorts: --image-size {text} (height x "
               f"width, {size[0] * size[1] / (height * width):.2f}x the pixels) gives {suggested['covered']:.1%} "
               f"default-box coverage (now {current:.1%})")
    return {"image_size": size, "text": text, "ratio": ratio, "share": share, "coverage": suggested,
            "current": current, "message": message}

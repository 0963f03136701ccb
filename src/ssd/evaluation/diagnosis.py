"""Back to the data: where the missed and poorly localized objects are, by size and default-box coverage.

The objects of :func:`ssd.evaluation.tide.error_breakdown` that are ``missed`` or that a localization error points
at are split by the size buckets of :data:`ssd.priors.coverage.SIZE_BUCKETS` (``sqrt(w * h)`` relative to the
image, as ``ssd check`` reports default-box coverage) and by whether any default box of the model reaches them at
IoU 0.5 (an object no default box reaches gets only its one forced match in training). A large share of either
comes with a next step.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ssd.errors import InputError
from ssd.evaluation.tide import OBJECT_STATES
from ssd.matching import MATCH_IOU
from ssd.priors.coverage import SIZE_BUCKETS, best_iou

__all__ = ["LARGE_SHARE", "error_sources", "next_step"]

LARGE_SHARE = 0.3
"""Share of small or uncovered objects among the missed / mislocalized ones above which a next step is printed."""


def _normalized(ground_truths: Sequence[Mapping[str, Any]]) -> Tensor:
    """``[M, 4]`` every object's box divided by its image's ``(w, h, w, h)`` (the ground truths' ``image_size``)."""
    parts = []
    for index, truth in enumerate(ground_truths):
        if "image_size" not in truth:
            raise InputError(f"ground truth of image {index} has no image_size (h, w): needed to size the objects")
        h, w = (float(v) for v in truth["image_size"])
        parts.append(torch.as_tensor(truth["boxes"], dtype=torch.float64).reshape(-1, 4) / torch.tensor([w, h, w, h]))
    return torch.cat(parts) if parts else torch.zeros(0, 4, dtype=torch.float64)


def next_step(data: str | None = None, model: str | None = None) -> str:
    """The advice for small or uncovered objects: the ``ssd check`` command that fits default boxes to ``data``
    for ``model`` (placeholders where unknown), or a larger input, or tiling."""
    command = f"ssd check {shlex.quote(data) if data else 'DATA'} --model {model or 'MODEL'} --fit-priors"
    return f"try `{command}`, a larger `--image-size` or `--tile`"


def _group(name: str, mask: Tensor, size: Tensor, covered: Tensor | None, step: str) -> dict[str, Any]:
    n = int(mask.sum())
    by_size = []
    for bucket, lo, hi in SIZE_BUCKETS:
        count = int((mask & (size >= lo) & (size < hi)).sum())
        by_size.append({"name": bucket, "count": count, "share": count / n if n else 0.0})
    uncovered = None if covered is None else (int((mask & ~covered).sum()) / n if n else 0.0)
    small = by_size[0]["share"]
    advice = None
    if n and (small >= LARGE_SHARE or (uncovered or 0.0) >= LARGE_SHARE):
        reach = "" if uncovered is None else f" and {uncovered:.0%} have no default box at IoU 0.5"
        advice = (f"{small:.0%} of {name} objects are small (under {SIZE_BUCKETS[0][2]:.0%} of the image side)"
                  f"{reach}: {step}")
    return {"count": n, "by_size": by_size, "uncovered": uncovered, "advice": advice}


def error_sources(ground_truths: Sequence[Mapping[str, Any]], breakdown: Mapping[str, Any],
                  priors: Tensor | None = None, coverage_iou: float = MATCH_IOU, data: str | None = None,
                  model: str | None = None) -> dict[str, Any]:
    """Missed and localization-error objects by size and coverage.

    Args:
        ground_truths: the per-image dicts given to ``error_breakdown``, each with ``image_size`` ``(h, w)``.
        breakdown: its result (``object_state``, ``localization_targets``).
        priors: the model's default boxes ``[P, 4]`` cxcywh normalized; without them coverage is not reported.
        data: the dataset the advice's ``ssd check`` command names (see :func:`next_step`).
        model: the model name that command names.

    Returns:
        ``dict(missed, localization)``, each ``dict(count, by_size, uncovered, advice)``: ``by_size`` one
        ``dict(name, count, share)`` per size bucket; ``uncovered`` the share no default box reaches at
        ``coverage_iou`` (None without priors); ``advice`` a next step when a share is large, else None.
    """
    boxes = _normalized(ground_truths)
    size = ((boxes[:, 2] - boxes[:, 0]).clamp(min=0) * (boxes[:, 3] - boxes[:, 1]).clamp(min=0)).sqrt()
    covered = None if priors is None else best_iou(boxes.clamp(0, 1), priors) >= coverage_iou
    state = torch.cat(list(breakdown["object_state"])) if len(boxes) else torch.zeros(0, dtype=torch.int64)
    localized = (torch.cat(list(breakdown["localization_targets"])) if len(boxes)
                 else torch.zeros(0, dtype=torch.bool))
    step = next_step(data, model)
    return {"missed": _group("missed", state == OBJECT_STATES.index("missed"), size, covered, step),
            "localization": _group("poorly localized", localized, size, covered, step)}

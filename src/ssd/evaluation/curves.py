"""Operating point: precision, recall and F1 against the confidence threshold, and the confidence that maximises F1.

Detections are matched to ground truths by the VOC rule at ``iou_threshold`` (:func:`ssd.evaluation.metrics.
match_detections`; detections on difficult objects are left out). At a confidence ``c`` the kept detections are those
scoring above ``c`` (strictly, as ``score_threshold`` everywhere, so the best confidence used as a threshold keeps
exactly the detections it was scored with): precision is TP / kept (1 when nothing is kept), recall TP / objects, F1
their harmonic mean (0 when both are 0). The overall curves are the means over the classes that have objects (every
class counts the same, as in Ultralytics' curves); a class without objects in the split is absent: no curves, no best
point.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ssd.evaluation.metrics import VOC_IOU, check_inputs, concat_rows, match_detections

__all__ = ["confidence_grid", "operating_point"]


def confidence_grid(steps: int = 1000) -> Tensor:
    """``[steps + 1]`` float64 confidences ``0, 1/steps, ..., 1``."""
    return torch.arange(steps + 1, dtype=torch.float64) / steps


def _counts_at(labels: Tensor, bins: Tensor, weights: Tensor, num_classes: int, size: int) -> Tensor:
    """``[K, T]`` sum of ``weights`` of the rows of each class whose bin is at or above each grid index (a row's bin is
    the last grid index below its score)."""
    hist = torch.bincount(labels * size + bins, weights=weights, minlength=num_classes * size).reshape(num_classes,
                                                                                                         size)
    return hist.flip(1).cumsum(1).flip(1)


def _best(f1: Tensor) -> Tensor:
    """``[...]`` index of the highest grid confidence at which each ``f1 [..., T]`` curve reaches its maximum."""
    return f1.shape[-1] - 1 - f1.flip(-1).argmax(-1)


def _point(grid: Tensor, precision: Tensor, recall: Tensor, f1: Tensor) -> dict[str, float]:
    j = int(_best(f1))
    return {"confidence": float(grid[j]), "precision": float(precision[j]), "recall": float(recall[j]),
            "f1": float(f1[j])}


def operating_point(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                    num_classes: int, class_names: Sequence[str] | None = None, *, iou_threshold: float = VOC_IOU,
                    steps: int = 1000) -> dict[str, Any]:
    """Precision / recall / F1 curves over :func:`confidence_grid` and the confidence of the best F1.

    Inputs are the per-image dicts of :mod:`ssd.evaluation.metrics`.

    Returns:
        ``dict(confidence [T], match_iou_threshold, overall, per_class)``: ``overall`` is ``dict(precision [T],
        recall [T], f1 [T], best)`` (float64 arrays; ``best``: ``dict(confidence, precision, recall, f1)``
        at the highest confidence reaching the maximum F1; ``None`` with no objects at all); ``per_class`` maps
        each class name to the same plus ``num_gt`` and ``absent`` (True, with empty curves and ``best`` None, for a
        class without objects).
    """
    names = check_inputs(detections, ground_truths, num_classes, class_names)
    det = concat_rows(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = concat_rows(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))
    tp, ignored = match_detections(det, gt, num_classes, iou_threshold)[:2]
    grid = confidence_grid(steps)
    size = grid.numel()
    # binned in float32, the precision of the scores and of the threshold a model compares them with
    bins = torch.searchsorted(grid.float(), det["scores"].float(), right=False).sub(1).clamp(max=size - 1)
    counted = ~ignored & (bins >= 0)  # a score of 0 is above no threshold
    labels, bins = det["labels"][counted], bins[counted]
    kept = _counts_at(labels, bins, torch.ones_like(bins, dtype=torch.float64), num_classes, size)
    hits = _counts_at(labels, bins, tp[counted].to(torch.float64), num_classes, size)
    num_gt = torch.bincount(gt["labels"][~gt["difficult"]], minlength=num_classes).to(torch.float64)

    precision = torch.where(kept > 0, hits / kept.clamp(min=1), torch.ones_like(hits))  # [K, T]
    recall = hits / num_gt.clamp(min=1)[:, None]
    total = precision + recall
    f1 = torch.where(total > 0, 2 * precision * recall / total.clamp(min=1e-12), torch.zeros_like(total))
    present = num_gt > 0

    per_class = {}
    for k, name in enumerate(names):
        if present[k]:
            curves = {"precision": precision[k].numpy(), "recall": recall[k].numpy(), "f1": f1[k].numpy()}
            per_class[name] = {**curves, "best": _point(grid, precision[k], recall[k], f1[k]),
                               "num_gt": int(num_gt[k]), "absent": False}
        else:
            per_class[name] = {"precision": np.zeros(0), "recall": np.zeros(0), "f1": np.zeros(0), "best": None,
                               "num_gt": 0, "absent": True}
    if present.any():
        mean = [curve[present].mean(0) for curve in (precision, recall, f1)]
        overall = {"precision": mean[0].numpy(), "recall": mean[1].numpy(), "f1": mean[2].numpy(),
                   "best": _point(grid, *mean)}
    else:
        overall = {"precision": np.zeros(0), "recall": np.zeros(0), "f1": np.zeros(0), "best": None}
    return {"confidence": grid.numpy(), "match_iou_threshold": float(iou_threshold), "overall": overall,
            "per_class": per_class}

"""Confusion matrix of detections at one confidence and IoU, with a background row and column.

Detections scoring above ``confidence`` (strictly, as every ``score_threshold``) are paired with the objects of their
image (any class) at IoU ``>= iou_threshold`` and matched one to one greedily by IoU, in one pass as Ultralytics does:
each detection keeps its best object, then each object its best detection among those. A matched pair counts at (true
class, predicted class); an object left unmatched at (true class, background): missed; a detection left unmatched at
(background, predicted class): a false positive on background (duplicates included). Pairs with a difficult / crowd
object are not counted, and an unmatched difficult object is not missed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ssd.evaluation.metrics import VOC_IOU, check_inputs, concat_rows, paired_iou, same_key_pairs
from ssd.settings import PREDICT

__all__ = ["BACKGROUND", "confusion_matrix"]

BACKGROUND = "background"


def _first_per(keys: Tensor, size: int) -> Tensor:
    """``[Q]`` bool: the first row of each key value in ``keys [Q]`` (rows in priority order)."""
    first = torch.full((size,), keys.numel(), dtype=torch.int64)
    rank = torch.arange(keys.numel())
    first = first.scatter_reduce(0, keys, rank, "amin")
    return first[keys] == rank


def _matched_pairs(det: dict[str, Tensor], gt: dict[str, Tensor], iou_threshold: float) -> tuple[Tensor, Tensor]:
    """``(det_index [Q], gt_index [Q])`` of the one-to-one greedy matching by IoU (see the module docstring)."""
    pair_det, pair_gt, _ = same_key_pairs(det["image"], gt["image"])
    iou = paired_iou(det["boxes"][pair_det], gt["boxes"][pair_gt])
    close = iou >= iou_threshold
    pair_det, pair_gt, iou = pair_det[close], pair_gt[close], iou[close]
    order = torch.argsort(-iou, stable=True)
    pair_det, pair_gt = pair_det[order], pair_gt[order]
    best_of_det = _first_per(pair_det, det["labels"].numel())
    pair_det, pair_gt = pair_det[best_of_det], pair_gt[best_of_det]
    best_of_gt = _first_per(pair_gt, gt["labels"].numel())
    return pair_det[best_of_gt], pair_gt[best_of_gt]


def confusion_matrix(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                     num_classes: int, class_names: Sequence[str] | None = None, *,
                     confidence: float = PREDICT.score_threshold, iou_threshold: float = VOC_IOU) -> dict[str, Any]:
    """Counts ``[K + 1, K + 1]`` of (true, predicted) classes, index ``K`` the background (see the module docstring).

    Inputs are the per-image dicts of :mod:`ssd.evaluation.metrics`.

    Returns:
        ``dict(names, counts, normalized, confidence, match_iou_threshold)``: ``names`` the K class names and
        ``"background"`` (the order of rows and columns); ``counts`` int64 array (rows: true class, columns:
        prediction; ``[K, K]`` is always 0); ``normalized`` float64, each row divided by its sum (a row without
        entries stays 0: that class has no objects, or background has no false positives).
    """
    names = check_inputs(detections, ground_truths, num_classes, class_names)
    det = concat_rows(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = concat_rows(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))
    confident = det["scores"] > torch.tensor(confidence, dtype=torch.float32).double()  # a model's float32 compare
    det = {key: value[confident] for key, value in det.items()}
    det_index, gt_index = _matched_pairs(det, gt, iou_threshold)

    size = num_classes + 1
    det_matched = torch.zeros(det["labels"].numel(), dtype=torch.bool)
    det_matched[det_index] = True
    gt_matched = torch.zeros(gt["labels"].numel(), dtype=torch.bool)
    gt_matched[gt_index] = True
    counted = ~gt["difficult"][gt_index]
    true_class = torch.cat([gt["labels"][gt_index][counted], gt["labels"][~gt_matched & ~gt["difficult"]],
                            torch.full((int((~det_matched).sum()),), num_classes)])
    predicted = torch.cat([det["labels"][det_index][counted],
                           torch.full((int((~gt_matched & ~gt["difficult"]).sum()),), num_classes),
                           det["labels"][~det_matched]])
    counts = torch.bincount(true_class * size + predicted, minlength=size * size).reshape(size, size)
    totals = counts.sum(dim=1, keepdim=True)
    normalized = torch.where(totals > 0, counts / totals.clamp(min=1), torch.zeros(size, size, dtype=torch.float64))
    return {"names": [*names, BACKGROUND], "counts": counts.numpy(), "normalized": normalized.numpy(),
            "confidence": float(confidence), "match_iou_threshold": float(iou_threshold)}


"""Detection metrics on per-image detections and ground truths in pixel ``xyxy``: VOC AP (COCO: :mod:`.coco`).

Inputs (every function here):

- ``detections``: one dict per image, ``boxes [N, 4]`` pixel xyxy, ``scores [N]``, ``labels [N]`` int in ``0..K-1``
  (tensors or arrays; extra keys such as ``image_id`` are ignored).
- ``ground_truths``: one dict per image (same order), ``boxes [M, 4]`` pixel xyxy, ``labels [M]`` in ``0..K-1``,
  ``difficult [M]`` bool (optional, default all False): VOC ``difficult`` or COCO ``iscrowd`` objects, which
  evaluation ignores.

VOC (:func:`evaluate_voc`) follows the official devkit (``VOCevaldet``): per class, detections of all images sorted by
decreasing score; each is assigned the ground truth of its image and class with the largest IoU; with IoU >= the
threshold it is a true positive if that ground truth is not difficult and not yet matched, a false positive if it is
already matched (duplicate), and neither if it is difficult; otherwise a false positive. Two deliberate differences:
IoU uses continuous coordinates (``torchvision.ops`` areas, no devkit ``+1`` pixel), like modern libraries, and equal
scores keep image order (stable sort; the devkit's order for ties is unspecified).

The input checks and flattening (:func:`check_inputs`, :func:`concat_rows`) are shared by every metric of
:mod:`ssd.evaluation`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_area

from ssd.errors import InputError
from ssd.inference.coco_results import as_tensor

__all__ = ["VOC_IOU", "voc_ap", "evaluate_voc", "voc_from_rows", "match_detections", "check_inputs", "concat_rows",
           "same_key_pairs", "paired_iou"]

VOC_IOU = 0.5
"""IoU at which a detection matches a ground truth in the VOC metrics, and so in the confusion matrix, the F1 curves
and the error breakdown built on that matching."""


def voc_ap(recall: Sequence[float] | np.ndarray, precision: Sequence[float] | np.ndarray,
           use_07_metric: bool = False) -> float:
    """Average precision of one precision/recall curve.

    Args:
        recall: ``[D]`` non-decreasing recall after each detection (by decreasing score).
        precision: ``[D]`` precision after each detection.
        use_07_metric: VOC2007 11-point interpolation (mean over ``t in 0, 0.1, ..., 1`` of the best precision at
            recall >= t, 0 when recall never reaches t); otherwise VOC2010+ area under the monotone precision
            envelope (precision made non-increasing from the right, integrated where recall changes).

    Returns:
        AP in ``[0, 1]``; 0 for an empty curve.
    """
    rec = np.asarray(recall, dtype=np.float64)
    prec = np.asarray(precision, dtype=np.float64)
    if rec.ndim != 1 or rec.shape != prec.shape:
        raise InputError(f"voc_ap: recall {tuple(rec.shape)} and precision {tuple(prec.shape)} must be 1-D arrays "
                         f"of the same length")
    if rec.size == 0:
        return 0.0
    if np.any(np.diff(rec) < 0):
        raise InputError("voc_ap: recall must be non-decreasing (cumulative over detections sorted by score)")
    envelope = np.maximum.accumulate(prec[::-1])[::-1]  # best precision at this recall or beyond
    if use_07_metric:
        first = np.searchsorted(rec, np.linspace(0.0, 1.0, 11), side="left")  # first point with recall >= t
        return float(np.where(first < rec.size, envelope[np.minimum(first, rec.size - 1)], 0.0).mean())
    steps = np.diff(np.concatenate(([0.0], rec)))
    return float((steps * envelope).sum())


# ------------------------------------------------------------------------------------------------ inputs
def concat_rows(items: Sequence[Mapping[str, Any]], kind: str, num_classes: int,
            keys: tuple[str, ...]) -> dict[str, Tensor]:
    """Concatenate per-image dicts into flat tensors plus ``image`` (index of the image of each row), validated."""
    columns: dict[str, list[Tensor]] = {k: [] for k in (*keys, "image")}
    for index, item in enumerate(items):
        boxes = as_tensor(item["boxes"], torch.float64).reshape(-1, 4)
        n = boxes.shape[0]
        row = {"boxes": boxes, "image": torch.full((n,), index, dtype=torch.int64)}
        row["labels"] = as_tensor(item["labels"], torch.int64).reshape(-1)
        if "scores" in keys:
            row["scores"] = as_tensor(item["scores"], torch.float64).reshape(-1)
        if "difficult" in keys:
            row["difficult"] = (as_tensor(item["difficult"], torch.bool).reshape(-1) if "difficult" in item
                                else torch.zeros(n, dtype=torch.bool))
        for key, value in row.items():
            if value.shape[0] != n:
                raise InputError(f"{kind} of image {index}: {key} has {value.shape[0]} entries but boxes has {n}")
        for key, value in row.items():
            columns[key].append(value)
    empty = {"boxes": torch.zeros(0, 4, dtype=torch.float64), "image": torch.zeros(0, dtype=torch.int64),
             "labels": torch.zeros(0, dtype=torch.int64), "scores": torch.zeros(0, dtype=torch.float64),
             "difficult": torch.zeros(0, dtype=torch.bool)}
    flat = {k: torch.cat(v) if v else empty[k] for k, v in columns.items()}
    bad = ((flat["labels"] < 0) | (flat["labels"] >= num_classes)).nonzero()
    if bad.numel():
        i = int(bad[0])
        image = int(flat["image"][i])
        j = i - int((flat["image"] < image).sum())
        raise InputError(f"{kind} of image {image}, object {j}: label {int(flat['labels'][i])} is out of range for "
                         f"num_classes={num_classes} (labels must be 0..{num_classes - 1})")
    return flat


def check_inputs(detections: Sequence, ground_truths: Sequence, num_classes: int,
                  class_names: Sequence[str] | None) -> list[str]:
    if len(detections) != len(ground_truths):
        raise InputError(f"{len(detections)} detection entries but {len(ground_truths)} ground-truth entries "
                         f"(one dict per image each, same order)")
    names = list(class_names) if class_names is not None else [f"class{k}" for k in range(num_classes)]
    if len(names) != num_classes:
        raise InputError(f"{len(names)} class names for num_classes={num_classes}")
    if len(set(names)) != len(names):
        raise InputError(f"class names must be unique, got {names}")
    return names


def same_key_pairs(det_key: Tensor, gt_key: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Every (detection, object) pair with equal keys (e.g. the image index, or image and class), without forming
    the full ``[N, M]`` product: ``(pair_det [Q], pair_gt [Q], per_det [N])`` row indices of each pair and the
    number of pairs of each detection (keys ``>= 0``)."""
    n = det_key.shape[0]
    num_keys = int(max(gt_key.max().item() if gt_key.numel() else 0, det_key.max().item() if n else 0)) + 1
    order = torch.argsort(gt_key, stable=True)
    counts = torch.bincount(gt_key, minlength=num_keys)
    starts = torch.cumsum(counts, 0) - counts
    per_det = counts[det_key]
    pair_det = torch.repeat_interleave(torch.arange(n), per_det)
    offset = torch.arange(pair_det.numel()) - torch.repeat_interleave(torch.cumsum(per_det, 0) - per_det, per_det)
    return pair_det, order[starts[det_key][pair_det] + offset], per_det


def paired_iou(a: Tensor, b: Tensor) -> Tensor:
    """IoU of ``a[i]`` with ``b[i]`` (``[N, 4]`` xyxy each, continuous coordinates) -> ``[N]``."""
    wh = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    union = box_area(a) + box_area(b) - inter
    return torch.where(union > 0, inter / union.clamp(min=torch.finfo(union.dtype).tiny), torch.zeros_like(inter))


# ---------------------------------------------------------------------------------------------------- VOC
def _best_ground_truth(det: dict[str, Tensor], gt: dict[str, Tensor], num_classes: int) -> tuple[Tensor, Tensor]:
    """For each detection, the ground truth of its image and class with the largest IoU (the first one on ties).

    Returns ``(iou [N] float64, index [N] int64)``, index ``-1`` / iou ``0`` when the image has no such object.
    Only the (detection, object) pairs that share image and class are formed, so memory is linear in them.
    """
    n = det["labels"].shape[0]
    pair_det, pair_gt, per_det = same_key_pairs(det["image"] * num_classes + det["labels"],
                                                gt["image"] * num_classes + gt["labels"])
    iou = paired_iou(det["boxes"][pair_det], gt["boxes"][pair_gt])
    best = torch.zeros(n, dtype=torch.float64).scatter_reduce(0, pair_det, iou, "amax", include_self=True)
    index = torch.full((n,), gt["labels"].numel(), dtype=torch.int64)
    at_best = iou == best[pair_det]
    index = index.scatter_reduce(0, pair_det[at_best], pair_gt[at_best], "amin", include_self=True)
    return best, torch.where(per_det > 0, index, -1)


def match_detections(det: dict[str, Tensor], gt: dict[str, Tensor], num_classes: int,
                     iou_threshold: float = VOC_IOU) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The VOC matching of flat detections and ground truths (:func:`concat_rows` rows), see the module docstring.

    Returns ``(tp [N] bool, ignored [N] bool, order [N], best_iou [N], best_gt [N])``: ``tp`` true positives,
    ``ignored`` detections matched to a difficult object (neither TP nor FP), ``order`` detection indices by class,
    then decreasing score (stable), ``best_iou`` / ``best_gt`` each detection's best same-class object of its image
    (index into the ground-truth rows, ``-1`` / ``0`` without one).
    """
    best_iou, best_gt = _best_ground_truth(det, gt, num_classes)
    hit = (best_gt >= 0) & (best_iou >= iou_threshold)
    difficult = torch.cat([gt["difficult"], gt["difficult"].new_zeros(1)])  # index -1 (no object): False
    hit_difficult = hit & difficult[best_gt]
    candidate = hit & ~hit_difficult
    # Rank by class, then decreasing score (stable: image order on ties); the first candidate of an object is its TP.
    order = torch.argsort(-det["scores"], stable=True)
    order = order[torch.argsort(det["labels"][order], stable=True)]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel())
    first = torch.full((gt["labels"].numel() + 1,), order.numel(), dtype=torch.int64)
    first = first.scatter_reduce(0, best_gt[candidate], rank[candidate], "amin")
    tp = candidate & (rank == first[best_gt.clamp(min=0)])
    return tp, hit_difficult, order, best_iou, best_gt


def evaluate_voc(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                 num_classes: int, class_names: Sequence[str] | None = None, use_07_metric: bool = False,
                 iou_threshold: float = VOC_IOU) -> dict[str, Any]:
    """PASCAL VOC average precision per class at one IoU threshold (see the module docstring for the rules).

    Returns:
        ``dict(map, match_iou_threshold, use_07_metric, per_class)``: ``map`` is the mean AP over classes that have at
        least one non-difficult ground truth (``nan`` when none has); ``per_class`` maps each class name
        (``class_names``, default ``"class0".."classK-1"``), in label order, to ``dict(ap, num_gt, num_det, precision,
        recall)``: ``ap`` (``nan`` without ground truth), ``num_gt`` non-difficult objects, ``num_det`` detections
        given, ``precision`` / ``recall`` ``[D]`` float64 arrays after each detection by decreasing score (detections
        matched to difficult objects left out; empty without ground truth).
    """
    names = check_inputs(detections, ground_truths, num_classes, class_names)
    det = concat_rows(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = concat_rows(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))
    return voc_from_rows(det, gt, names, use_07_metric, iou_threshold)


def voc_from_rows(det: dict[str, Tensor], gt: dict[str, Tensor], names: Sequence[str], use_07_metric: bool = False,
                  iou_threshold: float = VOC_IOU) -> dict[str, Any]:
    """:func:`evaluate_voc` of flat rows (:func:`concat_rows`) and the class names, one per label."""
    num_classes = len(names)
    tp, hit_difficult, order = match_detections(det, gt, num_classes, iou_threshold)[:3]
    keep = order[~hit_difficult[order]]  # ranked detections that count
    tp_ranked, labels_ranked = tp[keep].to(torch.float64), det["labels"][keep]
    per_class_counts = torch.bincount(labels_ranked, minlength=num_classes).tolist()
    num_gt = torch.bincount(gt["labels"][~gt["difficult"]], minlength=num_classes).tolist()
    num_det = torch.bincount(det["labels"], minlength=num_classes).tolist()

    per_class, aps = {}, []
    for k, tp_k in enumerate(tp_ranked.split(per_class_counts)):
        if num_gt[k] == 0:
            precision = recall = np.zeros(0)
            ap = float("nan")
        else:
            ctp = torch.cumsum(tp_k, 0)
            recall = (ctp / num_gt[k]).numpy()
            precision = (ctp / torch.arange(1, ctp.numel() + 1)).numpy()
            ap = voc_ap(recall, precision, use_07_metric)
            aps.append(ap)
        per_class[names[k]] = {"ap": ap, "num_gt": num_gt[k], "num_det": num_det[k], "precision": precision,
                               "recall": recall}
    return {"map": float(np.mean(aps)) if aps else float("nan"), "match_iou_threshold": float(iou_threshold),
            "use_07_metric": bool(use_07_metric), "per_class": per_class}

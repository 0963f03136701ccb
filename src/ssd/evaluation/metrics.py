"""Detection metrics on per-image detections and ground truths in pixel ``xyxy``: VOC AP and COCO AP.

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

COCO (:func:`evaluate_coco`) runs pycocotools' ``COCOeval`` on datasets built in memory; difficult/crowd objects are
passed as ``iscrowd=1`` ignore regions.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_area

__all__ = ["voc_ap", "evaluate_voc", "evaluate_coco", "to_coco_detections", "COCO_STATS"]

# Names of pycocotools' first six ``COCOeval.stats`` (bbox, maxDets=100).
COCO_STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl")


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
        raise ValueError(f"voc_ap: recall {tuple(rec.shape)} and precision {tuple(prec.shape)} must be 1-D arrays "
                         f"of the same length")
    if rec.size == 0:
        return 0.0
    if np.any(np.diff(rec) < 0):
        raise ValueError("voc_ap: recall must be non-decreasing (cumulative over detections sorted by score)")
    envelope = np.maximum.accumulate(prec[::-1])[::-1]  # best precision at this recall or beyond
    if use_07_metric:
        first = np.searchsorted(rec, np.linspace(0.0, 1.0, 11), side="left")  # first point with recall >= t
        return float(np.where(first < rec.size, envelope[np.minimum(first, rec.size - 1)], 0.0).mean())
    steps = np.diff(np.concatenate(([0.0], rec)))
    return float((steps * envelope).sum())


# ------------------------------------------------------------------------------------------------ inputs
def _as_tensor(value: Any, dtype: torch.dtype) -> Tensor:
    return torch.as_tensor(np.asarray(value) if not isinstance(value, Tensor) else value.detach().cpu(), dtype=dtype)


def _concat(items: Sequence[Mapping[str, Any]], kind: str, num_classes: int,
            keys: tuple[str, ...]) -> dict[str, Tensor]:
    """Concatenate per-image dicts into flat tensors plus ``image`` (index of the image of each row), validated."""
    columns: dict[str, list[Tensor]] = {k: [] for k in (*keys, "image")}
    for index, item in enumerate(items):
        boxes = _as_tensor(item["boxes"], torch.float64).reshape(-1, 4)
        n = boxes.shape[0]
        row = {"boxes": boxes, "image": torch.full((n,), index, dtype=torch.int64)}
        row["labels"] = _as_tensor(item["labels"], torch.int64).reshape(-1)
        if "scores" in keys:
            row["scores"] = _as_tensor(item["scores"], torch.float64).reshape(-1)
        if "difficult" in keys:
            row["difficult"] = (_as_tensor(item["difficult"], torch.bool).reshape(-1) if "difficult" in item
                                else torch.zeros(n, dtype=torch.bool))
        for key, value in row.items():
            if value.shape[0] != n:
                raise ValueError(f"{kind} of image {index}: {key} has {value.shape[0]} entries but boxes has {n}")
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
        raise ValueError(f"{kind} of image {image}, object {j}: label {int(flat['labels'][i])} is out of range for "
                         f"num_classes={num_classes} (labels must be 0..{num_classes - 1})")
    return flat


def _check_inputs(detections: Sequence, ground_truths: Sequence, num_classes: int,
                  class_names: Sequence[str] | None) -> list[str]:
    if len(detections) != len(ground_truths):
        raise ValueError(f"{len(detections)} detection entries but {len(ground_truths)} ground-truth entries "
                         f"(one dict per image each, same order)")
    names = list(class_names) if class_names is not None else [f"class{k}" for k in range(num_classes)]
    if len(names) != num_classes:
        raise ValueError(f"{len(names)} class names for num_classes={num_classes}")
    if len(set(names)) != len(names):
        raise ValueError(f"class names must be unique, got {names}")
    return names


def _paired_iou(a: Tensor, b: Tensor) -> Tensor:
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
    gt_key = gt["image"] * num_classes + gt["labels"]
    det_key = det["image"] * num_classes + det["labels"]
    num_keys = int(max(gt_key.max().item() if gt_key.numel() else 0, det_key.max().item() if n else 0)) + 1
    order = torch.argsort(gt_key, stable=True)
    counts = torch.bincount(gt_key, minlength=num_keys)
    starts = torch.cumsum(counts, 0) - counts
    per_det = counts[det_key]  # [N] candidate objects of each detection
    pair_det = torch.repeat_interleave(torch.arange(n), per_det)
    offset = torch.arange(pair_det.numel()) - torch.repeat_interleave(torch.cumsum(per_det, 0) - per_det, per_det)
    pair_gt = order[starts[det_key][pair_det] + offset]
    iou = _paired_iou(det["boxes"][pair_det], gt["boxes"][pair_gt])
    best = torch.zeros(n, dtype=torch.float64).scatter_reduce(0, pair_det, iou, "amax", include_self=True)
    index = torch.full((n,), gt_key.numel(), dtype=torch.int64)
    at_best = iou == best[pair_det]
    index = index.scatter_reduce(0, pair_det[at_best], pair_gt[at_best], "amin", include_self=True)
    return best, torch.where(per_det > 0, index, -1)


def evaluate_voc(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                 num_classes: int, class_names: Sequence[str] | None = None, use_07_metric: bool = False,
                 iou_threshold: float = 0.5) -> dict[str, Any]:
    """PASCAL VOC average precision per class at one IoU threshold (see the module docstring for the rules).

    Returns:
        ``dict(map, match_iou_threshold, use_07_metric, per_class)``: ``map`` is the mean AP over classes that have at
        least one non-difficult ground truth (``nan`` when none has); ``per_class`` maps each class name
        (``class_names``, default ``"class0".."classK-1"``), in label order, to ``dict(ap, num_gt, num_det, precision,
        recall)``: ``ap`` (``nan`` without ground truth), ``num_gt`` non-difficult objects, ``num_det`` detections
        given, ``precision`` / ``recall`` ``[D]`` float64 arrays after each detection by decreasing score (detections
        matched to difficult objects left out; empty without ground truth).
    """
    names = _check_inputs(detections, ground_truths, num_classes, class_names)
    det = _concat(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = _concat(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))

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


# --------------------------------------------------------------------------------------------------- COCO
def to_coco_detections(detections: Sequence[Mapping[str, Any]], image_ids: Sequence[Any] | None = None,
                       category_ids: Sequence[int] | Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """COCO results format: one ``dict(image_id, category_id, bbox=[x, y, w, h] pixels, score)`` per detection.

    Args:
        detections: per-image dicts (pixel xyxy, see the module docstring).
        image_ids: one id per image; default each dict's ``image_id`` key, else its index in ``detections``.
        category_ids: label ``k`` -> category id (a sequence indexed by label, or a mapping); default the label
            itself (``0..K-1``). Pass the dataset's original ids to score with the official annotation file.
    """
    if image_ids is not None and len(image_ids) != len(detections):
        raise ValueError(f"{len(image_ids)} image ids for {len(detections)} images")
    results = []
    for index, item in enumerate(detections):
        image_id = image_ids[index] if image_ids is not None else item.get("image_id", index)
        boxes = _as_tensor(item["boxes"], torch.float64).reshape(-1, 4)
        xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], dim=1).tolist()
        labels = _as_tensor(item["labels"], torch.int64).reshape(-1).tolist()
        scores = _as_tensor(item["scores"], torch.float64).reshape(-1).tolist()
        for box, label, score in zip(xywh, labels, scores):
            category = label if category_ids is None else category_ids[label]
            results.append({"image_id": image_id, "category_id": int(category), "bbox": box, "score": score})
    return results


def _coco(images: list[dict], annotations: list[dict], categories: list[dict]):
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = {"images": images, "annotations": annotations, "categories": categories}
    coco.createIndex()
    return coco


def evaluate_coco(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                  num_classes: int, class_names: Sequence[str] | None = None, verbose: bool = False
                  ) -> dict[str, Any]:
    """COCO box AP through pycocotools' ``COCOeval``, on ground truths and detections built in memory (no files).

    Ground-truth ``difficult`` objects are passed as ``iscrowd=1`` ignore regions. Object areas are box areas (for
    APs/APm/APl). Image sizes do not enter COCOeval's box AP, so none are needed. pycocotools' prints are silenced
    unless ``verbose``.

    Returns:
        ``dict(map, AP, AP50, AP75, APs, APm, APl, per_class)``; ``map`` is ``AP`` (AP@[.5:.95], 100 detections per
        image); a value pycocotools reports as -1 (no ground truth in that area range) is ``nan``. ``per_class``
        maps each class name to ``dict(ap, num_gt, num_det, precision, recall)``: ``ap`` AP@[.5:.95] of the class
        (``nan`` without ground truth), ``num_gt`` non-crowd objects, ``num_det`` detections, and the PR curve at
        IoU 0.5: ``precision [101]`` (interpolated) at ``recall [101]`` = ``0, 0.01, ..., 1``.
    """
    from pycocotools.cocoeval import COCOeval

    names = _check_inputs(detections, ground_truths, num_classes, class_names)
    det = _concat(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = _concat(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))

    def annotations(rows: dict[str, Tensor], extra: dict[str, list]) -> list[dict]:
        xywh = torch.cat([rows["boxes"][:, :2], rows["boxes"][:, 2:] - rows["boxes"][:, :2]], dim=1)
        columns = {"image_id": (rows["image"] + 1).tolist(), "category_id": rows["labels"].tolist(),
                   "bbox": xywh.tolist(), "area": (xywh[:, 2] * xywh[:, 3]).tolist(), **extra}
        # ids start at 1: COCOeval treats id 0 as "unmatched"
        return [dict(zip(columns, values), id=i + 1) for i, values in enumerate(zip(*columns.values()))]

    images = [{"id": i + 1} for i in range(len(detections))]
    categories = [{"id": k, "name": name} for k, name in enumerate(names)]
    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        coco_gt = _coco(images, annotations(gt, {"iscrowd": gt["difficult"].int().tolist()}), categories)
        det_extra = {"score": det["scores"].tolist(), "iscrowd": [0] * len(det["scores"])}
        coco_dt = _coco(images, annotations(det, det_extra), categories)
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = [float("nan") if s < 0 else float(s) for s in evaluator.stats[: len(COCO_STATS)]]

    precision = evaluator.eval["precision"][:, :, :, 0, -1]  # [T iou, R recall, K] at area "all", 100 dets
    num_gt = torch.bincount(gt["labels"][~gt["difficult"]], minlength=num_classes).tolist()
    num_det = torch.bincount(det["labels"], minlength=num_classes).tolist()
    recall = np.asarray(evaluator.params.recThrs, dtype=np.float64)
    per_class = {}
    for k, name in enumerate(names):
        valid = precision[:, :, k][precision[:, :, k] > -1]
        has_gt = num_gt[k] > 0 and valid.size > 0
        per_class[name] = {"ap": float(valid.mean()) if has_gt else float("nan"), "num_gt": num_gt[k],
                           "num_det": num_det[k],
                           "precision": precision[0, :, k].astype(np.float64) if has_gt else np.zeros(0),
                           "recall": recall if has_gt else np.zeros(0)}
    return {"map": stats[0], **dict(zip(COCO_STATS, stats)), "per_class": per_class}

"""COCO box statistics of per-image detections: the twelve ``COCOeval`` numbers, per class and per size bucket.

Inputs are the per-image dicts of :mod:`ssd.evaluation.metrics` (pixel xyxy, labels ``0..K-1``, ``difficult``
objects passed to COCOeval as ``iscrowd=1`` ignore regions). A ground-truth dict may also carry ``image_size``
``(h, w)`` pixels: then the statistics are also given per size bucket of :data:`ssd.priors.coverage.SIZE_BUCKETS`
(``sqrt(w * h)`` relative to the image, the buckets ``ssd check`` uses for default-box coverage), from a second
COCOeval run whose areas are relative areas.

The backend is ``faster-coco-eval`` (C++, same numbers) where it is installed, else ``pycocotools``, the reference.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ssd.errors import ConfigError
from ssd.evaluation.metrics import check_inputs, concat_rows
from ssd.priors.coverage import SIZE_BUCKETS

__all__ = ["COCO_STATS", "COCO_BACKENDS", "evaluate_coco", "default_backend"]

COCO_STATS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
"""Names of the twelve ``COCOeval.stats`` of box evaluation, in their order (AP over IoU .5:.95 at 100 detections
per image unless named; s/m/l: COCO's pixel areas under 32², 32²-96², over 96²)."""
COCO_BACKENDS = ("faster-coco-eval", "pycocotools")


def default_backend() -> str:
    """``faster-coco-eval`` when importable, else ``pycocotools``."""
    return COCO_BACKENDS[0] if importlib.util.find_spec("faster_coco_eval") else COCO_BACKENDS[1]


def _cocoeval(backend: str, images: list[dict], annotations: list[dict], detections: list[dict],
              categories: list[dict], area_ranges: Mapping[str, tuple[float, float]] | None = None):
    """A ``COCOeval`` run (evaluate + accumulate + summarize) of the given in-memory datasets."""
    if backend == "faster-coco-eval":
        from faster_coco_eval import COCO
        from faster_coco_eval import COCOeval_faster as COCOeval
    elif backend == "pycocotools":
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval
    else:
        raise ConfigError(f"unknown COCO backend {backend!r}; choose one of {', '.join(COCO_BACKENDS)}")

    def dataset(anns: list[dict]):
        coco = COCO()
        coco.dataset = {"images": images, "annotations": anns, "categories": categories}
        coco.createIndex()
        return coco

    evaluator = COCOeval(dataset(annotations), dataset(detections), iouType="bbox")
    if area_ranges is not None:
        evaluator.params.areaRng = [list(r) for r in area_ranges.values()]
        evaluator.params.areaRngLbl = list(area_ranges)
    evaluator.evaluate()
    evaluator.accumulate()
    if area_ranges is None:
        evaluator.summarize()
    return evaluator


def _annotations(rows: dict[str, Tensor], areas: Tensor, extra: dict[str, list]) -> list[dict]:
    xywh = torch.cat([rows["boxes"][:, :2], rows["boxes"][:, 2:] - rows["boxes"][:, :2]], dim=1)
    columns = {"image_id": (rows["image"] + 1).tolist(), "category_id": rows["labels"].tolist(),
               "bbox": xywh.tolist(), "area": areas.tolist(), **extra}
    # ids start at 1: COCOeval treats id 0 as "unmatched"
    return [dict(zip(columns, values), id=i + 1) for i, values in enumerate(zip(*columns.values()))]


def _box_areas(rows: dict[str, Tensor]) -> Tensor:
    wh = rows["boxes"][:, 2:] - rows["boxes"][:, :2]
    return wh[:, 0] * wh[:, 1]


def _mean_valid(values: np.ndarray) -> float:
    """Mean of the entries COCOeval filled (``> -1``); ``nan`` when there are none."""
    valid = values[values > -1]
    return float(valid.mean()) if valid.size else float("nan")


def _image_areas(ground_truths: Sequence[Mapping[str, Any]]) -> Tensor | None:
    """``[I]`` pixel area of each image from the ground truths' ``image_size`` ``(h, w)``; None if any lacks it."""
    if not ground_truths or any("image_size" not in g for g in ground_truths):
        return None
    sizes = torch.tensor([[float(s) for s in g["image_size"]] for g in ground_truths], dtype=torch.float64)
    return sizes[:, 0] * sizes[:, 1]


def evaluate_coco(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                  num_classes: int, class_names: Sequence[str] | None = None, *, backend: str | None = None,
                  verbose: bool = False) -> dict[str, Any]:
    """COCO box statistics through ``COCOeval`` on datasets built in memory (no files).

    Object areas are box areas; image sizes do not enter box AP. COCOeval's prints are silenced unless ``verbose``.
    ``backend``: one of :data:`COCO_BACKENDS`, default :func:`default_backend`.

    Returns:
        ``dict(map, <the twelve COCO_STATS>, per_class, by_size, backend)``. ``map`` is ``AP``; a statistic COCOeval
        reports as -1 (no ground truth in that area range) is ``nan``. ``per_class`` maps each class name to
        ``dict(ap, ap50, ap75, num_gt, num_det, precision, recall)``: ``ap`` AP@[.5:.95], ``num_gt`` non-crowd
        objects (APs ``nan`` when 0: the class is absent from the split), ``num_det`` detections, and the PR curve
        at IoU 0.5: ``precision [101]`` (interpolated) at ``recall [101]`` = ``0, 0.01, ..., 1`` (empty when
        absent). ``by_size``: None without ``image_size`` in every ground truth, else one dict per size bucket
        ``(name, num_gt, AP, AP50, AR100)``.
    """
    backend = backend or default_backend()
    names = check_inputs(detections, ground_truths, num_classes, class_names)
    det = concat_rows(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = concat_rows(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))
    images = [{"id": i + 1} for i in range(len(ground_truths))]
    categories = [{"id": k, "name": name} for k, name in enumerate(names)]
    gt_extra = {"iscrowd": gt["difficult"].int().tolist()}
    det_extra = {"score": det["scores"].tolist(), "iscrowd": [0] * len(det["scores"])}

    quiet = contextlib.nullcontext() if verbose else contextlib.redirect_stdout(io.StringIO())
    with quiet:
        evaluator = _cocoeval(backend, images, _annotations(gt, _box_areas(gt), gt_extra),
                              _annotations(det, _box_areas(det), det_extra), categories)
    stats = [float("nan") if s < 0 else float(s) for s in evaluator.stats[: len(COCO_STATS)]]

    precision = np.asarray(evaluator.eval["precision"])[:, :, :, 0, -1]  # [T iou, R recall, K], area all, 100 dets
    num_gt = torch.bincount(gt["labels"][~gt["difficult"]], minlength=num_classes).tolist()
    num_det = torch.bincount(det["labels"], minlength=num_classes).tolist()
    recall = np.asarray(evaluator.params.recThrs, dtype=np.float64)
    per_class = {}
    for k, name in enumerate(names):
        present = num_gt[k] > 0
        ap = _mean_valid(precision[:, :, k]) if present else float("nan")
        per_class[name] = {"ap": ap, "ap50": _mean_valid(precision[0, :, k]) if present else float("nan"),
                           "ap75": _mean_valid(precision[5, :, k]) if present else float("nan"),
                           "num_gt": num_gt[k], "num_det": num_det[k],
                           "precision": precision[0, :, k].astype(np.float64) if present else np.zeros(0),
                           "recall": recall if present else np.zeros(0)}
    by_size = None
    image_area = _image_areas(ground_truths)
    if image_area is not None:
        with quiet:
            by_size = _by_size(backend, images, categories, gt, det, image_area, gt_extra, det_extra)
    return {"map": stats[0], **dict(zip(COCO_STATS, stats)), "per_class": per_class, "by_size": by_size,
            "backend": backend}


def _by_size(backend: str, images: list[dict], categories: list[dict], gt: dict[str, Tensor],
             det: dict[str, Tensor], image_area: Tensor, gt_extra: dict, det_extra: dict) -> list[dict[str, Any]]:
    """AP, AP50 and AR100 per :data:`SIZE_BUCKETS` bucket: a COCOeval run on areas relative to the image area."""
    ranges = {"all": (0.0, math.inf), **{name: (lo**2, hi**2) for name, lo, hi in SIZE_BUCKETS}}
    ranges = {name: (lo, min(hi, 1e10)) for name, (lo, hi) in ranges.items()}
    gt_rel = _box_areas(gt) / image_area[gt["image"]]
    det_rel = _box_areas(det) / image_area[det["image"]]
    evaluator = _cocoeval(backend, images, _annotations(gt, gt_rel, gt_extra), _annotations(det, det_rel, det_extra),
                          categories, ranges)
    precision = np.asarray(evaluator.eval["precision"])[..., -1]  # [T, R, K, A]
    recall = np.asarray(evaluator.eval["recall"])[..., -1]  # [T, K, A]
    counted = ~gt["difficult"]
    buckets = []
    for a, (name, (lo, hi)) in enumerate(ranges.items()):
        if name == "all":
            continue
        in_bucket = counted & (gt_rel >= lo) & (gt_rel < hi)
        buckets.append({"name": name, "num_gt": int(in_bucket.sum()), "AP": _mean_valid(precision[:, :, :, a]),
                        "AP50": _mean_valid(precision[0, :, :, a]), "AR100": _mean_valid(recall[:, :, a])})
    return buckets

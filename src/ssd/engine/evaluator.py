"""Run a detector over a validation loader and score it: ``evaluate_model``, plus the pieces the trainer uses.

The loader yields :func:`ssd.data.collate` batches: ``images [B, 3, S, S]`` normalized, ``boxes [B, G, 4]`` xyxy
normalized to the network input, ``labels [B, G]`` (``-1`` padding), ``difficult [B, G]``, ``orig_sizes [B, 2]``
``(h, w)``, ``paths``, ``image_ids``. Predictions and ground truths are scaled by each image's original ``(w, h)``
to pixel xyxy (the evaluation transform is a plain resize) and kept as plain lists of per-image dicts, so that
distributed ranks can ``all_gather`` them and :func:`merge_results` joins them before scoring.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from ssd.engine.metrics import COCO_STATS, evaluate_coco, evaluate_voc, to_coco_detections
from ssd.boxes import pixel_scale
from ssd.postprocess import postprocess

__all__ = ["METRICS", "evaluate_model", "predict_dataset", "evaluate_detections", "merge_results", "format_table",
           "save_coco_json"]

# metric name -> what it is
METRICS = {"voc07": "VOC AP@0.5, 2007 11-point interpolation", "voc": "VOC AP@0.5, 2010+ area under the curve",
           "coco": "COCO AP@[.5:.95] (pycocotools)"}


def predict_dataset(model: nn.Module, loader: Iterable[dict[str, Any]], *, device: torch.device | str | None = None,
                    score_threshold: float = 0.01, iou_threshold: float = 0.45, max_detections: int = 200,
                    channels_last: bool = False, amp_dtype: torch.dtype | None = None, progress: bool = True
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Tensor]]]:
    """Detections and ground truths of every image of ``loader``, in pixel xyxy of the original images.

    ``model`` (or a DDP wrapper of it) maps ``images [B, 3, S, S]`` to ``(loc [B, P, 4], logits [B, P, K+1])`` and
    has ``priors [P, 4]`` and ``config.variances``; it runs in eval mode under
    ``torch.inference_mode`` (autocast to ``amp_dtype`` when given) and its train/eval mode is restored after.

    Returns:
        ``(detections, ground_truths)``, one dict per image in loader order, on the CPU. Detections:
        ``boxes [N, 4]`` float32, ``scores [N]``, ``labels [N]`` int64 ``0..K-1``, ``image_id``, ``path``.
        Ground truths: ``boxes [M, 4]``, ``labels [M]``, ``difficult [M]`` bool (padding removed).
    """
    net = getattr(model, "module", model)
    priors = net.priors
    device = torch.device(device) if device is not None else priors.device
    priors = priors.to(device)
    variances = net.config.variances
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    was_training = model.training
    model.eval()
    detections: list[dict[str, Any]] = []
    ground_truths: list[dict[str, Tensor]] = []
    try:
        for batch in tqdm(loader, desc="evaluate", unit="batch", disable=not progress, leave=False):
            images = batch["images"].to(device, non_blocking=True).contiguous(memory_format=memory_format)
            with torch.inference_mode(), torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                                                        enabled=amp_dtype is not None):
                loc, logits = model(images)
                outputs = postprocess(loc, logits, priors, score_threshold=score_threshold,
                                      iou_threshold=iou_threshold, top_k=max_detections, variances=variances)
            scale = pixel_scale(batch["orig_sizes"])
            counts = [len(out["scores"]) for out in outputs]
            boxes = torch.cat([out["boxes"].cpu() for out in outputs]) * scale.repeat_interleave(
                torch.tensor(counts), dim=0)
            for out, b, image_id, path in zip(outputs, boxes.split(counts), batch["image_ids"], batch["paths"]):
                detections.append({"boxes": b, "scores": out["scores"].cpu().clone(),
                                   "labels": out["labels"].cpu().clone(), "image_id": image_id, "path": path})
            valid = batch["labels"] >= 0  # [B, G]
            gt_boxes = (batch["boxes"].float() * scale[:, None])[valid]
            sizes = valid.sum(dim=1).tolist()
            for b, lab, dif in zip(gt_boxes.split(sizes), batch["labels"][valid].split(sizes),
                                   batch["difficult"][valid].split(sizes)):
                ground_truths.append({"boxes": b, "labels": lab, "difficult": dif})
    finally:
        model.train(was_training)
    return detections, ground_truths


def merge_results(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """Join per-rank lists of per-image dicts (e.g. from ``all_gather_object``) into one list, rank by rank."""
    return [item for part in parts for item in part]


def evaluate_detections(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                        class_names: Sequence[str], metric: str = "voc07", *, verbose: bool = False
                        ) -> dict[str, Any]:
    """Score per-image detections with ``metric`` (a key of :data:`METRICS`).

    Returns the dict of :func:`ssd.engine.metrics.evaluate_voc` (``voc07``, ``voc``: AP@0.5) or
    :func:`~ssd.engine.metrics.evaluate_coco` (``coco``), always with ``map`` (the headline number) and
    ``per_class``, plus ``metric`` and ``detections`` (the list given, for :func:`save_coco_json` and drawing).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    if metric == "coco":
        result = evaluate_coco(detections, ground_truths, len(class_names), class_names, verbose=verbose)
    else:
        result = evaluate_voc(detections, ground_truths, len(class_names), class_names,
                              use_07_metric=metric == "voc07")
    return {"metric": metric, **result, "detections": list(detections)}


def evaluate_model(model: nn.Module, loader: Iterable[dict[str, Any]], metric: str = "voc07",
                   score_threshold: float = 0.01, iou_threshold: float = 0.45, max_detections: int = 200,
                   device: torch.device | str | None = None, progress: bool = True,
                   class_names: Sequence[str] | None = None) -> dict[str, Any]:
    """Predict every batch of ``loader`` (see :func:`predict_dataset`) and score it (:func:`evaluate_detections`).

    ``class_names`` defaults to ``model.class_names``. ``iou_threshold`` is the NMS overlap (the metric's match
    threshold is fixed by ``metric``). The result holds ``detections`` and ``ground_truths`` (per-image, pixels).
    """
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    names = list(class_names if class_names is not None else getattr(model, "module", model).class_names)
    detections, ground_truths = predict_dataset(model, loader, device=device, score_threshold=score_threshold,
                                                iou_threshold=iou_threshold, max_detections=max_detections,
                                                progress=progress)
    return {**evaluate_detections(detections, ground_truths, names, metric), "ground_truths": ground_truths}


def format_table(result: Mapping[str, Any], class_names: Sequence[str]) -> str:
    """Per-class table (class, AP, ground truths, detections) and the mean, as printed by ``ssd val``.

    AP is ``-`` for classes without ground truth (left out of the mean); a COCO result adds its six summary numbers.
    """
    per_class = result["per_class"]
    width = max([len("class"), len("all"), *(len(n) for n in class_names)])
    lines = [f"{'class':<{width}}  {'AP':>6}  {'num gt':>7}  {'num det':>8}"]
    for name in class_names:
        row = per_class[name]
        ap = float(row["ap"])
        lines.append(f"{name:<{width}}  {'-' if ap != ap else f'{ap:.4f}':>6}  {int(row['num_gt']):>7}  "
                     f"{int(row['num_det']):>8}")
    total_gt = sum(int(per_class[n]["num_gt"]) for n in class_names)
    total_det = sum(int(per_class[n]["num_det"]) for n in class_names)
    lines.append(f"{'all':<{width}}  {float(result['map']):>6.4f}  {total_gt:>7}  {total_det:>8}")
    metric = result.get("metric")
    if metric in METRICS:
        lines.append(f"mAP: {METRICS[metric]}")
    if metric == "coco":
        lines.append("  ".join(f"{key} {float(result[key]):.4f}" for key in COCO_STATS))
    return "\n".join(lines)


def save_coco_json(result: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path,
                   category_ids: Sequence[int] | Mapping[int, int] | None = None) -> Path:
    """Write the detections of an evaluation result (or a list of per-image detections) as a COCO results JSON.

    ``image_id`` is each image's dataset id (COCO id, or the file stem for VOC/YOLO); ``category_id`` the label
    unless ``category_ids`` maps labels to the dataset's original ids (see
    :func:`ssd.engine.metrics.to_coco_detections`).
    """
    detections = result["detections"] if isinstance(result, Mapping) else result
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(to_coco_detections(detections, category_ids=category_ids)))
    return path

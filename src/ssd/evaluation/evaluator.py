"""Evaluation, the one path for training's validation and ``ssd val``: predict a split, score it, print the table.

:func:`evaluate_split` predicts every batch of a loader (:func:`predict_dataset`), gathers the per-image results of
every rank under torchrun and scores them (:func:`score_detections`: VOC07, VOC or COCO); :func:`evaluate` does the
same for a checkpoint and a dataset (``ssd.evaluate``, ``ssd val``). The loader yields :func:`ssd.data.collate`
batches: ``images [B, 3, S, S]`` normalized, ``boxes [B, G, 4]`` xyxy normalized to the network input, ``labels
[B, G]`` (``-1`` padding), ``difficult [B, G]``, ``orig_sizes [B, 2]`` ``(h, w)``, ``paths``, ``image_ids``.
Predictions and ground truths are scaled by each image's original ``(w, h)`` to pixel xyxy (the evaluation
transform is a plain resize) and kept as plain lists of per-image dicts, which ranks can ``all_gather``. With
``tile`` (``ssd val --tile``), each image is also read from its file and predicted tile by tile
(:mod:`ssd.inference.tiling`), merged with the loader batch's detections, and scored by the same code.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm import tqdm

import ssd.distributed as ddp
from ssd._utils import render_table, unwrap_model
from ssd.boxes import pixel_scale
from ssd.data import build_dataloader
from ssd.data.images import read_image
from ssd.data.load import load_training_data
from ssd.data.records import ImageRecord
from ssd.device import autocast, prepare_model, resolve_device
from ssd.evaluation.metrics import COCO_STATS, evaluate_coco, evaluate_voc, to_coco_detections
from ssd.files import check_output, write_text
from ssd.inference.pipeline import detect_batch
from ssd.inference.tiling import TILE_OVERLAP, check_tile, detect_tiled
from ssd.models import model_from_checkpoint
from ssd.models.config import ModelConfig
from ssd.preprocess import preprocess
from ssd.training.run import plain_data_errors
from ssd.weights.checkpoint import CheckpointError
from ssd.weights.resolve import resolve_weights

__all__ = ["METRICS", "evaluate", "evaluate_split", "split_loader", "predict_dataset", "score_detections",
           "merge_results", "format_table", "save_coco_json"]

# metric name -> what it is
METRICS = {"voc07": "VOC AP@0.5, 2007 11-point interpolation", "voc": "VOC AP@0.5, 2010+ area under the curve",
           "coco": "COCO AP@[.5:.95] (pycocotools)"}


def _check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ValueError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def evaluate(weights: str | Path, data: str | Path, metric: str = "voc07", split: str = "val", *,
             batch_size: int = 16, workers: int = 0, device: str = "auto", score_threshold: float = 0.01,
             iou_threshold: float = 0.45, skip_invalid: bool = False, save_json: str | Path | None = None,
             tile: int | str | Sequence[int] | None = None, tile_overlap: float = TILE_OVERLAP) -> dict[str, Any]:
    """Evaluate a checkpoint on a dataset split (checked first, like training's data).

    Returns the dict of :func:`evaluate_split` plus ``class_names``; the numbers equal those of the end of training
    for the same split and thresholds. ``save_json`` also writes the detections in the COCO results format, with
    the dataset's own category ids where it has them (COCO). ``tile`` / ``tile_overlap``: tiled prediction (see
    :func:`predict_dataset`).
    """
    _check_metric(metric)
    check_tile(tile, tile_overlap)
    if save_json is not None:  # before any work, and again once the dataset's own files are known
        check_output(save_json, inputs=[weights, _weights_file(weights), data], what="--save-json")
    torch_device = resolve_device(device)
    model = model_from_checkpoint(weights)
    class_names = list(model.class_names)
    spec = load_training_data(data, skip_invalid=skip_invalid, class_names=class_names, splits=(split,))
    if save_json is not None:
        check_output(save_json, inputs=spec.input_files(), what="--save-json")
    model, channels_last = prepare_model(model, torch_device, None)
    loader = split_loader(spec.records(split), class_names, model.config, batch_size=batch_size, workers=workers)
    with plain_data_errors():
        result = evaluate_split(model, loader, class_names=class_names, metric=metric, device=torch_device,
                                channels_last=channels_last, score_threshold=score_threshold,
                                iou_threshold=iou_threshold, tile=tile, tile_overlap=tile_overlap)
    if save_json is not None:
        save_coco_json(result, save_json, category_ids=getattr(spec, "category_ids", None))
    return {**result, "class_names": class_names}


def split_loader(records: Sequence[ImageRecord], class_names: Sequence[str], model_config: ModelConfig, *,
                 batch_size: int, workers: int = 0, cache_images: bool = False,
                 info: ddp.DistInfo | None = None) -> DataLoader:
    """The evaluation loader of a split: no augmentation, every image once in order, difficult objects kept (and
    flagged); under torchrun each rank takes every ``world_size``-th image."""
    info = info or ddp.DistInfo()
    return build_dataloader(records, class_names, model_config.image_size, model_config.mean, model_config.std,
                            train=False, batch_size=batch_size, workers=workers, augment="none",
                            cache_images=cache_images, rank=info.rank, world_size=info.world_size)


def evaluate_split(model: nn.Module, loader: Iterable[dict[str, Any]], *, class_names: Sequence[str] | None = None,
                   metric: str = "voc07", device: torch.device | str | None = None, channels_last: bool = False,
                   score_threshold: float = 0.01, iou_threshold: float = 0.45, max_detections: int = 200,
                   amp_dtype: torch.dtype | None = None, progress: bool = False,
                   tile: int | str | Sequence[int] | None = None, tile_overlap: float = TILE_OVERLAP
                   ) -> dict[str, Any]:
    """Predict this rank's share of a split (:func:`predict_dataset`), gather every rank's per-image results and
    score the full set with ``metric`` (identical metrics on every rank).

    ``model`` may be wrapped (DDP, ``torch.compile``): the plain module runs, because a DDP forward syncs buffers,
    a collective that ranks with different numbers of batches would not all join. ``class_names`` defaults to the
    model's; ``iou_threshold`` is the NMS overlap (the metric's match threshold is fixed by ``metric``); ``tile``:
    see :func:`predict_dataset`.

    Returns the dict of :func:`score_detections` plus ``ground_truths`` (per image, pixels).
    """
    _check_metric(metric)
    model = unwrap_model(model)
    names = list(class_names if class_names is not None else model.class_names)
    detections, ground_truths = predict_dataset(model, loader, device=device, score_threshold=score_threshold,
                                                iou_threshold=iou_threshold, max_detections=max_detections,
                                                channels_last=channels_last, amp_dtype=amp_dtype, progress=progress,
                                                tile=tile, tile_overlap=tile_overlap)
    gathered = ddp.all_gather_objects((detections, ground_truths))
    ground_truths = merge_results([g for _, g in gathered])
    result = score_detections(merge_results([d for d, _ in gathered]), ground_truths, names, metric)
    return {**result, "ground_truths": ground_truths}


def predict_dataset(model: nn.Module, loader: Iterable[dict[str, Any]], *, device: torch.device | str | None = None,
                    score_threshold: float = 0.01, iou_threshold: float = 0.45, max_detections: int = 200,
                    channels_last: bool = False, amp_dtype: torch.dtype | None = None, progress: bool = True,
                    tile: int | str | Sequence[int] | None = None, tile_overlap: float = TILE_OVERLAP
                    ) -> tuple[list[dict[str, Any]], list[dict[str, Tensor]]]:
    """Detections and ground truths of every image of ``loader``, in pixel xyxy of the original images.

    ``model`` maps ``images [B, 3, S, S]`` to ``(loc [B, P, 4], logits [B, P, K+1])`` and has ``priors [P, 4]`` and
    ``config.variances``; it runs in eval mode under ``torch.inference_mode`` (autocast to ``amp_dtype`` when
    given) and its train/eval mode is restored after.

    ``tile`` (``None``, ``"auto"``, ``N`` or ``(h, w)`` pixels): also predict on overlapping tiles of each original
    image, read from its file (the loader's images are resized), and merge them with the loader batch's detections
    (:func:`ssd.inference.tiling.detect_tiled`); a split none of whose images is tiled gives the plain result.

    Returns:
        ``(detections, ground_truths)``, one dict per image in loader order, on the CPU. Detections:
        ``boxes [N, 4]`` float32, ``scores [N]``, ``labels [N]`` int64 ``0..K-1``, ``image_id``, ``path``.
        Ground truths: ``boxes [M, 4]``, ``labels [M]``, ``difficult [M]`` bool (padding removed).
    """
    device = torch.device(device) if device is not None else unwrap_model(model).priors.device
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    was_training = model.training
    model.eval()
    options = dict(score_threshold=score_threshold, iou_threshold=iou_threshold, max_detections=max_detections)
    detections: list[dict[str, Any]] = []
    ground_truths: list[dict[str, Tensor]] = []
    try:
        with tqdm(loader, desc="evaluate", unit="batch", disable=not progress, leave=False) as bar:
            for batch in bar:
                images = batch["images"].to(device, non_blocking=True).contiguous(memory_format=memory_format)
                with torch.inference_mode(), autocast(device, amp_dtype):
                    outputs = detect_batch(model, images, batch["orig_sizes"].to(device), **options)
                    if tile is not None:
                        outputs = _add_tiles(model, outputs, batch["paths"], options, tile, tile_overlap,
                                             device, memory_format)
                for out, image_id, path in zip(outputs, batch["image_ids"], batch["paths"]):
                    detections.append({**{k: out[k].cpu().clone() for k in ("boxes", "scores", "labels")},
                                       "image_id": image_id, "path": path})
                ground_truths += _ground_truths(batch, pixel_scale(batch["orig_sizes"]))
    finally:
        model.train(was_training)
    return detections, ground_truths


def _add_tiles(model: nn.Module, whole: list[dict[str, Tensor]], paths: Sequence[str], options: dict[str, Any],
               tile: int | str | Sequence[int], overlap: float, device: torch.device,
               memory_format: torch.memory_format) -> list[dict[str, Tensor]]:
    """The loader batch's detections (``whole``) merged with those of the tiles of each image, read from its file
    and run through :func:`ssd.preprocess.preprocess` and :func:`detect_batch` as many crops at a time as the
    batch has images."""
    config = unwrap_model(model).config

    def run(crops: list[Tensor]) -> list[dict[str, Tensor]]:
        batch, sizes = preprocess(crops, config.image_size, config.mean, config.std, device=device)
        return detect_batch(model, batch.contiguous(memory_format=memory_format), sizes.to(device), **options)

    return detect_tiled(run, [read_image(path) for path in paths], tile=tile, input_size=config.image_size,
                        overlap=overlap, iou_threshold=options["iou_threshold"],
                        max_detections=options["max_detections"], batch_size=len(paths), whole=whole)


def _ground_truths(batch: Mapping[str, Any], scale: Tensor) -> list[dict[str, Tensor]]:
    """The batch's objects per image (padding removed), boxes scaled to pixels by ``scale [B, 4]``."""
    valid = batch["labels"] >= 0  # [B, G]
    gt_boxes = (batch["boxes"].float() * scale[:, None])[valid]
    sizes = valid.sum(dim=1).tolist()
    return [{"boxes": b, "labels": lab, "difficult": dif} for b, lab, dif in
            zip(gt_boxes.split(sizes), batch["labels"][valid].split(sizes), batch["difficult"][valid].split(sizes))]


def merge_results(parts: Sequence[Sequence[Any]]) -> list[Any]:
    """Join per-rank lists of per-image dicts (e.g. from ``all_gather_object``) into one list, rank by rank."""
    return [item for part in parts for item in part]


def score_detections(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                     class_names: Sequence[str], metric: str = "voc07", *, verbose: bool = False) -> dict[str, Any]:
    """Score per-image detections with ``metric`` (a key of :data:`METRICS`).

    Returns the dict of :func:`ssd.evaluation.metrics.evaluate_voc` (``voc07``, ``voc``: AP@0.5) or
    :func:`~ssd.evaluation.metrics.evaluate_coco` (``coco``), always with ``map`` (the headline number) and
    ``per_class``, plus ``metric`` and ``detections`` (the list given, for :func:`save_coco_json` and drawing).
    """
    _check_metric(metric)
    if metric == "coco":
        result = evaluate_coco(detections, ground_truths, len(class_names), class_names, verbose=verbose)
    else:
        result = evaluate_voc(detections, ground_truths, len(class_names), class_names,
                              use_07_metric=metric == "voc07")
    return {"metric": metric, **result, "detections": list(detections)}


def format_table(result: Mapping[str, Any], class_names: Sequence[str]) -> str:
    """Per-class table (class, AP, ground truths, detections) and the mean, as printed by ``ssd val``.

    AP is ``-`` for classes without ground truth (left out of the mean); a COCO result adds its six summary numbers.
    """
    per_class = result["per_class"]
    rows = []
    for name in class_names:
        ap = float(per_class[name]["ap"])
        rows.append([name, "-" if ap != ap else f"{ap:.4f}", int(per_class[name]["num_gt"]),
                     int(per_class[name]["num_det"])])
    rows.append(["all", f"{float(result['map']):.4f}", sum(row[2] for row in rows), sum(row[3] for row in rows)])
    lines = render_table(["class", "AP", "num gt", "num det"], rows)
    metric = result.get("metric")
    if metric in METRICS:
        lines.append(f"mAP: {METRICS[metric]}")
    if metric == "coco":
        lines.append("  ".join(f"{key} {float(result[key]):.4f}" for key in COCO_STATS))
    return "\n".join(lines)


def save_coco_json(result: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path,
                   category_ids: Sequence[int] | Mapping[int, int] | None = None) -> Path:
    """Write the detections of an evaluation result (or a list of per-image detections) as a COCO results JSON.

    ``image_id`` is each image's dataset id (COCO id, or the file stem for VOC/YOLO); ``category_id`` is
    ``category_ids[label]`` (the dataset's own ids, e.g. COCO's 1, 5, 90), else the label
    (see :func:`ssd.evaluation.metrics.to_coco_detections`).
    """
    detections = result["detections"] if isinstance(result, Mapping) else result
    return write_text(path, json.dumps(to_coco_detections(detections, category_ids=category_ids)))


def _weights_file(weights: str | Path) -> Path | None:
    """The checkpoint a run directory stands for (to protect it from ``--save-json``), or ``None``."""
    try:
        return resolve_weights(weights)
    except CheckpointError:
        return None

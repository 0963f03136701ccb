"""Evaluation, the one path for training's validation and ``ssd val``: predict a split, score it, print the table.

:func:`evaluate_split` predicts every batch of a loader (:func:`predict_dataset`) with a module or any backend,
gathers the per-image results of every rank on rank 0 under torchrun and scores them there, once
(:func:`score_detections`: VOC07, VOC or COCO); :func:`evaluate` does the same for anything
:func:`ssd.inference.backends.open_backend` opens (a checkpoint, a run directory, an exported ``.onnx``) and a
dataset (``ssd.evaluate``, ``ssd val``). The loader yields :func:`ssd.data.collate` batches: ``images [B, 3, S, S]``
normalized, ``boxes [B, G, 4]`` xyxy normalized to the network input, ``labels [B, G]`` (``-1`` padding),
``difficult [B, G]``, ``orig_sizes [B, 2]`` ``(h, w)``, ``paths``, ``image_ids``. Predictions and ground truths are
scaled by each image's original ``(w, h)`` to pixel xyxy (the evaluation transform is a plain resize) and kept as
plain lists of per-image dicts, which ranks send to rank 0 as tensors (:mod:`ssd.evaluation.gather`). With ``tile``
(``ssd val --tile``), each image is also read from its file and predicted tile by tile
(:mod:`ssd.inference.tiling`), merged with the loader batch's detections, and scored by the same code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader

import ssd.distributed as ddp
from ssd.boxes import pixel_scale
from ssd.card import ModelCard
from ssd.data import build_dataloader
from ssd.data.gate import load_training_data
from ssd.data.images import read_image
from ssd.data.records import ImageRecord
from ssd.detect import detect_batch, model_input
from ssd.device import autocast
from ssd.errors import CheckpointError, ConfigError
from ssd.evaluation.coco import COCO_STATS, evaluate_coco
from ssd.evaluation.gather import gather_on_main
from ssd.evaluation.metrics import evaluate_voc
from ssd.files import check_output, write_text
from ssd.inference.backends import Backend, open_backend
from ssd.inference.coco_results import to_coco_detections
from ssd.inference.tiling import detect_tiled
from ssd.inference.tta import detect_tta
from ssd.log import progress as progress_bar
from ssd.models.config import ModelConfig
from ssd.nn import unwrap_model
from ssd.preprocess import preprocess
from ssd.schemas import ValConfig
from ssd.settings import EVALUATE, TILE_OVERLAP, check_thresholds, check_tile
from ssd.text import render_table
from ssd.weights.resolve import resolve_weights

__all__ = ["METRICS", "evaluate", "evaluate_split", "split_loader", "predict_dataset", "score_detections",
           "format_table", "save_coco_json", "check_metric"]

# metric name -> what it is
METRICS = {"voc07": "VOC AP@0.5, 2007 11-point interpolation", "voc": "VOC AP@0.5, 2010+ area under the curve",
           "coco": "COCO AP@[.5:.95] (pycocotools)"}


def check_metric(metric: str) -> None:
    if metric not in METRICS:
        raise ConfigError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")


def evaluate(weights: str | Path | nn.Module | Backend, data: str | Path, metric: str = ValConfig.metric,
             split: str = ValConfig.split, *, batch_size: int = ValConfig.batch_size, workers: int = ValConfig.workers,
             device: str = ValConfig.device, score_threshold: float = ValConfig.score_threshold,
             iou_threshold: float = ValConfig.iou_threshold, max_detections: int = ValConfig.max_detections,
             skip_invalid: bool = False, save_json: str | Path | None = None,
             tile: int | str | Sequence[int] | None = None, tile_overlap: float = ValConfig.tile_overlap,
             report: bool = False, project: str | Path | None = None, name: str = ValConfig.name,
             exist_ok: bool = False, recheck: bool = False, tta: bool = False) -> dict[str, Any]:
    """Evaluate a network on a dataset split (checked first, like training's data; ``recheck``: every file read and
    decoded again instead of trusting the dataset index).

    ``weights``: anything :func:`ssd.inference.backends.open_backend` opens (a checkpoint, a run directory, an
    exported ``.onnx``, a module, a backend), run on ``device``. Thresholds default to :data:`ssd.settings.EVALUATE`.

    Returns the dict of :func:`evaluate_split` plus ``class_names``; the numbers equal those of the end of training
    for the same split and thresholds. ``save_json`` also writes the detections in the COCO results format, with
    the dataset's own category ids where it has them (COCO). ``tile`` / ``tile_overlap``: tiled prediction (see
    :func:`predict_dataset`). ``tta``: test-time augmentation (:mod:`ssd.inference.tta`).
    ``report`` adds ``report`` (:func:`ssd.evaluation.report.build_report`); ``project``
    also writes it to a new run directory ``project/name`` (``name2``, ... when taken; ``project/name`` itself with
    ``exist_ok``), returned as ``run_dir``: ``ssd val`` is ``evaluate(..., report=True, project="runs/val")``, with
    the defaults of :class:`ssd.schemas.ValConfig`, which are this function's.

    Under ``torchrun`` (CPU processes join with gloo, GPUs with NCCL, each on its ``LOCAL_RANK``'s device, and stay
    in the process group until they exit: see :meth:`ssd.inference.shards.Shard.join`) each rank predicts every
    ``world_size``-th image and rank 0 scores them all, once, and writes ``save_json`` and the report; the other
    ranks return the same numbers without the detections, ground truths and report.
    """
    check_metric(metric)
    check_thresholds(score_threshold, iou_threshold, max_detections, batch_size)
    check_tile(tile, tile_overlap)
    if save_json is not None:  # before any work, and again once the dataset's own files are known
        check_output(save_json, inputs=[*_weights_files(weights), data], what="--save-json")
    info, device, _ = ddp.setup(device)
    backend = open_backend(weights, device)
    class_names = list(backend.card.class_names)
    spec = load_training_data(data, skip_invalid=skip_invalid, class_names=class_names, splits=(split,),
                              recheck=recheck)
    if save_json is not None:
        check_output(save_json, inputs=spec.input_files(), what="--save-json")
    loader = split_loader(spec.records(split), class_names, backend.card, batch_size=batch_size, workers=workers,
                          info=info)
    result = evaluate_split(backend, loader, class_names=class_names, metric=metric, score_threshold=score_threshold,
                            iou_threshold=iou_threshold, max_detections=max_detections, tile=tile,
                            tile_overlap=tile_overlap, tta=tta)
    category_ids = getattr(spec, "category_ids", None)
    result = {**result, "class_names": class_names}
    if not info.is_main:
        return result
    if save_json is not None:
        save_coco_json(result, save_json, category_ids=category_ids)
    if report or project is not None:
        from ssd.evaluation.report import attach_report  # matplotlib: only when a report is asked for

        attach_report(result, backend.priors, data, split, category_ids, project, name, backend.card.model_name,
                      exist_ok=exist_ok)
    return result


def split_loader(records: Sequence[ImageRecord], class_names: Sequence[str], inputs: ModelConfig | ModelCard, *,
                 batch_size: int, workers: int = 0, cache_images: bool | str | None = False,
                 info: ddp.DistInfo | None = None) -> DataLoader:
    """The evaluation loader of a split for a network whose input is described by ``inputs`` (``image_size``,
    ``mean``, ``std``: a model configuration or a model card): no augmentation, every image once in order, difficult
    objects kept (and flagged); under torchrun each rank takes every ``world_size``-th image."""
    info = info or ddp.DistInfo()
    return build_dataloader(records, class_names, inputs.image_size, inputs.mean, inputs.std, train=False,
                            batch_size=batch_size, workers=workers, augment="none", cache_images=cache_images,
                            rank=info.rank, world_size=info.world_size)


def evaluate_split(network: nn.Module | Backend, loader: Iterable[dict[str, Any]], *,
                   class_names: Sequence[str] | None = None, metric: str = ValConfig.metric,
                   device: torch.device | str | None = None, channels_last: bool = False,
                   score_threshold: float = EVALUATE.score_threshold, iou_threshold: float = EVALUATE.iou_threshold,
                   max_detections: int = EVALUATE.max_detections, amp_dtype: torch.dtype | None = None,
                   progress: bool = False, tile: int | str | Sequence[int] | None = None,
                   tile_overlap: float = TILE_OVERLAP, tta: bool = False) -> dict[str, Any]:
    """Predict this rank's share of a split (:func:`predict_dataset`), gather every rank's per-image results on rank 0
    in the split's order (rank ``r`` of ``W`` holds images ``r, r + W, ...``, as :func:`split_loader` deals them) and
    score the full set there, once, with ``metric``; the other ranks receive rank 0's numbers (identical metrics on
    every rank) with empty ``detections`` and ``ground_truths``: no rank but 0 holds the whole split's results.

    ``network``: an SSD module or a backend. A module may be wrapped (DDP, ``torch.compile``): the plain module
    runs, because a DDP forward syncs buffers, a collective that ranks with different numbers of batches would not
    all join. ``class_names`` defaults to the network's; ``tile``, ``tta``: see :func:`predict_dataset`.

    Returns the dict of :func:`score_detections` plus ``ground_truths`` (per image, pixels) and the post-processing
    settings: ``score_threshold``, ``nms_iou_threshold``, ``max_detections`` (the metric's own IoU for matching a
    detection to an object is ``match_iou_threshold``).
    """
    check_metric(metric)
    network = unwrap_model(network) if isinstance(network, nn.Module) else network
    names = list(class_names if class_names is not None else (
        network.class_names if isinstance(network, nn.Module) else network.card.class_names))
    detections, ground_truths = predict_dataset(network, loader, device=device, score_threshold=score_threshold,
                                                iou_threshold=iou_threshold, max_detections=max_detections,
                                                channels_last=channels_last, amp_dtype=amp_dtype, progress=progress,
                                                tile=tile, tile_overlap=tile_overlap, tta=tta)
    gathered = gather_on_main(detections, ground_truths)  # on rank 0; None on the others

    def score() -> dict[str, Any]:
        return {**score_detections(gathered[0], gathered[1], names, metric), "ground_truths": gathered[1],
                "score_threshold": float(score_threshold), "nms_iou_threshold": float(iou_threshold),
                "max_detections": max_detections}

    # the other ranks get rank 0's scores without the per-image results (and are not left waiting if it fails)
    return ddp.leader_first(score, lambda result: {**result, "detections": [], "ground_truths": []}, lambda sent: sent)


def predict_dataset(network: nn.Module | Backend, loader: Iterable[dict[str, Any]], *,
                    device: torch.device | str | None = None, score_threshold: float = EVALUATE.score_threshold,
                    iou_threshold: float = EVALUATE.iou_threshold, max_detections: int = EVALUATE.max_detections,
                    channels_last: bool = False, amp_dtype: torch.dtype | None = None, progress: bool = True,
                    tile: int | str | Sequence[int] | None = None, tile_overlap: float = TILE_OVERLAP,
                    tta: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Tensor]]]:
    """Detections and ground truths of every image of ``loader``, in pixel xyxy of the original images, each batch
    through :func:`ssd.detect.detect_batch`.

    ``network``: a backend (run as it is: its device, memory format and precision), or a module mapping
    ``images [B, 3, S, S]`` to ``(loc [B, P, 4], logits [B, P, K+1])`` with ``priors [P, 4]`` and
    ``config.variances``: it runs on ``device`` (default: where its priors are) in eval mode under
    ``torch.inference_mode``, channels-last inputs with ``channels_last``, autocast to ``amp_dtype`` when given, and
    its train/eval mode is restored after.

    ``tile`` (``None``, ``"auto"``, ``N`` or ``(h, w)`` pixels): also predict on overlapping tiles of each original
    image, read from its file (the loader's images are resized), and merge them with the loader batch's detections
    (:func:`ssd.inference.tiling.detect_tiled`); a split none of whose images is tiled gives the plain result.
    ``tta``: every batch (and tile) also seen mirrored and shrunk, the boxes fused (:mod:`ssd.inference.tta`).

    Returns:
        ``(detections, ground_truths)``, one dict per image in loader order, on the CPU. Detections:
        ``boxes [N, 4]`` float32, ``scores [N]``, ``labels [N]`` int64 ``0..K-1``, ``image_id``, ``path``.
        Ground truths: ``boxes [M, 4]``, ``labels [M]``, ``difficult [M]`` bool (padding removed), ``image_size``
        ``(h, w)``.
    """
    module = network if isinstance(network, nn.Module) else None
    if device is not None:
        device = torch.device(device)
    else:
        device = unwrap_model(module).priors.device if module is not None else network.device
    was_training = module is not None and module.training
    if module is not None:
        module.eval()
    run = _BatchRunner(network, device, channels_last, amp_dtype,
                       dict(score_threshold=score_threshold, iou_threshold=iou_threshold,
                            max_detections=max_detections), tta)
    detections: list[dict[str, Any]] = []
    ground_truths: list[dict[str, Tensor]] = []
    try:
        with progress_bar(loader, desc="evaluate", unit="batch", disable=not progress, leave=False) as bar:
            for batch in bar:
                outputs = run(batch["images"], batch["orig_sizes"])
                if tile is not None:
                    outputs = run.add_tiles(outputs, batch["paths"], tile, tile_overlap)
                for out, image_id, path in zip(outputs, batch["image_ids"], batch["paths"]):
                    detections.append({**{k: out[k].cpu().clone() for k in ("boxes", "scores", "labels")},
                                       "image_id": image_id, "path": path})
                ground_truths += _ground_truths(batch, pixel_scale(batch["orig_sizes"]))
    finally:
        if module is not None:
            module.train(was_training)
    return detections, ground_truths


class _BatchRunner:
    """:func:`ssd.detect.detect_batch` of one network with the settings of :func:`predict_dataset`."""

    def __init__(self, network: nn.Module | Backend, device: torch.device, channels_last: bool,
                 amp_dtype: torch.dtype | None, options: dict[str, Any], tta: bool = False):
        self.network, self.device, self.channels_last, self.amp_dtype = network, device, channels_last, amp_dtype
        self.options, self.tta = options, tta
        self.is_module = isinstance(network, nn.Module)
        self.inputs = network.config if self.is_module else network.card  # image_size, mean, std

    def __call__(self, images: Tensor, sizes: Tensor) -> list[dict[str, Tensor]]:
        """``images [B, 3, S, S]`` normalized, ``sizes [B, 2]`` ``(h, w)`` -> detections in pixels."""
        images = images.to(self.device, non_blocking=True)
        if self.is_module:
            images = model_input(images, self.channels_last)
        with torch.inference_mode(), autocast(self.device, self.amp_dtype if self.is_module else None):
            if self.tta:
                return detect_tta(self._network, images, sizes.to(self.device), **self.options)
            return self._network(images, sizes.to(self.device))

    def _network(self, images: Tensor, sizes: Tensor) -> list[dict[str, Tensor]]:
        return detect_batch(self.network, images, sizes, **self.options)

    def add_tiles(self, whole: list[dict[str, Tensor]], paths: Sequence[str], tile: int | str | Sequence[int],
                  overlap: float) -> list[dict[str, Tensor]]:
        """The loader batch's detections (``whole``) merged with those of the tiles of each image, read from its
        file and run through :func:`ssd.preprocess.preprocess` as many crops at a time as the batch has images."""
        inputs = self.inputs

        def run(crops: list[Tensor]) -> list[dict[str, Tensor]]:
            return self(*preprocess(crops, inputs.image_size, inputs.mean, inputs.std, device=self.device))

        return detect_tiled(run, [read_image(path) for path in paths], tile=tile, input_size=inputs.image_size,
                            overlap=overlap, iou_threshold=self.options["iou_threshold"],
                            max_detections=self.options["max_detections"], batch_size=len(paths), whole=whole)


def _ground_truths(batch: Mapping[str, Any], scale: Tensor) -> list[dict[str, Tensor]]:
    """The batch's objects per image (padding removed), boxes scaled to pixels by ``scale [B, 4]``."""
    valid = batch["labels"] >= 0  # [B, G]
    gt_boxes = (batch["boxes"].float() * scale[:, None])[valid]
    sizes = valid.sum(dim=1).tolist()
    image_sizes = [tuple(hw) for hw in batch["orig_sizes"].tolist()]
    return [{"boxes": b, "labels": lab, "difficult": dif, "image_size": hw} for b, lab, dif, hw in
            zip(gt_boxes.split(sizes), batch["labels"][valid].split(sizes), batch["difficult"][valid].split(sizes),
                image_sizes)]


def score_detections(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                     class_names: Sequence[str], metric: str = "voc07", *, verbose: bool = False) -> dict[str, Any]:
    """Score per-image detections with ``metric`` (a key of :data:`METRICS`).

    Returns the dict of :func:`ssd.evaluation.metrics.evaluate_voc` (``voc07``, ``voc``: AP@0.5) or
    :func:`~ssd.evaluation.coco.evaluate_coco` (``coco``), always with ``map`` (the headline number) and
    ``per_class``, plus ``metric`` and ``detections`` (the list given, for :func:`save_coco_json` and drawing).
    """
    check_metric(metric)
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
    (see :func:`ssd.inference.coco_results.to_coco_detections`).
    """
    detections = result["detections"] if isinstance(result, Mapping) else result
    return write_text(path, json.dumps(to_coco_detections(detections, category_ids=category_ids)))


def _weights_files(weights: Any) -> list[Path]:
    """The files ``weights`` names (a path and, for a run directory, its checkpoint): kept from ``--save-json``."""
    if not isinstance(weights, (str, os.PathLike)):
        return []
    try:
        return [Path(weights), resolve_weights(weights)]
    except CheckpointError:
        return [Path(weights)]

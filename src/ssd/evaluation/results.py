"""Ground truths of dataset records, and detections read from a COCO results file, in the per-image form every
metric of :mod:`ssd.evaluation` takes; :func:`evaluate_detections` scores such a file (``ssd val --detections``)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from ssd._utils import few
from ssd.data.gate import load_training_data
from ssd.data.records import ImageRecord
from ssd.evaluation.evaluator import check_metric, score_detections
from ssd.evaluation.report import attach_report

__all__ = ["ground_truths_from_records", "detections_from_coco_results", "evaluate_detections"]

_RESULT_KEYS = {"image_id", "category_id", "bbox", "score"}


def ground_truths_from_records(records: Sequence[ImageRecord]) -> list[dict[str, Any]]:
    """One dict per record: ``boxes [M, 4]`` float32 pixel xyxy, ``labels [M]`` int64, ``difficult [M]`` bool
    (VOC difficult or COCO crowd: ignored by evaluation), ``image_size`` ``(h, w)`` and ``image_id``.

    Records must have their ``width`` / ``height`` (as the readers give them).
    """
    out = []
    for record in records:
        if record.width is None or record.height is None:
            raise ValueError(f"{record.path}: image size unknown (read the dataset with ssd.data.load_dataset)")
        out.append({"boxes": torch.tensor([o.box for o in record.objects], dtype=torch.float32).reshape(-1, 4),
                    "labels": torch.tensor([o.label for o in record.objects], dtype=torch.int64),
                    "difficult": torch.tensor([o.ignore for o in record.objects], dtype=torch.bool),
                    "image_size": (record.height, record.width), "image_id": record.image_id})
    return out


def detections_from_coco_results(results: str | Path | Sequence[Mapping[str, Any]], records: Sequence[ImageRecord],
                                 num_classes: int, category_ids: Sequence[int] | None = None
                                 ) -> list[dict[str, Any]]:
    """Per-image detections (one dict per record, in record order; ``boxes [N, 4]`` pixel xyxy, ``scores [N]``,
    ``labels [N]``, ``image_id``, ``path``) of a COCO results list or JSON file (``image_id``, ``category_id``,
    ``bbox`` ``[x, y, w, h]``, ``score``).

    ``category_ids``: the dataset's category id of each label (COCO); default the labels ``0..K-1`` themselves.
    Raises ValueError naming the first image ids and category ids that are not the dataset's.
    """
    source = str(results) if isinstance(results, (str, Path)) else "detections"
    if isinstance(results, (str, Path)):
        results = json.loads(Path(results).read_text())
    if not isinstance(results, list):
        raise ValueError(f"{source}: a COCO results file is a JSON list of detections, got {type(results).__name__}")
    for i, item in enumerate(results):
        if not (isinstance(item, Mapping) and item.keys() >= _RESULT_KEYS and isinstance(item["bbox"], list)
                and len(item["bbox"]) == 4):
            raise ValueError(f"{source}: detection {i} is not a COCO result dict(image_id, category_id, "
                             f"bbox=[x, y, w, h], score): {str(item)[:80]}")
    index = {str(r.image_id): i for i, r in enumerate(records)}
    label_of = ({int(c): k for k, c in enumerate(category_ids)} if category_ids is not None
                else {k: k for k in range(num_classes)})
    unknown_images = sorted({str(d.get("image_id")) for d in results} - set(index))
    if unknown_images:
        raise ValueError(f"{source}: {len(unknown_images)} image id(s) are not images of the split: "
                         f"{few(unknown_images)} (the split's ids look like {few(list(index)[:3])})")
    unknown_categories = sorted({d.get("category_id") for d in results if d.get("category_id") not in label_of},
                                key=str)
    if unknown_categories:
        expected = few([str(c) for c in label_of]) if category_ids is not None else f"0..{num_classes - 1}"
        raise ValueError(f"{source}: category id(s) {few([str(c) for c in unknown_categories])} are not the "
                         f"dataset's ({expected})")
    rows: list[list[Mapping[str, Any]]] = [[] for _ in records]
    for item in results:
        rows[index[str(item["image_id"])]].append(item)
    out = []
    for record, items in zip(records, rows):
        xywh = torch.tensor([d["bbox"] for d in items], dtype=torch.float32).reshape(-1, 4)
        labels = [label_of[d["category_id"]] for d in items]
        out.append({"boxes": torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1),
                    "scores": torch.tensor([float(d["score"]) for d in items], dtype=torch.float32),
                    "labels": torch.tensor(labels, dtype=torch.int64), "image_id": record.image_id,
                    "path": str(record.path)})
    return out


def evaluate_detections(results: str | Path | Sequence[Mapping[str, Any]], data: str | Path, metric: str = "voc07",
                        split: str = "val", *, skip_invalid: bool = False, report: bool = False,
                        project: str | Path | None = None, name: str = "exp") -> dict[str, Any]:
    """Score detections already made (a COCO results file or list, e.g. ``ssd val --save-json`` or another tool's,
    with the dataset's own category ids) against a split, as :func:`evaluate` scores a network's; ``report`` /
    ``project`` as there (no default-box coverage: there is no model). Image and category ids that are not the
    dataset's are refused, naming the first ones
    (:func:`ssd.evaluation.results.detections_from_coco_results`)."""
    check_metric(metric)
    spec = load_training_data(data, skip_invalid=skip_invalid, splits=(split,))
    records, class_names = spec.records(split), list(spec.class_names)
    category_ids = getattr(spec, "category_ids", None)
    truths = ground_truths_from_records(records)
    detections = detections_from_coco_results(results, records, len(class_names), category_ids)
    result = {**score_detections(detections, truths, class_names, metric), "ground_truths": truths,
              "class_names": class_names}
    if report or project is not None:
        attach_report(result, None, data, split, category_ids, project, name)
    return result

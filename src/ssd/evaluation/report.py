"""The evaluation report of ``ssd val``: every number of one split, printed and written to a run directory.

A run directory (``runs/val/exp``, ``exp2``, ... never overwritten: :func:`ssd.files.make_run_dir`) holds::

    metrics.json         every number: VOC07 / VOC / COCO (twelve statistics, per class, per size), operating
                         point (P/R/F1 curves, best-F1 confidence), confusion matrix, TIDE errors and their sources
    detections.json      the detections in the COCO results format with the dataset's own category ids
    pr_curves.png, confidence_curves.png, confusion.png, confusion_normalized.png
    worst/               the images with the most errors, drawn (detections by type, missed objects)
    report.html          one page with all of it (works offline from the directory)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ssd.data.images import read_image
from ssd.errors import DataError
from ssd.evaluation.coco import COCO_STATS, evaluate_coco
from ssd.evaluation.confusion import confusion_matrix
from ssd.evaluation.curves import operating_point
from ssd.evaluation.diagnosis import error_sources
from ssd.evaluation.figures import BOX_KINDS, draw_errors, gallery_tags, plot_confidence_curves, plot_confusion
from ssd.evaluation.html import render_report_html
from ssd.evaluation.metrics import evaluate_voc
from ssd.evaluation.tide import DETECTION_TYPES, ERROR_TYPES, OBJECT_STATES, error_breakdown
from ssd.files import fitted_name, make_run_dir, write_text
from ssd.inference.coco_results import to_coco_detections
from ssd.plots import plot_pr_curves, save_image
from ssd.settings import PREDICT
from ssd.text import render_table

__all__ = ["build_report", "write_report", "attach_report", "format_report", "worst_images"]


def _curve_free(row: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in ("precision", "recall")}


def build_report(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                 class_names: Sequence[str], *, priors: Tensor | None = None, data: str = "", split: str = "",
                 model: str | None = None) -> dict[str, Any]:
    """Every number of the report of one split (plain Python and NumPy values; see the module docstring).

    Inputs are the per-image dicts of :mod:`ssd.evaluation.metrics` (ground truths with ``image_size`` for the size
    buckets). ``priors [P, 4]`` (the model's default boxes, cxcywh normalized) add default-box coverage to the
    error sources; ``model`` (its name) completes the advice's ``ssd check`` command. The confusion matrix is taken
    at the best-F1 confidence (the settings' predict default when there is none). Raises ValueError for an empty
    split.
    """
    if not ground_truths:
        raise DataError(f"split {split or '?'} of {data or 'the dataset'} has no images: nothing to evaluate")
    k = len(class_names)
    voc07 = evaluate_voc(detections, ground_truths, k, class_names, use_07_metric=True)
    voc = evaluate_voc(detections, ground_truths, k, class_names)
    coco = evaluate_coco(detections, ground_truths, k, class_names)
    point = operating_point(detections, ground_truths, k, class_names)
    best = point["overall"]["best"]
    confidence = best["confidence"] if best is not None else PREDICT.score_threshold
    confusion = confusion_matrix(detections, ground_truths, k, class_names, confidence=confidence)
    errors = error_breakdown(detections, ground_truths, k, class_names)
    sized = all("image_size" in g for g in ground_truths)
    sources = error_sources(ground_truths, errors, priors, data=data or None, model=model) if sized else None
    absent = [name for name in class_names if coco["per_class"][name]["num_gt"] == 0]
    advice = [group["advice"] for group in (sources or {}).values() if group["advice"]]
    if absent:
        advice.insert(0, f"{len(absent)} class(es) have no objects in this split and are left out of every mean: "
                         f"{', '.join(absent)}")
    return {
        "data": str(data), "split": split, "class_names": list(class_names), "num_images": len(ground_truths),
        "num_objects": int(sum(int((~torch.as_tensor(g["difficult"]).bool()).sum()) for g in ground_truths)),
        "num_detections": int(sum(len(d["labels"]) for d in detections)), "absent_classes": absent,
        "voc07": {"map": voc07["map"], "per_class": {n: _curve_free(r) for n, r in voc07["per_class"].items()}},
        "voc": {"map": voc["map"], "per_class": {n: _curve_free(r) for n, r in voc["per_class"].items()}},
        "coco": {"stats": {key: coco[key] for key in COCO_STATS}, "AP": coco["AP"], "backend": coco["backend"],
                 "per_class": {n: _curve_free(r) for n, r in coco["per_class"].items()}, "by_size": coco["by_size"]},
        "operating_point": point, "confusion": confusion,
        "errors": {key: errors[key] for key in ("map", "foreground_iou", "background_iou", "errors")},
        "error_sources": sources, "advice": advice,
        "_per_image": {"detection_type": errors["detection_type"], "object_state": errors["object_state"]},
        "_pr": voc,
    }


def worst_images(report: Mapping[str, Any], k: int) -> list[int]:
    """Indices of the ``k`` images with the most errors (false-positive detections plus missed objects), most
    first (image order on ties), images without errors left out."""
    per_image = report["_per_image"]
    fp_codes = torch.tensor([DETECTION_TYPES.index(t) for t in DETECTION_TYPES[2:]])
    counts = torch.tensor([int(torch.isin(d, fp_codes).sum()) + int((s == OBJECT_STATES.index("missed")).sum())
                           for d, s in zip(per_image["detection_type"], per_image["object_state"])])
    order = torch.argsort(-counts, stable=True)[:k]
    return [int(i) for i in order if counts[i] > 0]


def _plain(value: Any) -> Any:
    """JSON-able copy: arrays and tensors as lists, NaN as null (a class without objects has no AP)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items() if not str(k).startswith("_")}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, Tensor)):
        return _plain(value.tolist())
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else round(float(value), 6)
    if isinstance(value, np.integer):
        return int(value)
    return value


def _draw_worst(report: Mapping[str, Any], run_dir: Path, detections: Sequence[Mapping[str, Any]],
                ground_truths: Sequence[Mapping[str, Any]], k: int) -> list[dict[str, Any]]:
    per_image, names = report["_per_image"], report["class_names"]
    items = []
    for rank, index in enumerate(worst_images(report, k)):
        det, truth = detections[index], ground_truths[index]
        kinds, states = per_image["detection_type"][index], per_image["object_state"][index]
        drawn = draw_errors(read_image(det["path"]), det, kinds, truth, states)
        file = "worst/" + fitted_name(f"{rank + 1:03d}_{Path(det['path']).stem}", ".jpg")
        save_image(drawn, run_dir / file)
        tags = gallery_tags(kinds, states, det["labels"].tolist(), truth["labels"].tolist(), names)
        caption = f"{Path(det['path']).name}: {', '.join(tags['errors']) or 'no errors'}"
        items.append({"file": file, "caption": caption, **tags})
    return items


def write_report(report: Mapping[str, Any], run_dir: str | Path, detections: Sequence[Mapping[str, Any]],
                 ground_truths: Sequence[Mapping[str, Any]], *,
                 category_ids: Sequence[int] | Mapping[int, int] | None = None, worst: int = 12) -> Path:
    """Write the files of the module docstring into ``run_dir`` (an existing directory); returns report.html.

    ``detections`` need their ``path`` (the image file, for the drawings) and ``image_id``; ``category_ids`` maps
    labels to the dataset's own ids in detections.json (default: the labels).
    """
    run_dir = Path(run_dir)
    write_text(run_dir / "metrics.json", json.dumps(_plain(report), indent=1))
    write_text(run_dir / "detections.json", json.dumps(to_coco_detections(detections, category_ids=category_ids)))
    pr = dict(report["_pr"], metric="voc")
    figures = [("precision / recall (VOC, IoU 0.5)",
                plot_pr_curves(pr, report["class_names"], run_dir / "pr_curves.png")),
               ("precision, recall, F1 against confidence",
                plot_confidence_curves(report["operating_point"], run_dir / "confidence_curves.png")),
               ("confusion matrix", plot_confusion(report["confusion"], run_dir / "confusion.png")),
               ("confusion matrix, row-normalized",
                plot_confusion(report["confusion"], run_dir / "confusion_normalized.png", normalized=True))]
    gallery = _draw_worst(report, run_dir, detections, ground_truths, worst)
    page = render_report_html(report, [(title, path.name) for title, path in figures], gallery, BOX_KINDS[1:])
    return write_text(run_dir / "report.html", page)


def format_report(report: Mapping[str, Any]) -> str:
    """The printed part: COCO statistics, operating point, errors with dAP, and the advice lines."""
    lines = ["  ".join(f"{key} {_fmt(value)}" for key, value in list(report["coco"]["stats"].items())[:6]),
             "  ".join(f"{key} {_fmt(value)}" for key, value in list(report["coco"]["stats"].items())[6:])]
    best = report["operating_point"]["overall"]["best"]
    if best is not None:
        lines.append(f"best F1 {best['f1']:.3f} at confidence {best['confidence']:.3f} (precision "
                     f"{best['precision']:.3f}, recall {best['recall']:.3f}; mean over classes with objects)")
    errors = report["errors"]["errors"]
    lines += render_table(["error", "count", "dAP"], [[k, errors[k]["count"], f"{100 * errors[k]['dap']:.2f}"]
                                                     for k in ERROR_TYPES])
    lines += report["advice"]
    return "\n".join(lines)


def _fmt(value: float | None) -> str:
    return "-" if value is None or value != value else f"{value:.4f}"


def attach_report(result: dict[str, Any], priors: Tensor | None, data: str | Path, split: str,
                category_ids: Sequence[int] | None, project: str | Path | None, name: str,
                model: str | None = None, *, exist_ok: bool = False) -> None:
    """Add ``report`` to an evaluation result and, with ``project``, write it to a new run directory (``run_dir``;
    ``project/name`` itself with ``exist_ok``); ``model``: the evaluated model's name, or ``None``."""
    result["report"] = build_report(result["detections"], result["ground_truths"], result["class_names"],
                                    priors=priors, data=str(data), split=split, model=model)
    if project is not None:
        result["run_dir"] = make_run_dir(project, name, exist_ok)
        write_report(result["report"], result["run_dir"], result["detections"], result["ground_truths"],
                     category_ids=category_ids)

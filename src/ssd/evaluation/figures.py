"""Figures of the evaluation report: P/R/F1 against confidence, confusion matrices, images drawn with their errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from matplotlib import rc_context
from matplotlib.figure import Figure
from torch import Tensor

from ssd.evaluation.tide import DETECTION_TYPES, OBJECT_STATES
from ssd.plots import PLAIN_TEXT, class_color, draw_detections

__all__ = ["BOX_KINDS", "plot_confidence_curves", "plot_confusion", "draw_errors"]

BOX_KINDS = ("true positive", "missed", "localization", "classification", "duplicate", "background", "both")
"""What a box drawn by :func:`draw_errors` is: a detection's type, or ``missed`` for an object nothing found."""
_TAGS = ("TP", "missed", "loc", "cls", "dupe", "bkg", "both")  # TIDE's short names drawn on the boxes
_KIND_OF_TYPE = {DETECTION_TYPES.index("true_positive"): 0,
                 **{DETECTION_TYPES.index(t): BOX_KINDS.index(t) for t in BOX_KINDS[2:]}}


def _save(fig: Figure, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    return out


@rc_context(PLAIN_TEXT)  # made and saved with names as plain text
def plot_confidence_curves(point: Mapping[str, Any], out_png: str | Path) -> Path:
    """Precision, recall and F1 against confidence (:func:`ssd.evaluation.curves.operating_point`): one thin line
    per class with objects, the overall mean thick, its best-F1 confidence marked."""
    fig = Figure(figsize=(15, 4.5), layout="constrained")
    axes = fig.subplots(1, 3)
    confidence = np.asarray(point["confidence"])
    best = point["overall"]["best"]
    for ax, key in zip(axes, ("precision", "recall", "f1")):
        for k, (name, row) in enumerate(point["per_class"].items()):
            if not row["absent"]:
                ax.plot(confidence, row[key], color=np.asarray(class_color(k)) / 255, linewidth=1, label=name)
        if best is not None:
            ax.plot(confidence, point["overall"][key], color="black", linewidth=2.5, label="all classes")
            ax.axvline(best["confidence"], color="0.4", linestyle="--", linewidth=1)
        ax.set(xlabel="confidence", ylabel=key, xlim=(0, 1), ylim=(0, 1.02), title=key)
        ax.grid(alpha=0.3)
    if best is not None:
        axes[2].set_title(f"F1: best {best['f1']:.3f} at confidence {best['confidence']:.3f}")
    if len(point["per_class"]) <= 20:
        axes[2].legend(loc="lower left", fontsize="small")
    return _save(fig, Path(out_png))


@rc_context(PLAIN_TEXT)  # made and saved with names as plain text
def plot_confusion(matrix: Mapping[str, Any], out_png: str | Path, normalized: bool = False) -> Path:
    """Heat map of :func:`ssd.evaluation.confusion.confusion_matrix` (rows: true class, columns: prediction), counts
    or row-normalized shares written in the cells (up to 30 classes)."""
    values = np.asarray(matrix["normalized" if normalized else "counts"], dtype=np.float64)
    names = matrix["names"]
    side = max(5.0, 0.45 * len(names) + 2)
    fig = Figure(figsize=(side + 1, side), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(values, cmap="Blues", vmin=0, vmax=1 if normalized else max(1.0, values.max()))
    fig.colorbar(image, ax=ax, shrink=0.8)
    ax.set_xticks(range(len(names)), names, rotation=90)
    ax.set_yticks(range(len(names)), names)
    ax.set(xlabel="predicted", ylabel="true", title=f"{'row-normalized' if normalized else 'counts'} at confidence "
           f"{matrix['confidence']:.3f}, IoU {matrix['match_iou_threshold']:.2f}")
    if len(names) <= 30:
        limit = values.max() / 2 if values.size else 0
        for (i, j), v in np.ndenumerate(values):
            if v:
                ax.text(j, i, f"{v:.2f}" if normalized else f"{int(v)}", ha="center", va="center", fontsize=8,
                        color="white" if v > limit else "black")
    return _save(fig, Path(out_png))


def draw_errors(image: Tensor, detection: Mapping[str, Any], detection_type: Tensor, truth: Mapping[str, Any],
                object_state: Tensor) -> Tensor:
    """``image [3, H, W]`` uint8 with its detections tagged by type (:data:`BOX_KINDS` in TIDE's short names: TP,
    loc, cls, dupe, bkg, both; with scores) and its missed objects tagged ``missed``, one colour per kind; found
    objects are not drawn (their true positive is)."""
    missed = object_state == OBJECT_STATES.index("missed")
    kinds = torch.tensor([_KIND_OF_TYPE.get(int(t), -1) for t in detection_type.tolist()], dtype=torch.int64)
    shown = kinds >= 0
    drawn = draw_detections(image, torch.as_tensor(truth["boxes"])[missed],
                            torch.full((int(missed.sum()),), BOX_KINDS.index("missed")), None, _TAGS)
    return draw_detections(drawn, torch.as_tensor(detection["boxes"])[shown], kinds[shown],
                           torch.as_tensor(detection["scores"])[shown], _TAGS)


def gallery_tags(detection_type: Tensor, object_state: Tensor, labels: Sequence[int],
                 truth_labels: Sequence[int], class_names: Sequence[str]) -> dict[str, list[str]]:
    """The error kinds (:data:`BOX_KINDS` but true positive) and classes an image shows, for the gallery filters."""
    kinds = {BOX_KINDS[_KIND_OF_TYPE[int(t)]] for t in detection_type.tolist() if int(t) in _KIND_OF_TYPE}
    kinds.discard("true positive")
    if bool((object_state == OBJECT_STATES.index("missed")).any()):
        kinds.add("missed")
    classes = {class_names[int(k)] for k in [*labels, *truth_labels]}
    return {"errors": sorted(kinds, key=BOX_KINDS.index), "classes": sorted(classes)}

"""Run-directory figures and drawn predictions.

Figures are drawn on matplotlib ``Figure`` objects with the Agg canvas (no pyplot, no display, no global backend
change). Text is drawn in a font that has a glyph for every character (:func:`font_for`: DejaVu Sans, else an
installed font such as Noto Sans CJK); when no installed font has them, class names are replaced by their indices
and a legend maps each index to the name (characters without a glyph written as ``\\uXXXX`` escapes), so nothing is
drawn as empty boxes and no glyph warning is raised. ``results.csv`` (written by the trainer, read by
:func:`plot_results`) has the columns of :data:`RESULTS_COLUMNS`, one row per epoch; an empty cell (e.g.
``val/mAP`` of an epoch without validation) is skipped in the curves.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib
import numpy as np
from matplotlib import colormaps, rc_context
from matplotlib.figure import Figure
from matplotlib.font_manager import fontManager
from matplotlib.ft2font import FT2Font
from matplotlib.patches import Patch
from PIL import Image, ImageDraw, ImageFont

from ssd.errors import InputError, OutputError
from ssd.files import atomic_write

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["RESULTS_COLUMNS", "PLAIN_TEXT", "class_color", "draw_detections", "font_for", "plot_label_stats",
           "plot_pr_curves", "plot_results", "save_image"]

PLAIN_TEXT = {"text.parse_math": False}
"""matplotlib settings under which every figure is made and saved: names are data, drawn as they are (a class
named ``$\\frac{a}{$`` is text, not mathtext that fails to parse)."""

# results.csv, one row per epoch:
#   epoch           1-based epoch number
#   train/loss      mean training loss of the epoch (loc + cls)
#   train/loc_loss  mean localization (smooth L1) loss
#   train/cls_loss  mean classification (hard-negative-mined cross-entropy) loss
#   val/loss, val/loc_loss, val/cls_loss
#                   the same losses on the validation split, no augmentation (empty when not validated)
#   lr              learning rate at the end of the epoch (first parameter group)
#   val/mAP         validation mAP of the run's metric (empty when the epoch was not validated)
#   val/precision, val/recall
#                   validation precision and recall at that epoch's best-F1 confidence (the checkpoint's
#                   operating_point; empty when not validated)
#   time            seconds since the start of training
RESULTS_COLUMNS = ("epoch", "train/loss", "train/loc_loss", "train/cls_loss", "val/loss", "val/loc_loss",
                   "val/cls_loss", "lr", "val/mAP", "val/precision", "val/recall", "time")

MAX_SCATTER_BOXES = 20_000
"""Most boxes the box-size scatter of :func:`plot_label_stats` draws (a seeded sample beyond it): a scatter of every box
of a large dataset costs seconds at every training start and shows no more."""
_PALETTE = [tuple(round(255 * c) for c in colormaps["tab20"](i)[:3]) for i in (*range(0, 20, 2), *range(1, 20, 2))]
_FONT = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"


@functools.cache
def _charmap(path: str) -> frozenset[int]:
    """Code points with a glyph in the font file ``path`` (read once per file)."""
    return frozenset(FT2Font(path).get_charmap())


def _covers(path: str, needed: set[int]) -> bool:
    try:
        return needed <= _charmap(path)
    except (OSError, RuntimeError, ValueError):  # an unreadable font file in the system list is no candidate
        return False


def font_for(texts: Iterable[str]) -> str | None:
    """Path of a font with a glyph for every character of ``texts``, or None when no installed font has them all.

    matplotlib's DejaVu Sans when it has them; else the first of matplotlib's list of installed fonts that does,
    regular sans-serif faces first. The "Last Resort" font is no candidate (its glyphs are the placeholder boxes this
    avoids), nor is a face other than the first of a font collection (PIL, which draws the image labels, opens the
    first).
    """
    needed = {ord(c) for text in texts for c in text if c.isprintable() and not c.isspace()}
    if _covers(str(_FONT), needed):
        return str(_FONT)
    faces = [f for f in fontManager.ttflist if f.index == 0 and "last resort" not in f.name.lower()]
    faces.sort(key=lambda f: (f.style != "normal", abs(int(f.weight) - 400) if str(f.weight).isdigit() else 999,
                              "sans" not in f.name.lower(), f.name, f.fname))
    return next((f.fname for f in faces if _covers(f.fname, needed)), None)


def _escaped(text: str) -> str:
    """``text`` with each character DejaVu Sans has no glyph for written as a ``\\uXXXX`` escape."""
    return "".join(c if ord(c) in _charmap(str(_FONT)) or not c.isprintable() else ascii(c)[1:-1] for c in text)


def _class_labels(class_names: Sequence[str]) -> tuple[list[str], str | None, list[str]]:
    """Labels to draw for the classes, the font to draw them in, and the index legend (empty unless needed).

    Returns ``(names, font, [])`` when a font has every glyph, else ``(["0", "1", ...], None, ["0 = name", ...])``
    with names escaped by :func:`_escaped` (``font`` None: DejaVu Sans).
    """
    font = font_for(class_names)
    if font is not None:
        return list(class_names), font, []
    return [str(k) for k in range(len(class_names))], None, [f"{k} = {_escaped(n)}" for k, n in enumerate(class_names)]


def _font_family(font: str | None) -> dict[str, Any]:
    """matplotlib settings drawing plain text (:data:`PLAIN_TEXT`) in ``font`` (None: DejaVu Sans), DejaVu Sans for
    anything it lacks."""
    family = FT2Font(font).family_name if font else "DejaVu Sans"
    return {"font.family": list(dict.fromkeys([family, "DejaVu Sans"])), **PLAIN_TEXT}


def _save(fig: Figure, out_png: str | Path) -> Path:
    out = Path(out_png)
    with atomic_write(out) as f:
        fig.savefig(f, dpi=100, format=out.suffix.lstrip(".") or "png")
    return out


def plot_results(csv_path: str | Path, out_png: str | Path) -> Path:
    """Loss curves (total, loc, cls; training solid, validation dashed), learning rate and validation mAP,
    precision and recall against the epoch, from ``results.csv``."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))

    def column(name: str) -> tuple[list[float], list[float]]:
        pairs = [(float(r["epoch"]), float(r[name])) for r in rows if r.get(name) not in (None, "")]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    title = str(Path(csv_path).parent.name or csv_path)  # the run folder's name: any characters
    font = font_for([title])
    with rc_context(_font_family(font)):  # fonts are fixed when text is made and when it is drawn
        fig = Figure(figsize=(14, 4), layout="constrained")
        loss_ax, lr_ax, map_ax = fig.subplots(1, 3)
        for part, color in zip(("loss", "loc_loss", "cls_loss"), ("tab:blue", "tab:orange", "tab:red")):
            loss_ax.plot(*column(f"train/{part}"), marker=".", color=color, label=part)
            loss_ax.plot(*column(f"val/{part}"), marker="o", linestyle="--", color=color, label=f"val {part}")
        loss_ax.set(title="loss", xlabel="epoch")
        loss_ax.legend()
        lr_ax.plot(*column("lr"), marker=".")
        lr_ax.set(title="learning rate", xlabel="epoch")
        for name, color in (("mAP", "tab:green"), ("precision", "tab:purple"), ("recall", "tab:brown")):
            map_ax.plot(*column(f"val/{name}"), marker="o", color=color, label=name)
        map_ax.set(title="validation (P, R at the best-F1 confidence)", xlabel="epoch", ylim=(0, 1))
        map_ax.legend()
        for ax in (loss_ax, lr_ax, map_ax):
            ax.grid(alpha=0.3)
        fig.suptitle(title if font else _escaped(title))
        return _save(fig, out_png)


def plot_pr_curves(eval_result: Mapping[str, Any], class_names: Sequence[str], out_png: str | Path) -> Path:
    """Precision/recall curve of each class with ground truth (``eval_result["per_class"]`` of an evaluation),
    labelled with its AP; a legend up to 20 classes, thin grey lines beyond."""
    names, font, legend = _class_labels(class_names)
    with rc_context(_font_family(font)):
        fig = Figure(figsize=(8, 6), layout="constrained")
        ax = fig.subplots()
        per_class = eval_result["per_class"]
        many = len(class_names) > 20
        for k, name in enumerate(class_names):
            row = per_class[name]
            recall, precision = np.asarray(row["recall"]), np.asarray(row["precision"])
            if recall.size == 0:
                continue
            color = "0.6" if many else np.asarray(class_color(k)) / 255
            ax.plot(recall, precision, color=color, linewidth=1 if many else 1.5,
                    label=None if many else f"{(legend or names)[k]} {float(row['ap']):.3f}")
        metric = eval_result.get("metric", "")
        ax.set(xlabel="recall", ylabel="precision", xlim=(0, 1), ylim=(0, 1.02),
               title=f"{metric} mAP {float(eval_result['map']):.4f}".strip())
        ax.grid(alpha=0.3)
        if not many and ax.lines:
            ax.legend(loc="lower left", fontsize="small")
        return _save(fig, out_png)


def plot_label_stats(boxes: Tensor | np.ndarray, labels: Tensor | np.ndarray, class_names: Sequence[str],
                     out_png: str | Path) -> Path:
    """Objects per class (bars) and box width against height in pixels (scatter) of a split.

    Args:
        boxes: ``[N, 4]`` pixel xyxy of every object.
        labels: ``[N]`` labels ``0..K-1``.
    """
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    labels = np.asarray(labels, dtype=np.int64).reshape(-1)
    if len(boxes) != len(labels):
        raise InputError(f"plot_label_stats: {len(boxes)} boxes but {len(labels)} labels")
    counts = np.bincount(labels, minlength=len(class_names))[: len(class_names)]
    colors = [np.asarray(class_color(k)) / 255 for k in range(len(class_names))]
    names, font, legend = _class_labels(class_names)
    with rc_context(_font_family(font)):
        fig = Figure(figsize=(12, 5), layout="constrained")
        count_ax, size_ax = fig.subplots(1, 2)
        count_ax.bar(range(len(class_names)), counts, color=colors)
        count_ax.set_xticks(range(len(class_names)), names, rotation=90 if len(class_names) > 8 and not legend else 0)
        count_ax.set(title=f"objects per class ({len(labels)} in all)", ylabel="objects")
        if legend:  # the ticks show indices: say which class each is
            count_ax.legend(handles=[Patch(color=c, label=line) for c, line in zip(colors, legend)], title="class",
                            fontsize="small", ncols=-(-len(legend) // 20))
        shown = np.arange(len(labels))
        if len(shown) > MAX_SCATTER_BOXES:
            shown = np.sort(np.random.default_rng(0).choice(len(shown), MAX_SCATTER_BOXES, replace=False))
        width, height = boxes[shown, 2] - boxes[shown, 0], boxes[shown, 3] - boxes[shown, 1]
        size_ax.scatter(width, height, s=4, alpha=min(1.0, max(0.05, 200 / max(len(shown), 1))),
                        c=np.asarray(colors).reshape(-1, 3)[labels[shown]] if len(shown) else None)
        sampled = f" ({len(shown):,} of {len(labels):,} shown)" if len(shown) < len(labels) else ""
        size_ax.set(title=f"box sizes{sampled}", xlabel="width (px)", ylabel="height (px)")
        size_ax.grid(alpha=0.3)
        return _save(fig, out_png)


def class_color(label: int) -> tuple[int, int, int]:
    """RGB colour of a class (20 distinct tab20 colours, cycled)."""
    return _PALETTE[int(label) % len(_PALETTE)]


def draw_detections(image: Tensor, boxes: Tensor, labels: Tensor, scores: Tensor | None,
                    class_names: Sequence[str], *, line_width: int | None = None,
                    font_size: int | None = None, track_ids: Tensor | None = None,
                    trails: Mapping[int, Sequence[tuple[float, float]]] | None = None) -> Tensor:
    """Draw boxes with ``"name score"`` labels in per-class colours (:func:`class_color`); with ``track_ids``,
    tracked boxes are labelled ``"#id name score"`` in per-track colours, and their ``trails`` drawn as lines.

    Each label sits on a filled tag just above its box (inside it when there is no room above), shifted so it stays
    inside the image. Line width and font size default to about 0.4% and 2.5% of the image size. When no installed
    font has glyphs for the class names (:func:`font_for`), tags show class indices and a legend in the top left
    corner maps the indices of the classes drawn to their names.

    Args:
        image: ``[3, H, W]`` uint8 RGB.
        boxes: ``[N, 4]`` pixel xyxy (clipped to the image for drawing).
        labels: ``[N]`` labels ``0..K-1``.
        scores: ``[N]`` or None (labels without scores).
        class_names: ``K`` names.
        track_ids: ``[N]`` track ids (``-1``: untracked) or None.
        trails: track id -> its recent box centres ``(x, y)`` in pixels, oldest first (drawn for the tracks of
            ``track_ids``).

    Returns:
        A new ``[3, H, W]`` uint8 image.
    """
    import torch
    from torchvision.utils import draw_bounding_boxes

    if not isinstance(image, torch.Tensor) or image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise InputError(f"draw_detections: image must be a uint8 tensor [3, H, W], got "
                         f"{getattr(image, 'dtype', type(image).__name__)} {tuple(getattr(image, 'shape', ()))}")
    height, width = image.shape[-2:]
    boxes = torch.as_tensor(boxes, dtype=torch.float32).detach().cpu().reshape(-1, 4)
    labels = torch.as_tensor(labels).detach().cpu().reshape(-1).tolist()
    if len(labels) != len(boxes) or (scores is not None and len(scores) != len(boxes)):
        raise InputError(f"draw_detections: {len(boxes)} boxes, {len(labels)} labels"
                         f"{'' if scores is None else f', {len(scores)} scores'}: one of each per detection")
    image = image.detach().cpu()
    if len(boxes) == 0:
        return image.clone()
    bounds = torch.tensor([width - 1, height - 1] * 2, dtype=torch.float32)
    boxes = torch.minimum(boxes.clamp(min=0), bounds)
    line_width = line_width or max(1, round(0.004 * (height + width) / 2))
    font_size = font_size or max(10, round(0.025 * max(height, width)))
    names, font_path, legend = _class_labels(class_names)
    font_path = font_path or str(_FONT)
    names = [names[k] if 0 <= k < len(names) else str(k) for k in labels]
    texts = names if scores is None else [f"{n} {float(s):.2f}" for n, s in zip(names, scores)]
    colors = [class_color(k) for k in labels]
    if track_ids is not None:
        tracks = track_ids.tolist()
        texts = [f"#{t} {text}" if t >= 0 else text for t, text in zip(tracks, texts)]
        colors = [class_color(t) if t >= 0 else color for t, color in zip(tracks, colors)]
        image = _draw_trails(image, [(trails or {}).get(t, ()) for t in tracks], colors, line_width)
    drawn = draw_bounding_boxes(image, boxes, colors=colors, width=line_width)

    font = ImageFont.truetype(font_path, font_size)
    anchors = _tag_anchors(font, texts, boxes[:, :2].tolist(), (height, width), line_width)
    if legend:  # one tag per class drawn, stacked from the top left corner
        shown = sorted({k for k in labels if 0 <= k < len(legend)})
        lines = [legend[k] for k in shown]
        anchors += _tag_anchors(font, lines, [(0, 0)] * len(lines), (height, width), 0, stacked=True)
        texts, colors = texts + lines, colors + [class_color(k) for k in shown]
    text_colors = [(0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b > 140 else (255, 255, 255) for r, g, b in colors]
    return draw_bounding_boxes(drawn, torch.tensor(anchors), labels=texts, colors=colors, width=0, font=font_path,
                               font_size=font_size, label_colors=text_colors, fill_labels=True)


def _draw_trails(image: Tensor, trails: Sequence[Sequence[tuple[float, float]]], colors: Sequence[tuple[int, int, int]],
                 line_width: int) -> Tensor:
    """``image`` with each trail (points ``(x, y)``) drawn as a line in its colour."""
    import torch

    canvas = Image.fromarray(image.permute(1, 2, 0).numpy())
    pen = ImageDraw.Draw(canvas)
    for points, color in zip(trails, colors):
        if len(points) > 1:
            pen.line([tuple(p) for p in points], fill=color, width=line_width, joint="curve")
    return torch.from_numpy(np.asarray(canvas).copy()).permute(2, 0, 1)


def _tag_anchors(font: ImageFont.FreeTypeFont, texts: Sequence[str], corners: Sequence[Sequence[float]],
                 size: tuple[int, int], line_width: int, *, stacked: bool = False) -> list[list[float]]:
    """Where ``draw_bounding_boxes`` must write each text so that its filled tag sits just above its corner
    ``(x1, y1)`` (inside the box, below its line, when there is no room above), or below the previous tag when
    ``stacked``, and stays inside the image of ``size`` ``(H, W)``.

    ``draw_bounding_boxes`` writes a label at ``(x1 + m, y1 + m)`` of its box with margin ``m = width + 1``; the
    anchors are zero-width boxes (``[N, 4]`` as lists) at the computed tag positions.
    """
    height, width = size
    anchors, below = [], 0
    for (x1, y1), text in zip(corners, texts):
        left, top, right, bottom = font.getbbox(text)
        tag_w, tag_h = right - left + 2, bottom - top + 2
        if stacked:
            y, below = below, below + tag_h + 1
        else:
            y = y1 - tag_h - 1 if y1 - tag_h - 1 >= 0 else y1 + line_width
        x = min(max(x1, 0), max(width - tag_w - 1, 0))
        y = min(max(y, 0), max(height - tag_h - 1, 0))
        anchors.append([x - left, y - top, x - left, y - top])
    return anchors


def save_image(image: Tensor, path: str | Path, *, sync: bool = True) -> Path:
    """Save a ``[3, H, W]`` uint8 RGB tensor (or numpy array, without PyTorch) (format from the suffix: .jpg, .png,
    ...), creating parent folders; ``sync=False``: no fsync (:func:`ssd.files.atomic_write`), for a run's many
    per-image outputs."""
    array = np.asarray(image.detach().cpu() if hasattr(image, "detach") else image)
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[0] != 3:
        raise InputError(f"save_image: {path}: image must be a uint8 tensor [3, H, W], got "
                         f"{getattr(image, 'dtype', type(image).__name__)} {tuple(getattr(image, 'shape', ()))}")
    path = Path(path)
    image_format = Image.registered_extensions().get(path.suffix.lower())
    if image_format is None:
        raise OutputError(f"save_image: {path}: unknown image suffix {path.suffix!r} (use .jpg, .png, ...)")
    with atomic_write(path, sync=sync) as f:  # never a half-written image, even with the disk full
        Image.fromarray(np.ascontiguousarray(array.transpose(1, 2, 0))).save(f, format=image_format)
    return path

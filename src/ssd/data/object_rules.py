"""The per-object rules of ``ssd check`` (and so of the training gate), one image at a time: class names and labels,
non-finite, inverted, empty and outside boxes (errors), boxes past the border, tiny boxes and near-duplicates of the
same class (warnings). The dataset-wide rules are :mod:`ssd.data.rules`; :mod:`ssd.data.check` applies both."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ssd.data.images import exif_transposed
from ssd.data.records import ImageRecord, Issue, relative_path
from ssd.errors import ImageError
from ssd.limits import MAX_BOXES_PER_IMAGE
from ssd.names import closest_names

__all__ = ["object_issues", "duplicate_pairs"]

TINY_PIXELS = 2.0
"""Boxes narrower or shorter than this (pixels, after clipping) get a warning."""
DUPLICATE_CHUNK = 1 << 20
"""IoU values the duplicate check computes at once: its memory is bounded for any number of boxes."""
DUPLICATE_IOU = 0.9
BORDER_TOLERANCE = 1.0
"""Pixels a box may extend past the image border before a warning."""


def _box_text(box) -> str:
    return "(" + ", ".join(f"{v:g}" for v in box) + ")"


def _written(obj) -> str:
    """The pixel xyxy box, plus the values as written in the file when they differ in form."""
    return f"box {_box_text(obj.box)}" + (f" (written: {obj.raw})" if obj.raw else "")


def _rotation_hint(rec: ImageRecord, obj) -> str:
    """For a box outside the image as displayed that fits the picture as stored, when the EXIF orientation tag
    rotates it by 90 degrees: the likely cause (an annotation tool that ignored the tag)."""
    w, h = rec.width or 0, rec.height or 0
    x1, y1, x2, y2 = obj.box
    tol = BORDER_TOLERANCE
    if w == h or not (x1 >= -tol and y1 >= -tol and x2 <= h + tol and y2 <= w + tol):
        return ""
    try:
        if not exif_transposed(rec.path):
            return ""
    except ImageError:
        return ""
    return (f"; the image is stored as {h}x{w} and shown (and read) rotated by its EXIF orientation tag, and the box "
            "fits the stored picture: it was probably drawn without the rotation (save the image upright, e.g. with "
            "PIL.ImageOps.exif_transpose, and annotate it again)")


def object_issues(rec: ImageRecord, split: str, names: list[str], root: Path) -> list[Issue]:
    """Per-object rules for one image, plus near-duplicates (same label, IoU > 0.9)."""
    if len(rec.objects) > MAX_BOXES_PER_IMAGE:  # before any per-object work: 20,000 boxes are a generated file
        return [Issue("error", "too_many_boxes", f"{relative_path(rec.annotation or rec.path, root)}: "
                      f"{len(rec.objects):,} objects in one image, more than {MAX_BOXES_PER_IMAGE:,} "
                      "(ssd.limits.MAX_BOXES_PER_IMAGE)", relative_path(rec.annotation or rec.path, root), None,
                      split, rec.path)]
    issues = []
    k = len(names)
    w, h = rec.width or 0, rec.height or 0
    valid: list[int] = []
    for idx, obj in enumerate(rec.objects):
        def add(severity: str, code: str, text: str, obj=obj, idx=idx) -> None:
            issues.append(Issue(severity, code, f"{obj.where}: {text}", relative_path(obj.source or rec.path, root),
                                obj.line, split, rec.path, idx))

        x1, y1, x2, y2 = obj.box
        if obj.label == -1 and obj.name not in names:
            close = closest_names(obj.name, names)
            add("error", "unknown_class", f"unknown class name {obj.name!r}"
                + (f" (closest: {', '.join(map(repr, close))})" if close else "") + f"; known names: {names}")
        elif not 0 <= obj.label < k:
            hint = "; the background class is added internally, do not count it"
            add("error", "label_out_of_range", f"label {obj.label} is out of range for {k} classes {names} "
                f"(labels must be 0..{k - 1}{hint})")
        elif not all(math.isfinite(v) for v in obj.box):
            add("error", "non_finite", f"{_written(obj)} is not finite (coordinates must be numbers)")
        elif x2 < x1 or y2 < y1:
            add("error", "inverted", f"{_written(obj)} is inverted (boxes need x2 > x1 and y2 > y1)")
        elif x2 == x1 or y2 == y1:
            add("error", "zero_area", f"{_written(obj)} has zero area (width {x2 - x1:g}, height "
                f"{y2 - y1:g}; boxes need x2 > x1 and y2 > y1)")
        elif x2 <= 0 or y2 <= 0 or x1 >= w or y1 >= h:
            add("error", "outside_image", f"{_written(obj)} lies outside the {w}x{h} image" + _rotation_hint(rec, obj))
        elif x1 < -w or y1 < -h or x2 > 2 * w or y2 > 2 * h:  # not a sloppy click: a wrong unit or a typo
            add("error", "far_outside", f"{_written(obj)} extends more than the image's size past the {w}x{h} image"
                + _rotation_hint(rec, obj))
        else:
            tol = BORDER_TOLERANCE
            if x1 < -tol or y1 < -tol or x2 > w + tol or y2 > h + tol:
                add("warning", "beyond_border", f"{_written(obj)} extends past the {w}x{h} image "
                    "(clipped to the image when used)" + _rotation_hint(rec, obj))
            cw, ch = min(x2, w) - max(x1, 0), min(y2, h) - max(y1, 0)
            if cw < TINY_PIXELS or ch < TINY_PIXELS:
                add("warning", "tiny_box", f"{_written(obj)} is only {cw:g}x{ch:g} px (under "
                    f"{TINY_PIXELS:g} px; probably a stray click)")
            valid.append(idx)
    if len(valid) > 1:
        boxes = np.array([rec.objects[i].box for i in valid], np.float64)
        labels = np.array([rec.objects[i].label for i in valid])
        for a, b, overlap in duplicate_pairs(boxes, labels):
            first, second = rec.objects[valid[a]], rec.objects[valid[b]]
            issues.append(Issue("warning", "duplicate_box", f"{second.where}: box {_box_text(second.box)} nearly "
                                f"duplicates {first.where} {_box_text(first.box)} (same class, IoU "
                                f"{overlap:.2f} > {DUPLICATE_IOU})",
                                relative_path(second.source or rec.path, root), second.line, split, rec.path, valid[b]))
    return issues


def duplicate_pairs(boxes: np.ndarray, labels: np.ndarray) -> list[tuple[int, int, float]]:
    """``(a, b, IoU)`` for ``a < b`` of the same label with IoU above :data:`DUPLICATE_IOU`; ``boxes [N, 4]`` float64
    ``(x1, y1, x2, y2)`` of positive area, ``labels [N]``. Rows are compared in chunks, so memory stays near
    ``DUPLICATE_CHUNK`` values for any N. In numpy, not ``torchvision.ops.box_iou`` (the same arithmetic): an image's
    few boxes cost less than torch's per-call overhead, and the check runs it for every image."""
    found = []
    rows, area = max(1, DUPLICATE_CHUNK // len(boxes)), (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    for start in range(0, len(boxes), rows):
        part = boxes[start:start + rows, None]  # [rows, 1, 4] against [N, 4]
        sides = (np.minimum(part[..., 2:], boxes[:, 2:]) - np.maximum(part[..., :2], boxes[:, :2])).clip(min=0)
        inter = sides[..., 0] * sides[..., 1]
        iou = inter / (area[start:start + rows, None] + area - inter)  # [rows, N]
        later = np.arange(start, start + len(iou))[:, None] < np.arange(len(boxes))
        same = labels[start:start + rows, None] == labels
        pairs = np.argwhere((iou > DUPLICATE_IOU) & same & later).tolist()
        found += [(start + i, j, float(iou[i, j])) for i, j in pairs]
    return found

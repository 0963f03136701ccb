"""The ``ssd check`` doctor: every problem of a dataset, at its file and line, before training.

``check_dataset(data, priors=None)`` returns a :class:`CheckReport`; :func:`screen` applies the same rules for
training/evaluation (the gate :func:`ssd.data.load.load_training_data`): it raises :class:`DataError` with the same
messages, or with ``skip_invalid=True`` drops the offending objects/images and says how many and which.

Rules (errors refuse the data, warnings don't): unparseable annotation files, missing/corrupt/truncated images,
labels outside ``0..K-1``, unknown class names, non-finite / inverted / zero-area boxes, boxes entirely outside the
image (errors); boxes extending past the border (clipped), boxes under 2 px, near-duplicate boxes (same class,
IoU > 0.9), images without objects (warnings); and the dataset-wide rules of :mod:`ssd.data.rules` (class names,
empty splits, classes without training objects, train/val overlap). With ``priors`` it adds default-box coverage
(see :func:`prior_coverage`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from torchvision.ops import box_iou

from ssd._utils import as_hw, closest_names, render_table, size_text
from ssd.data.images import ImageError, verify_image
from ssd.data.load import load_dataset
from ssd.data.records import DataError, DatasetSpec, ImageRecord, Issue, relative_path
from ssd.data.rules import DATASET_RULES, dataset_issues
from ssd.limits import MAX_BOXES_PER_IMAGE
from ssd.priors.coverage import SIZE_BUCKETS, coverage

__all__ = ["CheckReport", "check_dataset", "find_issues", "screen", "prior_coverage", "spec_boxes", "SIZE_BUCKETS"]

TINY_PIXELS = 2.0
"""Boxes narrower or shorter than this (pixels, after clipping) get a warning."""
DUPLICATE_CHUNK = 1 << 20
"""IoU values the duplicate check computes at once: its memory is bounded for any number of boxes."""
DUPLICATE_IOU = 0.9
BORDER_TOLERANCE = 1.0
"""Pixels a box may extend past the image border before a warning."""
_SHOWN_PER_CODE = 20


@dataclass
class CheckReport:
    """Result of :func:`check_dataset`. ``issues`` holds errors and warnings; ``stats`` per-split / per-class counts;
    ``coverage`` the default-box coverage (or None); ``dropped`` what :func:`screen` with ``skip_invalid`` removed."""

    dataset: str
    format: str
    class_names: list[str]
    stats: dict[str, dict] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)
    coverage: dict | None = None
    dropped: dict | None = None

    @property
    def errors(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "error"]

    @property
    def warnings(self) -> list[Issue]:
        return [i for i in self.issues if i.severity == "warning"]

    @property
    def ok(self) -> bool:
        """True when there is no error (warnings do not fail)."""
        return not self.errors

    def to_dict(self) -> dict:
        """JSON-serializable form (what ``ssd check --json`` prints)."""
        return {"dataset": self.dataset, "format": self.format, "class_names": self.class_names,
                "num_classes": len(self.class_names), "ok": self.ok, "stats": self.stats,
                "errors": [i.to_dict() for i in self.errors], "warnings": [i.to_dict() for i in self.warnings],
                "coverage": self.coverage, "dropped": self.dropped}

    def format_table(self) -> str:
        """Readable plain-text report: counts per split and class, problems grouped by kind, coverage, verdict."""
        lines = [f"dataset: {self.dataset} ({self.format}, {len(self.class_names)} classes: "
                 f"{', '.join(self.class_names)})", ""]
        header = ["split", "images", "objects", "no objects", *self.class_names]
        rows = [[s, st["images"], st["objects"], st["images_without_objects"],
                 *(st["objects_per_class"].get(n, 0) for n in self.class_names)] for s, st in self.stats.items()]
        lines += render_table(header, rows) + [""]
        for title, issues in (("errors", self.errors), ("warnings", self.warnings)):
            if not issues:
                continue
            lines.append(f"{title} ({len(issues)}):")
            by_code: dict[str, list[Issue]] = {}
            for issue in issues:
                by_code.setdefault(issue.code, []).append(issue)
            for code, group in by_code.items():
                lines.append(f"  {code} ({len(group)}):")
                lines += [f"    {i.message}" for i in group[:_SHOWN_PER_CODE]]
                if len(group) > _SHOWN_PER_CODE:
                    lines.append(f"    ... and {len(group) - _SHOWN_PER_CODE} more (see --json)")
            lines.append("")
        if self.coverage:
            cov = self.coverage
            lines.append(f"default-box coverage (share of boxes whose best default box has IoU >= "
                         f"{cov['iou_threshold']}): {cov['covered']:.1%} of {cov['boxes']} boxes")
            rows = [[b["name"], b["boxes"], f"{b['covered']:.1%}" if b["boxes"] else "-", f"{b['median_iou']:.2f}"
                     if b["boxes"] else "-"] for b in cov["by_size"] + cov["by_aspect"]]
            lines += ["  " + r for r in render_table(["bucket", "boxes", "covered", "median IoU"], rows)]
            if cov["worst"]:
                lines.append("  worst covered: " + "; ".join(f"{w['name']} ({w['covered']:.0%} of {w['boxes']})"
                                                             for w in cov["worst"]))
            lines.append("")
        if self.dropped:
            lines.append(f"skipped as invalid: {self.dropped['objects']} objects, {self.dropped['images']} images")
        lines.append("OK: no errors" if self.ok else f"FAILED: {len(self.errors)} errors (fix them, or train with "
                     "skip_invalid=true to drop the offending objects/images)")
        return "\n".join(lines)


def _box_text(box) -> str:
    return "(" + ", ".join(f"{v:g}" for v in box) + ")"


def _written(obj) -> str:
    """The pixel xyxy box, plus the values as written in the file when they differ in form."""
    return f"box {_box_text(obj.box)}" + (f" (written: {obj.raw})" if obj.raw else "")


def _object_issues(rec: ImageRecord, split: str, names: list[str], root: Path) -> list[Issue]:
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
            add("error", "outside_image", f"{_written(obj)} lies outside the {w}x{h} image")
        elif x1 < -w or y1 < -h or x2 > 2 * w or y2 > 2 * h:  # not a sloppy click: a wrong unit or a typo
            add("error", "far_outside", f"{_written(obj)} extends more than the image's size past the {w}x{h} image")
        else:
            tol = BORDER_TOLERANCE
            if x1 < -tol or y1 < -tol or x2 > w + tol or y2 > h + tol:
                add("warning", "beyond_border", f"{_written(obj)} extends past the {w}x{h} image "
                    "(clipped to the image when used)")
            cw, ch = min(x2, w) - max(x1, 0), min(y2, h) - max(y1, 0)
            if cw < TINY_PIXELS or ch < TINY_PIXELS:
                add("warning", "tiny_box", f"{_written(obj)} is only {cw:g}x{ch:g} px (under "
                    f"{TINY_PIXELS:g} px; probably a stray click)")
            valid.append(idx)
    if len(valid) > 1:
        boxes = torch.tensor([rec.objects[i].box for i in valid], dtype=torch.float64)
        labels = torch.tensor([rec.objects[i].label for i in valid])
        for a, b, overlap in _duplicate_pairs(boxes, labels):
            first, second = rec.objects[valid[a]], rec.objects[valid[b]]
            issues.append(Issue("warning", "duplicate_box", f"{second.where}: box {_box_text(second.box)} nearly "
                                f"duplicates {first.where} {_box_text(first.box)} (same class, IoU "
                                f"{overlap:.2f} > {DUPLICATE_IOU})",
                                relative_path(second.source or rec.path, root), second.line, split, rec.path, valid[b]))
    return issues


def _duplicate_pairs(boxes: Tensor, labels: Tensor) -> list[tuple[int, int, float]]:
    """``(a, b, IoU)`` for ``a < b`` of the same label with IoU above :data:`DUPLICATE_IOU`; ``boxes [N, 4]``,
    ``labels [N]``. Rows are compared in chunks, so memory stays near ``DUPLICATE_CHUNK`` values for any N."""
    found = []
    rows, index = max(1, DUPLICATE_CHUNK // len(boxes)), torch.arange(len(boxes))
    for start in range(0, len(boxes), rows):
        iou = box_iou(boxes[start:start + rows], boxes)  # [rows, N]
        later = index[start:start + rows, None] < index[None, :]
        same = labels[start:start + rows, None] == labels[None, :]
        pairs = ((iou > DUPLICATE_IOU) & same & later).nonzero().tolist()
        found += [(start + i, j, float(iou[i, j])) for i, j in pairs]
    return found


def _record_issues(spec: DatasetSpec, splits: list[str]) -> list[Issue]:
    """Per-object rules and images without objects, for the images of ``splits`` (each image once)."""
    issues = []
    failed = {i.image for i in spec.issues if i.severity == "error"}
    seen: set[Path] = set()
    for split in splits:
        for rec in spec.splits[split]:
            if rec.path in seen:  # the same image in two splits (e.g. VOC trainval) is reported once
                continue
            seen.add(rec.path)
            issues += _object_issues(rec, split, spec.class_names, spec.root)
            if not rec.objects and rec.path not in failed:
                where = relative_path(rec.annotation or rec.path, spec.root)
                issues.append(Issue("warning", "no_objects", f"{where}: image without objects (kept as a "
                                    "background-only image)", where, split=split, image=rec.path))
    return issues


def find_issues(spec: DatasetSpec, splits: Sequence[str] | None = None, *, decode_images: bool = False
                ) -> list[Issue]:
    """All problems of ``spec`` (or of its ``splits`` only): those found while parsing, the per-object and
    per-image rules, corrupt images (``decode_images``), then the split, class and train/val overlap rules
    (see :mod:`ssd.data.rules`), which count only the objects and images free of errors."""
    used = list(spec.splits) if splits is None else [s for s in splits if s in spec.splits]
    issues = [i for i in spec.issues if i.split is None or i.split in used]
    issues += _record_issues(spec, used)
    if decode_images:
        issues += _decode_issues(spec, used)
    return issues + dataset_issues(spec, used, *_invalid(issues))


def _stats(spec: DatasetSpec) -> dict[str, dict]:
    stats = {}
    for split, records in spec.splits.items():
        per_class: dict[str, int] = {}
        images_per_class: dict[str, int] = {}
        for rec in records:
            for name in {o.name for o in rec.objects}:
                images_per_class[name] = images_per_class.get(name, 0) + 1
            for obj in rec.objects:
                per_class[obj.name] = per_class.get(obj.name, 0) + 1
        stats[split] = {"images": len(records), "objects": sum(len(r.objects) for r in records),
                        "images_without_objects": sum(not r.objects for r in records),
                        "difficult_or_crowd": sum(o.ignore for r in records for o in r.objects),
                        "objects_per_class": per_class, "images_per_class": images_per_class}
    return stats


def spec_boxes(spec: DatasetSpec, splits: list[str] | None = None, exclude: set | None = None) -> Tensor:
    """The boxes of ``splits`` (default: all; an image in two splits counts once) as ``[N, 4]`` xyxy normalized by
    their image's size, as the model's plain resize to a square input does; ``exclude``: ``(image path, object
    index)`` pairs to leave out (the invalid objects)."""
    exclude = exclude or set()
    seen, rows = set(), []
    for split in spec.splits if splits is None else splits:
        for rec in spec.records(split):
            if rec.path in seen or not rec.width or not rec.height:
                continue
            seen.add(rec.path)
            rows += [[o.box[0] / rec.width, o.box[1] / rec.height, o.box[2] / rec.width, o.box[3] / rec.height]
                     for i, o in enumerate(rec.objects) if (rec.path, i) not in exclude]
    return torch.tensor(rows, dtype=torch.float32).reshape(-1, 4)


def prior_coverage(spec: DatasetSpec, priors: Tensor, iou_threshold: float = 0.5, exclude: set | None = None) -> dict:
    """:func:`ssd.priors.coverage.coverage` of every box of ``spec`` (:func:`spec_boxes`) with ``priors`` ``[P, 4]``
    ``(cx, cy, w, h)`` normalized (``model.priors``); ``exclude``: ``(image path, object index)`` pairs to leave out."""
    return coverage(spec_boxes(spec, exclude=exclude), priors, iou_threshold)


def _invalid(issues: list[Issue]) -> tuple[set, set]:
    """(image paths to drop, (image path, object index) pairs to drop) for the error issues."""
    images = {i.image for i in issues if i.severity == "error" and i.object_index is None and i.image is not None}
    objects = {(i.image, i.object_index) for i in issues if i.severity == "error" and i.object_index is not None}
    return images, objects


def _decode_issues(spec: DatasetSpec, splits: list[str]) -> list[Issue]:
    """Corrupt/truncated images of ``splits``: a full but cheap decode of each image once (JPEG DCT scaling; a
    truncated file fails it), on a thread pool."""
    records = {r.path: (split, r) for split in splits for r in spec.splits[split]}

    def probe(path: Path) -> Issue | None:
        try:
            verify_image(path)
        except ImageError as e:  # names the file its own way: the reason alone
            split, _ = records[path]
            rel = relative_path(path, spec.root)
            return Issue("error", e.code, f"{rel}: {e.reason}", rel, split=split, image=path)
        return None

    with ThreadPoolExecutor(max_workers=4) as pool:
        return [i for i in pool.map(probe, records) if i is not None]


def check_dataset(data: str | Path | DatasetSpec, priors: Tensor | None = None, *, split: str | None = None,
                  class_names: list[str] | None = None, iou_threshold: float = 0.5, decode_images: bool = True,
                  model: str | None = None, image_size: int | tuple[int, int] | str | None = None) -> CheckReport:
    """Check a dataset (a data description or a loaded :class:`DatasetSpec`); never raises for bad data.

    ``priors`` (``[P, 4]`` cx, cy, w, h normalized, e.g. ``build_model(name).priors``) adds default-box coverage.
    ``model`` (a model name, with its ``image_size``) adds the non-square input suggestion
    (:func:`suggest_image_size`) as a ``non_square_images`` warning.
    ``decode_images`` decodes every image (cheaply, JPEGs at 1/8 scale) to find truncated or corrupt files.
    """
    if isinstance(data, DatasetSpec):
        spec = data
    else:
        try:
            spec = load_dataset(data, split=split, class_names=class_names)
        except DataError as e:
            return CheckReport(str(data), "unknown", list(class_names or []), issues=[
                Issue("error", "unreadable_dataset", str(e), str(data))])
    issues = find_issues(spec, decode_images=decode_images)
    report = CheckReport(str(spec.root), spec.format, list(spec.class_names), _stats(spec), issues)
    if priors is not None:
        report.coverage = prior_coverage(spec, priors, iou_threshold, exclude=_invalid(issues)[1])
        if report.coverage["worst"]:
            worst = "; ".join(f"{w['name']} objects ({w['covered']:.0%} of {w['boxes']})"
                              for w in report.coverage["worst"])
            report.issues.append(Issue("warning", "low_prior_coverage", f"{report.coverage['covered']:.0%} of the "
                                       f"boxes reach IoU {iou_threshold} with a default box; worst covered: {worst} "
                                       "(too small or too elongated for the default boxes: consider a larger "
                                       "image size or a model with finer default boxes)", str(spec.root)))
    suggestion = suggest_image_size(spec, model, image_size, iou_threshold, _invalid(issues)[1]) if model else None
    if suggestion:
        report.issues.append(Issue("warning", "non_square_images", suggestion["message"], str(spec.root)))
    return report


def _refusal(spec: DatasetSpec, errors: list[Issue], skip_invalid: bool, max_listed: int) -> DataError:
    """The gate's error: the problems (whole-split/class ones first), as ``ssd check`` words them."""
    lasting = [i for i in errors if i.code in DATASET_RULES]
    shown = lasting if skip_invalid else lasting + [i for i in errors if i.code not in DATASET_RULES]
    if skip_invalid:
        advice = "skip_invalid cannot drop these; run `ssd check` for the full report"
    elif lasting:
        advice = (f"run `ssd check` for the full report; skip_invalid=true drops invalid objects/images, not the "
                  f"first {len(lasting)}")
    else:
        advice = "run `ssd check` for the full report, or set skip_invalid=true to drop them"
    listed = "\n  ".join(i.message for i in shown[:max_listed])
    more = f"\n  ... and {len(shown) - max_listed} more" if len(shown) > max_listed else ""
    return DataError(f"{len(shown)} problems in dataset {spec.root} ({advice}):\n  {listed}{more}")


def screen(spec: DatasetSpec, splits: Sequence[str], skip_invalid: bool = False,
           max_listed: int = 10) -> tuple[DatasetSpec, CheckReport]:
    """Apply the check rules to the images of ``splits`` (decoded) and the dataset-wide rules, before training or
    evaluation.

    Without ``skip_invalid`` a dataset with errors raises :class:`DataError` listing the first ``max_listed``
    problems (the same messages as ``ssd check``). With it, the offending objects and images are dropped from a copy
    of ``spec`` (``report.dropped`` says how many and which); errors about a whole split or class
    (:data:`ssd.data.rules.DATASET_RULES`) are refused all the same. Returns ``(clean spec, report)``.
    """
    issues = find_issues(spec, splits, decode_images=True)
    report = CheckReport(str(spec.root), spec.format, list(spec.class_names), _stats(spec), issues)
    errors = report.errors
    if not errors:
        return spec, report
    if not skip_invalid or any(i.code in DATASET_RULES for i in errors):
        raise _refusal(spec, errors, skip_invalid, max_listed)
    bad_images, bad_objects = _invalid(errors)
    clean = copy.copy(spec)
    clean.splits, dropped_objects = {}, []
    for split, records in spec.splits.items():
        kept = []
        for rec in records:
            if rec.path in bad_images:
                continue
            objects = [o for i, o in enumerate(rec.objects) if (rec.path, i) not in bad_objects]
            dropped_objects += [o.where for i, o in enumerate(rec.objects) if (rec.path, i) in bad_objects]
            kept.append(copy.copy(rec) if len(objects) == len(rec.objects) else
                        ImageRecord(rec.path, rec.annotation, objects, rec.width, rec.height, rec.image_id))
        clean.splits[split] = kept
    dropped_images = sorted(str(p) for p in bad_images)
    report.dropped = {"objects": len(dropped_objects), "images": len(dropped_images),
                      "object_locations": dropped_objects, "image_paths": dropped_images}
    return clean, report


def suggest_image_size(spec: DatasetSpec, model: str, image_size: int | tuple[int, int] | str | None = None,
                       iou_threshold: float = 0.5, exclude: set | None = None) -> dict | None:
    """A non-square input size for ``model`` when most training images share an aspect ratio far from 1.

    Rule: at least 60% of the training images (every image without a ``train`` split) have a width / height within
    10% of one ratio ``r`` outside ``[0.8, 1.25]``. The size keeps about the pixels of the model's input
    (``image_size``, default the model's) with sides multiples of 32, so the default boxes keep their sizes in
    pixels (``build.prior_config``), or the smallest such size the model takes (VGG's last levels need ~270 px).
    Returns ``dict(image_size (h, w), text "HxW", ratio r (median of those images), share, coverage (the
    :func:`prior_coverage` dict at that size), current (its share at the current size), message)``, or ``None`` (no
    dominant ratio, the same size, or a size the model cannot take).
    """
    from ssd.models import MODEL_CONFIGS, build_model  # the architectures (and their weights) only when asked

    records = spec.splits.get("train") or [r for recs in spec.splits.values() for r in recs]
    ratios = torch.tensor([r.width / r.height for r in records if r.width and r.height], dtype=torch.float64)
    if len(ratios) == 0 or model not in MODEL_CONFIGS:
        return None
    ratios = ratios.sort().values
    counts = torch.searchsorted(ratios, ratios * 1.1, right=True) - torch.searchsorted(ratios, ratios * 0.9)
    best = int(counts.argmax())  # the ratio with the most images within 10% of it
    share = float(counts[best]) / len(ratios)
    ratio = float(ratios[(ratios >= ratios[best] * 0.9) & (ratios <= ratios[best] * 1.1)].median())
    if share < 0.6 or 0.8 <= ratio <= 1.25:
        return None
    height, width = as_hw(MODEL_CONFIGS[model].image_size if image_size is None else image_size)
    side = round(math.sqrt(height * width / ratio) / 32)  # h * w = pixels and w / h = ratio, in units of 32
    for rows in range(max(1, side), side + 8):  # the first size the model takes (VGG needs ~270 px per side)
        size = (rows * 32, max(1, round(rows * ratio)) * 32)
        try:
            priors = build_model(model, 1, image_size=size).priors
            break
        except ValueError:  # too small for the model's last levels
            continue
    else:
        return None
    if size == (height, width):
        return None
    coverage = prior_coverage(spec, priors, iou_threshold, exclude)
    current = prior_coverage(spec, build_model(model, 1, image_size=(height, width)).priors, iou_threshold,
                             exclude)["covered"]
    text = size_text(size)
    message = (f"{share:.0%} of the {len(ratios)} training images are {ratio:.2f}:1 (width / height, within 10%), "
               f"which the {size_text((height, width))} input of {model} distorts: --image-size {text} (height x "
               f"width, {size[0] * size[1] / (height * width):.2f}x the pixels) gives {coverage['covered']:.1%} "
               f"default-box coverage (now {current:.1%})")
    return {"image_size": size, "text": text, "ratio": ratio, "share": share, "coverage": coverage,
            "current": current, "message": message}

"""The ``ssd check`` doctor: every problem of a dataset, at its file and line, before training.

``check_dataset(data, model=None)`` returns a :class:`ssd.data.check_report.CheckReport`; :func:`screen` applies
the same rules for training/evaluation (the gate :func:`ssd.data.gate.load_training_data`): it raises
:class:`DataError` with the same messages, or with ``skip_invalid=True`` drops the offending objects/images and says
how many and which.

Rules (errors refuse the data, warnings don't): unparseable annotation files, missing/corrupt/truncated images,
labels outside ``0..K-1``, unknown class names, non-finite / inverted / zero-area boxes, boxes entirely outside the
image (errors); boxes extending past the border (clipped), boxes under 2 px, near-duplicate boxes (same class,
IoU > 0.9), images without objects (warnings); and the dataset-wide rules of :mod:`ssd.data.rules` (class names,
empty splits, classes without training objects, train/val overlap). With a ``model`` it adds default-box coverage
(see :func:`ssd.data.coverage.prior_coverage`).
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor
from torchvision.ops import box_iou

from ssd.data.check_report import CheckReport
from ssd.data.images import exif_transposed, verify_image
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord, Issue, relative_path
from ssd.data.rules import DATASET_RULES, dataset_issues
from ssd.data.table import RecordTable
from ssd.errors import DataError, ImageError
from ssd.limits import MAX_BOXES_PER_IMAGE
from ssd.log import progress
from ssd.matching import MATCH_IOU
from ssd.names import closest_names, name_problem, printable
from ssd.priors import PriorConfig

if TYPE_CHECKING:
    from ssd.data.crops import CropScale

__all__ = ["check_dataset", "find_issues", "screen"]

TINY_PIXELS = 2.0
"""Boxes narrower or shorter than this (pixels, after clipping) get a warning."""
DUPLICATE_CHUNK = 1 << 20
"""IoU values the duplicate check computes at once: its memory is bounded for any number of boxes."""
DUPLICATE_IOU = 0.9
DECODE_CHUNK = 64
"""Images one task of the decode check's thread pool decodes (a future per image cost more than a small decode)."""
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
            if (problem := name_problem(str(rec.path), max_chars=None)) is not None:
                where = printable(relative_path(rec.path, spec.root))
                issues.append(Issue("error", "invalid_file_name", f"{where}: the file name {problem}", where,
                                    split=split, image=rec.path))
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
        if isinstance(records, RecordTable):  # from its arrays: no records built
            per_class, images_per_class = records.name_counts()
            stats[split] = {"images": len(records), "objects": records.num_objects,
                            "images_without_objects": int((np.diff(records.first) == 0).sum()),
                            "difficult_or_crowd": int(np.count_nonzero(records.flags)),
                            "objects_per_class": per_class, "images_per_class": images_per_class}
            continue
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


def _invalid(issues: list[Issue]) -> tuple[set, set]:
    """(image paths to drop, (image path, object index) pairs to drop) for the error issues."""
    images = {i.image for i in issues if i.severity == "error" and i.object_index is None and i.image is not None}
    objects = {(i.image, i.object_index) for i in issues if i.severity == "error" and i.object_index is not None}
    return images, objects


def _decode_issues(spec: DatasetSpec, splits: list[str]) -> list[Issue]:
    """Corrupt/truncated images of ``splits``: a full but cheap decode of each image once (JPEG DCT scaling; a
    truncated file fails it), on a thread pool of one thread per core (the decoder releases the GIL), with a progress
    bar on a terminal."""
    records = {r.path: (split, r) for split in splits for r in spec.splits[split]}

    def probe(path: Path) -> Issue | None:
        try:
            verify_image(path)
        except ImageError as e:  # names the file its own way: the reason alone
            split, _ = records[path]
            rel = relative_path(path, spec.root)
            return Issue("error", e.code, f"{rel}: {e.reason}", rel, split=split, image=path)
        return None

    def probe_chunk(paths: list[Path]) -> list[Issue | None]:
        return [probe(path) for path in paths]

    # the cores this process may run on (taskset, cgroups' cpusets), not the machine's; the images in chunks: a
    # small image decodes in less time than a future per image costs
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    paths = list(records)
    chunks = [paths[i:i + DECODE_CHUNK] for i in range(0, len(paths), DECODE_CHUNK)]
    found: list[Issue] = []
    with (progress(total=len(paths), desc="checking images", unit="image", disable=None, leave=False) as bar,
          ThreadPoolExecutor(max_workers=cores) if cores > 1 else nullcontext() as pool):  # bar: on a terminal only
        for part in map(probe_chunk, chunks) if pool is None else pool.map(probe_chunk, chunks):
            found += [issue for issue in part if issue is not None]
            bar.update(len(part))
    return found


def check_dataset(data: str | Path | DatasetSpec, priors: PriorConfig | None = None, *, split: str | None = None,
                  class_names: list[str] | None = None, iou_threshold: float = MATCH_IOU, decode_images: bool = True,
                  model: str | None = None, image_size: int | tuple[int, int] | str | None = None,
                  crop_scale: CropScale | None = None, issues: list[Issue] | None = None) -> CheckReport:
    """Check a dataset (a data description or a loaded :class:`DatasetSpec`); never raises for bad data.

    ``model`` (a model name) adds the default-box coverage of its default boxes at ``image_size`` (default: its
    own; see :func:`ssd.data.coverage.prior_coverage`) and the non-square input suggestion
    (:func:`ssd.data.coverage.suggest_image_size`) as a ``non_square_images`` warning. ``priors`` replaces the
    model's default boxes for the coverage (in pixels of ``image_size``, which it then needs when no ``model`` is
    given). ``crop_scale``: the coverage of the boxes as training crops show them (at the median crop scale, see
    :func:`ssd.data.coverage.spec_boxes`). ``decode_images`` decodes every image (cheaply, JPEGs at 1/8 scale) to
    find truncated or corrupt files. ``issues``: those :func:`find_issues` found for the whole spec (the dataset
    index's, :func:`ssd.data.index.index_dataset`), not looked for again.
    """
    if priors is not None and model is None and image_size is None:
        raise ValueError("check_dataset: priors need the image_size their sizes are pixels of (or a model)")
    if model is not None:  # a bad model name or input size fails before the dataset is read
        from ssd.models.build import MODEL_CONFIGS, default_priors  # the architectures only when asked for

        priors = default_priors(model, image_size) if priors is None else priors
        image_size = MODEL_CONFIGS[model].image_size if image_size is None else image_size
    if isinstance(data, DatasetSpec):
        spec = data
    else:
        try:
            spec = load_dataset(data, split=split, class_names=class_names)
        except DataError as e:
            return CheckReport(str(data), "unknown", list(class_names or []), issues=[
                Issue("error", "unreadable_dataset", str(e), str(data))])
    issues = find_issues(spec, decode_images=decode_images) if issues is None else issues
    report = CheckReport(str(spec.root), spec.format, list(spec.class_names), _stats(spec), issues)
    if priors is None:
        return report
    from ssd.data.coverage import coverage_issue, prior_coverage, suggest_image_size

    invalid = _invalid(issues)[1]
    report.coverage = prior_coverage(spec, priors, image_size, iou_threshold, exclude=invalid, crop_scale=crop_scale)
    low = coverage_issue(report.coverage, str(spec.root))
    suggestion = suggest_image_size(spec, model, image_size, iou_threshold, invalid) if model else None
    if low:
        report.issues.append(low)
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


def screen(spec: DatasetSpec, splits: Sequence[str], skip_invalid: bool = False, max_listed: int = 10, *,
           issues: list[Issue] | None = None) -> tuple[DatasetSpec, CheckReport]:
    """Apply the check rules to the images of ``splits`` (decoded) and the dataset-wide rules, before training or
    evaluation.

    Without ``skip_invalid`` a dataset with errors raises :class:`DataError` listing the first ``max_listed``
    problems (the same messages as ``ssd check``). With it, the offending objects and images are dropped from a copy
    of ``spec`` (``report.dropped`` says how many and which); errors about a whole split or class
    (:data:`ssd.data.rules.DATASET_RULES`) are refused all the same. Returns ``(clean spec, report)``.
    ``issues``: those :func:`find_issues` found for these splits, as the dataset index stores them (the report then
    has no statistics).
    """
    stats = _stats(spec) if issues is None else {}
    issues = find_issues(spec, splits, decode_images=True) if issues is None else issues
    report = CheckReport(str(spec.root), spec.format, list(spec.class_names), stats, issues)
    errors = report.errors
    if not errors:
        return spec, report
    if not skip_invalid or any(i.code in DATASET_RULES for i in errors):
        raise _refusal(spec, errors, skip_invalid, max_listed)
    bad_images, bad_objects = _invalid(errors)
    clean = copy.copy(spec)
    clean.splits, dropped_objects = {}, []
    for split, records in spec.splits.items():
        if isinstance(records, RecordTable):
            clean.splits[split], where = records.without(bad_images, bad_objects)
            dropped_objects += where
            continue
        kept = []
        for rec in records:
            if rec.path in bad_images:
                continue
            objects = [o for i, o in enumerate(rec.objects) if (rec.path, i) not in bad_objects]
            dropped_objects += [o.where for i, o in enumerate(rec.objects) if (rec.path, i) in bad_objects]
            kept.append(copy.copy(rec) if len(objects) == len(rec.objects) else
                        ImageRecord(rec.path, rec.annotation, objects, rec.width, rec.height, rec.image_id))
        clean.splits[split] = kept
    dropped_objects = list(dict.fromkeys(dropped_objects))  # an image listed in two splits (train, trainval) is one
    dropped_images = sorted(str(p) for p in bad_images)
    report.dropped = {"objects": len(dropped_objects), "images": len(dropped_images),
                      "object_locations": dropped_objects, "image_paths": dropped_images}
    return clean, report

"""The ``ssd check`` doctor: every problem of a dataset, at its file and line, before training.

``check_dataset(data, model=None)`` returns a :class:`ssd.data.check_report.CheckReport`; :func:`screen` applies
the same rules for training/evaluation (the gate :func:`ssd.data.gate.load_training_data`): it raises
:class:`DataError` with the same messages, or with ``skip_invalid=True`` drops the offending objects/images and says
how many and which.

Rules (errors refuse the data, warnings don't): unparseable annotation files, missing/corrupt/truncated images and
images without objects (a warning), here; the per-object rules of :mod:`ssd.data.object_rules` (labels, class names,
boxes); and the dataset-wide rules of :mod:`ssd.data.rules` (class names, empty splits, classes without training
objects, train/val overlap). With a ``model`` it adds default-box coverage
(see :func:`ssd.data.coverage.prior_coverage`).
"""

from __future__ import annotations

import copy
import functools
import inspect
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ssd.data.check_report import CheckReport
from ssd.data.images import verify_image
from ssd.data.load import load_dataset
from ssd.data.memo import json_digest, map_in_processes, object_rows, remembered_rules, unanswered
from ssd.data.object_rules import object_issues
from ssd.data.records import DatasetSpec, ImageRecord, Issue, relative_path
from ssd.data.rules import DATASET_RULES, dataset_issues
from ssd.data.table import IGNORE, RecordTable
from ssd.device import usable_cores
from ssd.errors import ConfigError, DataError, ImageError
from ssd.log import progress
from ssd.matching import MATCH_IOU
from ssd.names import name_problem, printable
from ssd.priors import PriorConfig

if TYPE_CHECKING:
    from ssd.data.crops import CropScale

__all__ = ["check_dataset", "find_issues", "check_parts", "record_issues", "decode_issues", "invalid", "screen",
           "used_splits", "rules_version"]

DECODE_CHUNK = 64
"""Images one task of the decode check decodes (a task per image would cost more than a small decode)."""
PROCESS_MIN_IMAGES = 1000
"""Images per worker process the decode check needs before it starts one (a worker costs a fork and its results'
transfer): fewer are decoded here."""


def record_issues(spec: DatasetSpec, splits: list[str]) -> list[Issue]:
    """Per-object rules and images without objects, for the images of ``splits`` (each image once)."""
    issues = []
    failed = {i.image for i in spec.issues if i.severity == "error"}
    seen: set[Path] = set()
    given = (json_digest(spec.class_names), str(spec.root), _rules_version())  # once, not in every image's key
    for split in splits:
        for rec in spec.splits[split]:
            if rec.path in seen:  # the same image in two splits (e.g. VOC trainval) is reported once
                continue
            seen.add(rec.path)
            if (problem := name_problem(str(rec.path), max_chars=None)) is not None:
                where = printable(relative_path(rec.path, spec.root))
                issues.append(Issue("error", "invalid_file_name", f"{where}: the file name {problem}", where,
                                    split=split, image=rec.path))
            issues += remembered_rules(rec.path, functools.partial(_rule_inputs, rec, split, given),
                                       functools.partial(object_issues, rec, split, spec.class_names, spec.root))
            if not rec.objects and rec.path not in failed:  # named by the image when its file holds others too
                own = rec.annotation if rec.annotation is not None and rec.annotation.stem == rec.path.stem else None
                where = relative_path(own or rec.path, spec.root)
                issues.append(Issue("warning", "no_objects", f"{where}: image without objects (kept as a "
                                    "background-only image)", where, split=split, image=rec.path))
    return issues


def rules_version() -> str:
    """A digest of the per-object rules' source (see :func:`_rules_version`): the dataset index patches only a check
    that these rules made."""
    return _rules_version()


@functools.cache
def _rules_version() -> str:
    """A digest of the per-object rules' source: results kept by other rules (another ssd) are never used."""
    try:
        return json_digest(Path(inspect.getfile(object_issues)).read_bytes().hex())
    except (OSError, TypeError):  # no source to tell them by: results kept in this process only
        return uuid.uuid4().hex


def _rule_inputs(rec: ImageRecord, split: str, given: tuple[str, str, str]) -> tuple:
    """What :func:`~ssd.data.object_rules.object_issues` reads of ``rec`` (but its image file: the key's state) and
    of its arguments and code (``given``: the class list's digest, the root, :func:`_rules_version`), as JSON."""
    return object_rows(rec.objects), str(rec.annotation), rec.width, rec.height, split, *given


def find_issues(spec: DatasetSpec, splits: Sequence[str] | None = None, *, decode_images: bool = False
                ) -> list[Issue]:
    """All problems of ``spec`` (or of its ``splits`` only): those found while parsing, the per-object and
    per-image rules, corrupt images (``decode_images``), then the split, class and train/val overlap rules
    (see :mod:`ssd.data.rules`), which count only the objects and images free of errors."""
    return [issue for part in check_parts(spec, splits, decode_images=decode_images) for issue in part]


def check_parts(spec: DatasetSpec, splits: Sequence[str] | None = None, *, decode_images: bool = False
                ) -> tuple[list[Issue], list[Issue], list[Issue], list[Issue]]:
    """:func:`find_issues` in its four parts, in its order: the reader's issues of ``splits``, the per-image rules
    (:func:`record_issues`), the decode check (:func:`decode_issues`; empty without ``decode_images``) and the
    dataset-wide rules. The dataset index keeps the parts apart, to replace one image's issues after an edit."""
    used = used_splits(spec, splits)
    read = [i for i in spec.issues if i.split is None or i.split in used]
    per_image = record_issues(spec, used)
    decoded = decode_issues(spec, used) if decode_images else []
    return read, per_image, decoded, dataset_issues(spec, used, *invalid(read + per_image + decoded))


def used_splits(spec: DatasetSpec, splits: Sequence[str] | None) -> list[str]:
    """Those of ``splits`` that ``spec`` has, in their order (None: all of ``spec``'s)."""
    return list(spec.splits) if splits is None else [s for s in splits if s in spec.splits]


def _stats(spec: DatasetSpec) -> dict[str, dict]:
    stats = {}
    for split, records in spec.splits.items():
        if isinstance(records, RecordTable):  # from its arrays: no records built
            per_class, images_per_class = records.name_counts()
            stats[split] = {"images": len(records), "objects": records.num_objects,
                            "images_without_objects": int((np.diff(records.first) == 0).sum()),
                            "difficult_or_crowd": int(np.count_nonzero(records.flags & IGNORE)),
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


def invalid(issues: list[Issue]) -> tuple[set, set]:
    """(image paths to drop, (image path, object index) pairs to drop) for the error issues."""
    images = {i.image for i in issues if i.severity == "error" and i.object_index is None and i.image is not None}
    objects = {(i.image, i.object_index) for i in issues if i.severity == "error" and i.object_index is not None}
    return images, objects


def decode_issues(spec: DatasetSpec, splits: list[str]) -> list[Issue]:
    """Corrupt/truncated images of ``splits``: a full but cheap decode of each image once (JPEG DCT scaling; a
    truncated file fails it), in chunks on worker processes, one per core, when there are enough images to decode
    (those the dataset index's per-file results answer for cost a look-up) to pay for starting them (small images
    are decoded in less time than the Python around the decode, which holds the GIL: threads would not help),
    with a progress bar on a terminal."""
    records = {r.path: split for split in splits for r in spec.splits[split]}
    paths = list(records)
    chunks = [paths[i:i + DECODE_CHUNK] for i in range(0, len(paths), DECODE_CHUNK)]
    processes = min(usable_cores(), unanswered("decode", paths) // PROCESS_MIN_IMAGES)
    found: list[Issue] = []
    with progress(total=len(paths), desc="checking images", unit="image", disable=None, leave=False) as bar:
        for chunk, failed in zip(chunks, map_in_processes(_failed_decodes, chunks, processes)):
            for path, code, reason in failed:  # ImageError names the file its own way: the reason alone
                rel = relative_path(path, spec.root)
                found.append(Issue("error", code, f"{rel}: {reason}", rel, split=records[path], image=path))
            bar.update(len(chunk))
    return found


def _failed_decodes(paths: list[Path]) -> list[tuple[Path, str, str]]:
    """``(path, code, reason)`` of the images of ``paths`` that :func:`~ssd.data.images.verify_image` refuses."""
    failed = []
    for path in paths:
        try:
            verify_image(path)
        except ImageError as e:
            failed.append((path, e.code, e.reason))
    return failed


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
        raise ConfigError("check_dataset: priors need the image_size their sizes are pixels of (or a model)")
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

    flawed = invalid(issues)[1]
    report.coverage = prior_coverage(spec, priors, image_size, iou_threshold, exclude=flawed, crop_scale=crop_scale)
    low = coverage_issue(report.coverage, str(spec.root))
    suggestion = suggest_image_size(spec, model, image_size, iou_threshold, flawed) if model else None
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
    bad_images, bad_objects = invalid(errors)
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

"""The dataset-wide rules of ``ssd check`` (and so of the training gate): class names, whole splits, classes, and
images shared by train and val.

- Class names: duplicates, empty names and names that are not plain text (:func:`ssd.names.name_problem`: control
  characters, lone surrogates, over :data:`ssd.limits.MAX_NAME_CHARS`) are errors.
- A split that yields no images, no label file for any image, no object, or no trainable object (all difficult or
  crowd) is an error naming what was looked for and where.
- A class with no trainable object in ``train`` is an error when no split has it, a warning when only another split
  (val, test) has it.
- An image of val that is also in train (the same file, or identical bytes): warning.

Only objects and images free of errors count, so ``skip_invalid`` (which drops those) never turns a passing
dataset into one that these rules refuse. Errors of these rules cannot be dropped: :data:`DATASET_RULES`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ssd.data.images import IMAGE_SUFFIXES
from ssd.data.records import DatasetSpec, ImageRecord, Issue, relative_path
from ssd.data.table import IGNORE, RecordTable
from ssd.data.yolo import label_path
from ssd.limits import value_text
from ssd.names import name_problem

__all__ = ["dataset_issues", "DATASET_RULES"]

DATASET_RULES = frozenset({"duplicate_class_names", "empty_class_name", "invalid_class_name", "empty_split",
                           "no_valid_images", "no_labels", "no_objects_in_split", "no_trainable_objects",
                           "class_without_objects"})
"""Error codes about the dataset as a whole (a split, a class): ``skip_invalid`` cannot drop them."""

_LOOKED_FOR = {
    "yolo": f"image files ({', '.join(IMAGE_SUFFIXES)}) in the folders or .txt lists given for it",
    "coco": "entries of 'images' whose image file can be read",
    "voc": "XML annotations with their images (Annotations/ listed by ImageSets/Main/<split>.txt, or XML files "
           "beside the images)",
}


def _place(spec: DatasetSpec, split: str, records: list[ImageRecord]) -> str:
    """Where a split was read from: its description file, else the folder holding its images."""
    if split in spec.sources:
        return str(spec.sources[split])
    if records:
        return relative_path(os.path.commonpath([r.path.parent for r in records]), spec.root)
    return str(spec.root)


def _valid(records: Sequence[ImageRecord], k: int, bad_images: set, bad_objects: set
           ) -> tuple[int, int, np.ndarray, np.ndarray]:
    """``(usable images, their objects, labels [V] and ignore flags [V] of the objects free of errors)``: label in
    ``0..k-1``, box accepted, image readable. A :class:`~ssd.data.table.RecordTable` is counted from its arrays (no
    records built: the dataset index applies these rules after an edit)."""
    if not isinstance(records, RecordTable):
        good = [r for r in records if r.path not in bad_images]
        valid = [o for r in good for i, o in enumerate(r.objects)
                 if 0 <= o.label < k and (r.path, i) not in bad_objects]
        return (len(good), sum(len(r.objects) for r in good), np.array([o.label for o in valid], np.int64),
                np.array([o.ignore for o in valid], bool))
    keep_images, keep_objects = np.ones(len(records), bool), np.ones(records.num_objects, bool)
    if bad_images or bad_objects:
        row = {path: i for i, path in enumerate(records.paths.tolist())}
        keep_images[[row[str(p)] for p in bad_images if str(p) in row]] = False
        keep_objects[[records.first[row[str(p)]] + i for p, i in bad_objects if str(p) in row]] = False
    owned = np.repeat(keep_images, np.diff(records.first))
    valid = owned & keep_objects & (records.labels >= 0) & (records.labels < k)
    return (int(keep_images.sum()), int(owned.sum()), records.labels[valid],
            (records.flags[valid] & IGNORE).astype(bool))


def _unlabelled(records: Sequence[ImageRecord]) -> bool:
    """Whether no image of ``records`` has an annotation file."""
    if isinstance(records, RecordTable):
        return not records.annotations.prefix and not records.annotations.offsets[-1]
    return all(r.annotation is None for r in records)


def _split_issue(spec: DatasetSpec, split: str, bad_images: set, bad_objects: set) -> Issue | None:
    records = spec.splits[split]
    good, flawed, labels, ignore = _valid(records, spec.num_classes, bad_images, bad_objects)

    def error(code: str, text: str) -> Issue:
        place = _place(spec, split, records)  # only for a message: the common folder of every image is a long walk
        return Issue("error", code, f"split {split!r} ({place}): {text}", place, split=split)

    unreadable = sum(i.split == split and i.severity == "error" and i.image is not None for i in spec.issues)
    if not len(records) and unreadable:  # every image failed to decode: not "no images"
        return error("no_valid_images", f"none of its {unreadable} images could be read (see the errors about them)")
    if not len(records):
        return error("empty_split", f"no images: looked for {_LOOKED_FOR.get(spec.format, 'images')}")
    if not good:
        return error("no_valid_images", f"none of its {len(records)} images is usable (see the errors about them)")
    if _unlabelled(records):
        example = relative_path(label_path(records[0].path), spec.root)
        return error("no_labels", f"none of its {len(records)} images has a label file (looked for YOLO .txt "
                     f"labels such as {example}, the last images/ folder replaced by labels/, and for VOC .xml "
                     "files beside the images)")
    if not len(labels):
        return error("no_objects_in_split", f"all {flawed} objects of its images have errors (see them)" if flawed
                     else f"none of its {good} usable images has an object")
    if ignore.all():
        return error("no_trainable_objects", f"all {len(labels)} of its objects are difficult or crowd (training "
                     "leaves them out, evaluation ignores them)")
    return None


def _class_issues(spec: DatasetSpec, bad_images: set, bad_objects: set) -> list[Issue]:
    """Classes without a trainable object in ``train`` (tagged with split ``train``: evaluation does not apply it)."""
    k = spec.num_classes
    _, _, labels, ignore = _valid(spec.records("train"), k, bad_images, bad_objects)
    trained = np.bincount(labels[~ignore], minlength=k)
    elsewhere = {s: np.bincount(_valid(recs, k, bad_images, bad_objects)[2], minlength=k)
                 for s, recs in spec.splits.items() if s != "train"}
    source = str(next(iter(spec.sources.values()), spec.root))
    issues = []
    for label, name in enumerate(spec.class_names):
        if trained[label]:
            continue
        found = [f"{s} ({c[label]})" for s, c in elsewhere.items() if c[label]]
        if found:
            issues.append(Issue("warning", "class_not_trained", f"{source}: class {name!r} has no trainable object "
                                f"in split 'train', only in {', '.join(found)}: the model cannot learn it (move some "
                                "of those images to train)", source, split="train"))
        else:
            issues.append(Issue("error", "class_without_objects", f"{source}: class {name!r} (label {label}) has no "
                                "trainable object in split 'train' nor in any other split (difficult/crowd ones are "
                                "not trained on): annotate some, or remove it from the class names", source,
                                split="train"))
    return issues


def _name_issues(spec: DatasetSpec) -> list[Issue]:
    source = str(next(iter(spec.sources.values()), spec.root))
    names = spec.class_names
    issues = []
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        issues.append(Issue("error", "duplicate_class_names", f"{source}: class names {duplicates} appear more than "
                            f"once in {names}: every class needs a distinct name", source))
    by_case: dict[str, list[str]] = {}
    for name in dict.fromkeys(names):
        by_case.setdefault(name.lower(), []).append(name)
    for variants in (v for v in by_case.values() if len(v) > 1):  # `rbc` and `RBC`: two classes, said so
        issues.append(Issue("warning", "class_names_differ_in_case", f"{source}: class names "
                            f"{', '.join(map(repr, variants))} differ only in case and are {len(variants)} classes; "
                            "rename them to one name if they are the same class", source))
    for index, name in enumerate(names):
        if not name.strip():
            issues.append(Issue("error", "empty_class_name", f"{source}: class name {index} is empty "
                                f"({name!r}): every class needs a name", source))
        elif (problem := name_problem(name)) is not None:
            issues.append(Issue("error", "invalid_class_name", f"{source}: class name {index} "
                                f"{value_text(name)} {problem}", source))
    return issues


def _digest(path: Path, cache: dict) -> str | None:
    if path not in cache:
        try:
            cache[path] = hashlib.sha1(path.read_bytes()).hexdigest()
        except OSError:
            cache[path] = None
    return cache[path]


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _overlap_issues(spec: DatasetSpec) -> list[Issue]:
    """Val images that are also train images: the same path, or identical bytes (only same-size files are read)."""
    train = {r.path for r in spec.splits["train"]}
    by_size: dict[int | None, list[Path]] = {}
    for path in train:
        by_size.setdefault(_size(path), []).append(path)
    digests: dict[Path, str | None] = {}
    issues = []
    for rec in spec.splits["val"]:
        same = rec.path if rec.path in train else None
        for candidate in by_size.get(_size(rec.path), []) if same is None else []:
            if _digest(rec.path, digests) is not None and _digest(candidate, digests) == _digest(rec.path, digests):
                same = candidate
                break
        if same is not None:
            rel = relative_path(rec.path, spec.root)
            issues.append(Issue("warning", "train_val_overlap", f"{rel}: this val image is also a train image "
                                f"({relative_path(same, spec.root)}): val scores on it overestimate accuracy",
                                rel, split="val", image=rec.path))
    return issues


def dataset_issues(spec: DatasetSpec, splits: list[str], bad_images: set, bad_objects: set,
                   overlap: list[Issue] | None = None) -> list[Issue]:
    """The rules above for the ``splits`` read (which exist in ``spec``); ``bad_images`` / ``bad_objects``
    (``(image path, object index)``) are those with errors, left out of every count. ``overlap``: the train/val
    overlap issues when already known (they depend on the image files alone: an edited annotation keeps them)."""
    split_issues = {s: i for s in splits if (i := _split_issue(spec, s, bad_images, bad_objects)) is not None}
    issues = _name_issues(spec) + list(split_issues.values())
    if "train" in splits and "train" not in split_issues:  # a failed train split already says why nothing trains
        issues += _class_issues(spec, bad_images, bad_objects)
    if "train" in splits and "val" in splits:
        issues += _overlap_issues(spec) if overlap is None else overlap
    return issues

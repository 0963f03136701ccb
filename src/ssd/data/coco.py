"""COCO JSON reader.

Categories are mapped to contiguous labels ``0..K-1`` in ascending category id, names kept; the ids themselves are
kept in ``DatasetSpec.category_ids`` (label ``k`` is category ``category_ids[k]``) so results can be written in the
dataset's own ids. ``bbox`` is ``[x, y, w, h]`` in pixels, converted to ``xyxy``; a bbox that only fits the image
when read as ``[x1, y1, x2, y2]`` is an error (never clipped and trained on). ``iscrowd`` annotations are kept as
ignore regions (``ObjectRecord.iscrowd``): never trained on, ignored in evaluation. Image files are looked up
relative to the JSON's folder, its ``images/`` subfolder, or ``../images`` (the usual ``annotations/`` + ``images/``
layout), or ``image_root`` when given.

The file's structure must hold (else ``DataError`` naming the file and the entry): a JSON object with lists
``images`` (objects with ``id`` and ``file_name``, ids unique), ``categories`` (objects with an integer ``id``, unique,
and a ``name``) and ``annotations`` (objects). Defects of single annotations (a bad ``bbox``, an unknown
``image_id``, a non-integer ``id``) are issues for ``check``, as in the other readers.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from ssd.data.images import read_image_size
from ssd.data.records import DatasetSpec, ImageRecord, Issue, ObjectRecord
from ssd.errors import DataError, ImageError

__all__ = ["read_coco", "split_name"]

_TOLERANCE = 1.0  # pixels a box may pass the border before it is taken for xyxy (as check's border rule)


_SPLIT_WORDS = {"val": "val", "valid": "val", "validation": "val", "test": "test", "train": "train"}
"""Whole words of a COCO file name that name its split."""


def split_name(json_path: Path) -> str:
    """``instances_val2017.json`` -> ``val`` (``valid``, ``validation`` too); ``train``/``test`` likewise, as whole
    words of the name (``my_eval.json`` holds no split word); anything else is ``train``."""
    words = re.findall(r"[a-z]+", json_path.stem.lower())  # "instances_val2017" -> instances, val
    return next((_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS), "train")


def _find_image(file_name: str, json_path: Path, image_root: Path | None) -> Path:
    bases = [image_root] if image_root else [json_path.parent, json_path.parent / "images",
                                             json_path.parent.parent / "images", json_path.parent.parent]
    for base in bases:
        if (base / file_name).is_file():
            return base / file_name
    return bases[0] / file_name


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _load(json_path: Path) -> dict:
    """The parsed file, checked to be an object holding the three lists of dicts."""
    try:
        data = json.loads(json_path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(f"{json_path}:{e.lineno}: JSON does not parse ({e.msg})") from e
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: an int of > 4300 digits
        raise DataError(f"{json_path}: cannot read the JSON ({type(e).__name__}: {e})") from e
    if not isinstance(data, dict):
        raise DataError(f"{json_path}: a COCO file is a JSON object with lists 'images', 'annotations' and "
                        f"'categories', not a {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise DataError(f"{json_path}: a COCO file needs a list {key!r}")
        for i, entry in enumerate(data[key]):
            if not isinstance(entry, dict):
                raise DataError(f"{json_path}: {key}[{i}] is {entry!r:.60}, not an object")
    return data


def _categories(data: dict, json_path: Path) -> tuple[list[int], list[str]]:
    """Category ids in ascending order and their names; each needs an integer ``id`` (unique) and a ``name``."""
    seen: dict[int, int] = {}
    for i, cat in enumerate(data["categories"]):
        if not _is_int(cat.get("id")) or not isinstance(cat.get("name"), str) or not cat["name"].strip():
            raise DataError(f"{json_path}: categories[{i}] {cat!r:.80} needs an integer 'id' and a 'name'")
        if cat["id"] in seen:
            raise DataError(f"{json_path}: category id {cat['id']} is listed twice (categories[{seen[cat['id']]}] "
                            f"and categories[{i}])")
        seen[cat["id"]] = i
    cats = sorted(data["categories"], key=lambda c: c["id"])
    return [c["id"] for c in cats], [str(c["name"]) for c in cats]


def _images(data: dict, json_path: Path, image_root: Path | None, split: str,
            issues: list[Issue]) -> dict[int | str, ImageRecord]:
    """Records by image id (readable images only; the others become issues). Ids must be unique."""
    rel = json_path.name
    records: dict[int | str, ImageRecord] = {}
    first: dict[int | str, tuple[int, str]] = {}
    by_path: dict[Path, int | str] = {}
    for i, img in enumerate(data["images"]):
        image_id, file_name = img.get("id"), img.get("file_name")
        if not (_is_int(image_id) or isinstance(image_id, str)) or not isinstance(file_name, str) or not file_name:
            raise DataError(f"{json_path}: images[{i}] {img!r:.80} needs an 'id' (integer or string) and a "
                            "'file_name'")
        if image_id in first:
            j, other = first[image_id]
            raise DataError(f"{json_path}: image id {image_id!r} is listed twice: {other!r} (images[{j}]) and "
                            f"{file_name!r} (images[{i}]); their annotations cannot be told apart (merged files? "
                            "give every image its own id)")
        first[image_id] = (i, file_name)
        if Path(file_name).is_absolute() or ".." in Path(file_name).parts:
            issues.append(Issue("error", "outside_root", f"{rel} image id {image_id!r}: file_name {file_name!r} "
                                "leaves the dataset folder (absolute or ../): images are read from inside it", rel,
                                split=split))
            continue
        path = _find_image(file_name, json_path, image_root)
        if path in by_path:
            issues.append(Issue("error", "duplicate_image", f"{rel} image id {image_id!r}: {file_name!r} is also "
                                f"image id {by_path[path]!r}; one file under two ids would be counted twice", rel,
                                split=split, image=path))
            continue
        by_path[path] = image_id
        try:
            width, height = read_image_size(path)
        except ImageError as e:
            issues.append(Issue("error", e.code, f"{rel} image id {image_id!r}: {e}", rel, split=split, image=path))
            continue
        listed = (img.get("width"), img.get("height"))
        if listed not in ((width, height), (height, width)) and all(_is_int(v) and v > 0 for v in listed):
            issues.append(Issue("warning", "size_mismatch", f"{rel} image id {image_id!r}: listed as "
                                f"{listed[0]}x{listed[1]} but {path.name} is {width}x{height} (bboxes are read in "
                                "the image's pixels; if they were drawn on another version of the picture they are "
                                "misplaced)", rel, split=split, image=path))
        records[image_id] = ImageRecord(path, json_path, [], width, height, image_id)
    return records


def _bbox(bbox) -> tuple[float, float, float, float] | None:
    """The xyxy box of a ``[x, y, w, h]`` bbox (None when it is not four numbers)."""
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                            for v in bbox)):
        return None
    x, y, w, h = (_float(v) for v in bbox)
    return x, y, x + w, y + h


def _looks_xyxy(box: tuple[float, float, float, float], width: int, height: int) -> bool:
    """Whether a box passes the image as ``[x, y, w, h]`` but fits it read as ``[x1, y1, x2, y2]``."""
    x, y, x2, y2 = box
    w, h, tol = x2 - x, y2 - y, _TOLERANCE
    return (x2 > width + tol or y2 > height + tol) and x < w <= width + tol and y < h <= height + tol


def _float(value: int | float) -> float:
    try:
        return float(value)
    except OverflowError:  # a JSON integer beyond float range: infinite, which check reports
        return math.inf if value > 0 else -math.inf


def _add_objects(data: dict, json_path: Path, records: dict, label_of: dict[int, int], names: list[str],
                 split: str, issues: list[Issue]) -> None:
    rel = json_path.name
    listed = {img["id"] for img in data["images"]}
    seen: dict[int, int] = {}  # annotation id -> its index
    for index, ann in enumerate(data["annotations"]):
        ann_id, image_id = ann.get("id"), ann.get("image_id")
        where = f"{rel} annotation id {ann_id}" if _is_int(ann_id) else f"{rel} annotations[{index}]"
        line = ann_id if _is_int(ann_id) else None
        hashable = _is_int(image_id) or isinstance(image_id, str)
        rec = records.get(image_id) if hashable else None
        if rec is None:
            if not hashable or image_id not in listed:  # images listed but unreadable are reported once, above
                issues.append(Issue("error", "parse_error", f"{where}: image_id {image_id!r:.60} is not in 'images'",
                                    rel, line, split=split))
            continue
        parsed = _bbox(ann.get("bbox"))
        problem = (f"bbox {ann.get('bbox')!r:.80} is not [x, y, w, h] numbers" if parsed is None else
                   f"bbox {ann['bbox']} passes the {rec.width}x{rec.height} image as [x, y, width, height] but fits "
                   "it as [x1, y1, x2, y2]; COCO bboxes are [x, y, width, height] (write width = x2 - x1, height = "
                   "y2 - y1)" if _looks_xyxy(parsed, rec.width, rec.height) else
                   f"id {ann_id!r:.60} is not an integer" if not _is_int(ann_id) else
                   f"iscrowd {ann.get('iscrowd')!r:.60} is not 0 or 1" if ann.get("iscrowd", 0) not in (0, 1) else None)
        if not problem and ann_id in seen:
            problem = f"id {ann_id} is also annotations[{seen[ann_id]}] (annotation ids must be unique)"
        if problem:
            issues.append(Issue("error", "parse_error", f"{where}: {problem}", rel, line, split=split,
                                image=rec.path))
            continue
        seen[ann_id] = index
        cat = ann.get("category_id")
        label = label_of.get(cat, -1) if _is_int(cat) else -1
        name = names[label] if label >= 0 else f"category {cat!r:.40}"
        rec.objects.append(ObjectRecord(parsed, label, name, iscrowd=bool(ann.get("iscrowd", 0)), line=ann_id,
                                        source=json_path, where=where, raw=f"bbox {ann['bbox']}"))


def read_coco(json_path: Path, image_root: Path | None = None, split: str | None = None) -> DatasetSpec:
    """Read one COCO JSON as split ``split`` (default from the file name, see :func:`split_name`)."""
    data = _load(json_path)
    category_ids, names = _categories(data, json_path)
    split = split or split_name(json_path)
    issues: list[Issue] = []
    records = _images(data, json_path, image_root, split, issues)
    _add_objects(data, json_path, records, {c: i for i, c in enumerate(category_ids)}, names, split, issues)
    return DatasetSpec(json_path.parent, "coco", names, {split: list(records.values())}, issues, category_ids)

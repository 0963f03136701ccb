"""COCO JSON reader.

Categories are mapped to contiguous labels ``0..K-1`` in ascending category id, names kept; the ids themselves are
kept in ``DatasetSpec.category_ids`` (label ``k`` is category ``category_ids[k]``) so results can be written in the
dataset's own ids. ``bbox`` is ``[x, y, w, h]`` in pixels, converted to ``xyxy``; a bbox that only fits the image
when read as ``[x1, y1, x2, y2]`` is an error (never clipped and trained on). ``iscrowd`` annotations are kept as
ignore regions (``ObjectRecord.iscrowd``): never trained on, ignored in evaluation; ``difficult: 1`` (not COCO's own:
what ``ssd data convert`` writes for VOC's flag) is read as ``ObjectRecord.difficult``, and an annotation's
``attributes`` ``occluded`` / ``truncated`` (true or 1) and ``z_order`` (CVAT's COCO export writes ``occluded``
there) as those of the record. Image files are looked up relative to the JSON's folder, its ``images/`` subfolder,
or ``../images`` (the usual ``annotations/`` + ``images/`` layout), or ``image_root`` when given.

The file's structure must hold (else ``DataError`` naming the file and the entry): a JSON object with lists
``images`` (objects with ``id`` and ``file_name``, ids unique), ``categories`` (objects with an integer ``id``, unique,
and a ``name``) and ``annotations`` (objects). Defects of single annotations (a bad ``bbox``, an unknown
``image_id``, a non-integer ``id``) are issues for ``check``, as in the other readers.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from pathlib import Path

import numpy as np

from ssd.data.images import read_image_size
from ssd.data.memo import cyclic_gc_paused
from ssd.data.records import DatasetSpec, Issue
from ssd.data.table import CROWD, DIFFICULT, OCCLUDED, TRUNCATED, Detail, RecordTable, Strings
from ssd.data.voc import check_class_count
from ssd.errors import DataError, ImageError
from ssd.limits import is_whole

__all__ = ["read_coco", "split_name"]

_TOLERANCE = 1.0  # pixels a box may pass the border before it is taken for xyxy (as check's border rule)


_SPLIT_WORDS = {"val": "val", "valid": "val", "validation": "val", "test": "test", "train": "train"}
"""Whole words of a COCO file name that name its split."""


def split_name(json_path: Path) -> str:
    """``instances_val2017.json`` -> ``val`` (``valid``, ``validation`` too); ``train``/``test`` likewise, as whole
    words of the name (``my_eval.json`` holds no split word); anything else is ``train``."""
    words = re.findall(r"[a-z]+", json_path.stem.lower())  # "instances_val2017" -> instances, val
    return next((_SPLIT_WORDS[w] for w in words if w in _SPLIT_WORDS), "train")


def _find_image(file_name: str, json_path: Path, image_root: Path | None, watched: list[Path]) -> Path:
    """The image's file (the first place it is found); when it is nowhere, every place it was looked for is
    appended to ``watched`` (where it may be put later)."""
    bases = [image_root] if image_root else [json_path.parent, json_path.parent / "images",
                                             json_path.parent.parent / "images", json_path.parent.parent]
    for base in bases:
        if (base / file_name).is_file():
            return base / file_name
    watched += [base / file_name for base in bases]
    return bases[0] / file_name


def _load(json_path: Path) -> dict:
    """The parsed file, checked to be an object holding the three lists of dicts."""
    try:
        with cyclic_gc_paused():
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
    check_class_count(len(data["categories"]), json_path, "categories")
    seen: dict[int, int] = {}
    for i, cat in enumerate(data["categories"]):
        if not is_whole(cat.get("id")) or not isinstance(cat.get("name"), str) or not cat["name"].strip():
            raise DataError(f"{json_path}: categories[{i}] {cat!r:.80} needs an integer 'id' and a 'name'")
        if cat["id"] in seen:
            raise DataError(f"{json_path}: category id {cat['id']} is listed twice (categories[{seen[cat['id']]}] "
                            f"and categories[{i}])")
        seen[cat["id"]] = i
    cats = sorted(data["categories"], key=lambda c: c["id"])
    return [c["id"] for c in cats], [str(c["name"]) for c in cats]


class _Images:
    """The readable images of a file, in its order: ``paths``, ``ids``, ``sizes`` ``(width, height)``; ``row`` maps an
    image id to its index."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.ids: list[int | str] = []
        self.sizes: list[tuple[int, int]] = []
        self.row: dict[int | str, int] = {}

    def add(self, path: Path, image_id: int | str, width: int, height: int) -> None:
        self.row[image_id] = len(self.paths)
        self.paths.append(str(path))
        self.ids.append(image_id)
        self.sizes.append((width, height))


def _images(data: dict, json_path: Path, image_root: Path | None, split: str, issues: list[Issue],
            watched: list[Path]) -> _Images:
    """The readable images (the others become issues). Ids must be unique."""
    rel = json_path.name
    images = _Images()
    first: dict[str, tuple[int, str, int | str]] = {}  # by the id's text: what evaluation tells images apart by
    by_path: dict[Path, int | str] = {}
    for i, img in enumerate(data["images"]):
        image_id, file_name = img.get("id"), img.get("file_name")
        if not (is_whole(image_id) or isinstance(image_id, str)) or not isinstance(file_name, str) or not file_name:
            raise DataError(f"{json_path}: images[{i}] {img!r:.80} needs an 'id' (integer or string) and a "
                            "'file_name'")
        if str(image_id) in first:
            j, other, other_id = first[str(image_id)]
            twice = (f"image id {image_id!r} is listed twice" if other_id == image_id else
                     f"image ids {other_id!r} and {image_id!r} are one id as text, which evaluation and results files "
                     "tell images apart by")
            raise DataError(f"{json_path}: {twice}: {other!r} (images[{j}]) and {file_name!r} (images[{i}]); their "
                            "annotations cannot be told apart (merged files? give every image its own id)")
        first[str(image_id)] = (i, file_name, image_id)
        if Path(file_name).is_absolute() or ".." in Path(file_name).parts:
            issues.append(Issue("error", "outside_root", f"{rel} image id {image_id!r}: file_name {file_name!r} "
                                "leaves the dataset folder (absolute or ../): images are read from inside it", rel,
                                split=split))
            continue
        path = _find_image(file_name, json_path, image_root, watched)
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
        if listed not in ((width, height), (height, width)) and all(is_whole(v) and v > 0 for v in listed):
            issues.append(Issue("warning", "size_mismatch", f"{rel} image id {image_id!r}: listed as "
                                f"{listed[0]}x{listed[1]} but {path.name} is {width}x{height} (bboxes are read in "
                                "the image's pixels; if they were drawn on another version of the picture they are "
                                "misplaced)", rel, split=split, image=path))
        images.add(path, image_id, width, height)
    return images


def _bbox(bbox) -> tuple[float, float, float, float] | None:
    """The xyxy box of a ``[x, y, w, h]`` bbox (None when it is not four numbers)."""
    if type(bbox) is not list or len(bbox) != 4:  # parsed JSON: exact types (bool is no number here)
        return None
    x, y, w, h = bbox
    if type(x) not in _NUMBER or type(y) not in _NUMBER or type(w) not in _NUMBER or type(h) not in _NUMBER:
        return None
    try:
        x, y, w, h = float(x), float(y), float(w), float(h)
    except OverflowError:
        x, y, w, h = (_float(v) for v in bbox)
    return x, y, x + w, y + h


_NUMBER = {int, float}
_ID = {int, str}


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


class _Objects:
    """The accepted annotations as columns (raw values, no per-object records): ``owner`` (image row), ``boxes``
    (xyxy, flat), ``labels``, ``flags`` (bits of :mod:`ssd.data.table`), ``ids``, ``bboxes`` (as written),
    ``unknown`` (a label ``-1``'s name), ``z_order``."""

    def __init__(self) -> None:
        self.owner, self.boxes, self.labels, self.z_order = array("q"), array("d"), array("q"), array("q")
        self.flags, self.ids, self.bboxes, self.unknown = bytearray(), [], [], {}


def _add_objects(data: dict, json_path: Path, images: _Images, label_of: dict[int, int], split: str,
                 issues: list[Issue]) -> _Objects:
    rel = json_path.name
    listed = {img["id"] for img in data["images"]}
    seen: dict[int, int] = {}  # annotation id -> its index
    found = _Objects()
    for index, ann in enumerate(data["annotations"]):
        ann_id, image_id, bbox = ann.get("id"), ann.get("image_id"), ann.get("bbox")
        row = images.row.get(image_id) if type(image_id) in _ID else None
        if row is None:
            if type(image_id) not in _ID or image_id not in listed:  # listed but unreadable: reported once, above
                issues.append(Issue("error", "parse_error", f"{_where(rel, ann_id, index)}: image_id "
                                    f"{image_id!r:.60} is not in 'images'", rel, _line(ann_id), split=split))
            continue
        parsed, (width, height) = _bbox(bbox), images.sizes[row]
        iscrowd, difficult = ann.get("iscrowd", 0), ann.get("difficult", 0)  # difficult: VOC's flag, kept
        attributes = ann.get("attributes")  # CVAT's export: {"occluded": false, ...}; other tools' are not read
        attributes = attributes if type(attributes) is dict else {}
        problem = (f"bbox {bbox!r:.80} is not [x, y, w, h] numbers" if parsed is None else
                   f"bbox {bbox} passes the {width}x{height} image as [x, y, width, height] but fits it as [x1, y1, "
                   "x2, y2]; COCO bboxes are [x, y, width, height] (write width = x2 - x1, height = y2 - y1)"
                   if _looks_xyxy(parsed, width, height) else
                   f"id {ann_id!r:.60} is not an integer" if type(ann_id) is not int else
                   f"iscrowd {ann.get('iscrowd')!r:.60} is not 0 or 1" if iscrowd not in (0, 1) else
                   f"difficult {ann.get('difficult')!r:.60} is not 0 or 1" if difficult not in (0, 1) else
                   f"attributes.z_order {attributes['z_order']!r:.60} is not an integer"
                   if type(attributes.get("z_order", 0)) is not int or abs(attributes.get("z_order", 0)) >= 2**63 else
                   f"id {ann_id} is also annotations[{seen[ann_id]}] (annotation ids must be unique)"
                   if ann_id in seen else None)
        if problem:
            issues.append(Issue("error", "parse_error", f"{_where(rel, ann_id, index)}: {problem}", rel,
                                _line(ann_id), split=split, image=Path(images.paths[row])))
            continue
        seen[ann_id] = index
        cat = ann.get("category_id")
        label = label_of.get(cat, -1) if type(cat) is int else -1
        if label < 0:
            found.unknown[len(found.ids)] = f"category {cat!r:.40}"
        found.owner.append(row)
        found.boxes.extend(parsed)
        found.labels.append(label)
        found.flags.append(CROWD * bool(iscrowd) + DIFFICULT * bool(difficult) + _attribute_flags(attributes))
        found.z_order.append(attributes.get("z_order", 0))
        found.ids.append(ann_id)
        found.bboxes.append(bbox)
    return found


def _attribute_flags(attributes: dict) -> int:
    """The ``OCCLUDED`` / ``TRUNCATED`` bits of an annotation's ``attributes`` (true when ``true`` or ``1``)."""
    return OCCLUDED * (attributes.get("occluded") in (True, 1)) + TRUNCATED * (attributes.get("truncated") in (True, 1))


def _where(rel: str, ann_id, index: int) -> str:
    return f"{rel} annotation id {ann_id}" if is_whole(ann_id) else f"{rel} annotations[{index}]"


def _line(ann_id) -> int | None:
    return ann_id if is_whole(ann_id) else None


def _texts(prefix: str, texts: list[str], count: int | None = None) -> Strings:
    """``prefix`` + each of ``texts`` as :class:`Strings`; ``count`` times ``prefix`` alone when ``texts`` is empty."""
    packed = Strings.pack(texts) if count is None else Strings(np.zeros(0, np.uint8), np.zeros(count + 1, np.int64))
    return Strings(packed.blob, packed.offsets, prefix)


def _table(json_path: Path, images: _Images, found: _Objects, names: list[str]) -> RecordTable:
    """The split as a :class:`RecordTable` built from the columns (boxes float64, as written: messages quote them),
    objects grouped by image in the file's order."""
    owner = np.frombuffer(found.owner, np.int64)
    order = np.argsort(owner, kind="stable") if np.any(owner[1:] < owner[:-1]) else None

    def grouped(column):  # the objects grouped by image, each image's in the file's order
        return column if order is None else column.take(order) if isinstance(column, Strings) else column[order]

    first = np.zeros(len(images.paths) + 1, np.int64)
    np.cumsum(np.bincount(owner, minlength=len(images.paths)), out=first[1:])
    try:
        lines = np.array(found.ids, np.int64)
    except OverflowError:  # an annotation id past 64 bits (the message text keeps it whole)
        lines = np.array([min(max(i, -2**63 + 1), 2**63 - 1) for i in found.ids], np.int64)
    codes = np.frombuffer(found.labels, np.int64).copy()  # into names + the unknown categories' names
    extra: dict[str, int] = {}
    codes[list(found.unknown)] = [extra.setdefault(n, len(names) + len(extra)) for n in found.unknown.values()]
    detail = Detail({"lines": grouped(lines), "names": Strings.pack(names + list(extra)).take(grouped(codes)),
                     "sources": _texts(str(json_path), [], len(owner)),
                     "where": grouped(_texts(f"{json_path.name} annotation id ", list(map(str, found.ids)))),
                     "raw": grouped(_texts("bbox ", list(map(str, found.bboxes)))),
                     "z_order": grouped(np.frombuffer(found.z_order, np.int64))})
    return RecordTable(detail, paths=Strings.pack(images.paths, share_prefix=True),
                       annotations=_texts(str(json_path), [], len(images.paths)),
                       image_ids=Strings.pack(list(map(str, images.ids))),
                       id_is_int=np.array([type(i) is int for i in images.ids], bool),
                       sizes=np.array(images.sizes, np.int64).reshape(-1, 2), first=first,
                       boxes=grouped(np.frombuffer(found.boxes, np.float64).reshape(-1, 4)),
                       labels=grouped(np.frombuffer(found.labels, np.int64)),
                       flags=grouped(np.frombuffer(found.flags, np.uint8).copy()))


def read_coco(json_path: Path, image_root: Path | None = None, split: str | None = None) -> DatasetSpec:
    """Read one COCO JSON as split ``split`` (default from the file name, see :func:`split_name`); the split is a
    :class:`~ssd.data.table.RecordTable` (no per-object records are made)."""
    data = _load(json_path)
    category_ids, names = _categories(data, json_path)
    split = split or split_name(json_path)
    issues: list[Issue] = []
    watched: list[Path] = []
    images = _images(data, json_path, image_root, split, issues, watched)
    found = _add_objects(data, json_path, images, {c: i for i, c in enumerate(category_ids)}, split, issues)
    del data  # the parsed file, before the arrays are made
    return DatasetSpec(json_path.parent, "coco", names, {split: _table(json_path, images, found, names)}, issues,
                       category_ids, watched=watched)

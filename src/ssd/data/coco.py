"""COCO JSON reader.

Categories are mapped to contiguous labels ``0..K-1`` in ascending category id, names kept. ``bbox`` is
``[x, y, w, h]`` in pixels, converted to ``xyxy``. ``iscrowd`` annotations are kept as ignore regions
(``ObjectRecord.iscrowd``): never trained on, ignored in evaluation. Image files are looked up relative to the JSON's
folder, its ``images/`` subfolder, or ``../images`` (the usual ``annotations/`` + ``images/`` layout), or
``image_root`` when given.
"""

from __future__ import annotations

import json
from pathlib import Path

from ssd.data.images import image_size
from ssd.data.records import DataError, DatasetSpec, ImageRecord, Issue, ObjectRecord

__all__ = ["read_coco", "split_name"]


def split_name(json_path: Path) -> str:
    """``instances_val2017.json`` -> ``val``; ``train``/``test`` likewise; anything else is ``train``."""
    stem = json_path.stem.lower()
    for key, split in (("val", "val"), ("test", "test"), ("train", "train")):
        if key in stem:
            return split
    return "train"


def _find_image(file_name: str, json_path: Path, image_root: Path | None) -> Path:
    bases = [image_root] if image_root else [json_path.parent, json_path.parent / "images",
                                             json_path.parent.parent / "images", json_path.parent.parent]
    for base in bases:
        if (base / file_name).is_file():
            return base / file_name
    return bases[0] / file_name


def read_coco(json_path: Path, image_root: Path | None = None, split: str | None = None) -> DatasetSpec:
    """Read one COCO JSON as split ``split`` (default from the file name, see :func:`split_name`)."""
    try:
        data = json.loads(json_path.read_text())
    except json.JSONDecodeError as e:
        raise DataError(f"{json_path}:{e.lineno}: JSON does not parse ({e.msg})") from e
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise DataError(f"{json_path}: a COCO file needs a list {key!r}")
    cats = sorted(data["categories"], key=lambda c: c["id"])
    label_of = {c["id"]: i for i, c in enumerate(cats)}
    names = [str(c["name"]) for c in cats]
    split = split or split_name(json_path)
    rel = json_path.name
    issues: list[Issue] = []
    records: dict[int, ImageRecord] = {}
    listed = {img.get("id") for img in data["images"]}
    for img in data["images"]:
        path = _find_image(str(img["file_name"]), json_path, image_root)
        try:
            width, height = image_size(path)
        except OSError as e:
            issues.append(Issue("error", "missing_image" if not path.exists() else "corrupt_image",
                                f"{rel} image id {img.get('id')}: cannot read {path} ({e})", rel, split=split,
                                image=path))
            continue
        records[img["id"]] = ImageRecord(path, json_path, [], width, height, img["id"])
    for ann in data["annotations"]:
        where = f"{rel} annotation id {ann.get('id')}"
        rec = records.get(ann.get("image_id"))
        if rec is None:
            if ann.get("image_id") not in listed:  # images listed but unreadable are reported once, above
                issues.append(Issue("error", "parse_error", f"{where}: image_id {ann.get('image_id')!r} is not in "
                                    "'images'", rel, ann.get("id"), split=split))
            continue
        bbox = ann.get("bbox")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(isinstance(v, (int, float)) for v in bbox)):
            issues.append(Issue("error", "parse_error", f"{where}: bbox {bbox!r} is not [x, y, w, h] numbers", rel,
                                ann.get("id"), split=split, image=rec.path))
            continue
        x, y, w, h = (float(v) for v in bbox)
        cat = ann.get("category_id")
        label = label_of.get(cat, -1)
        name = names[label] if label >= 0 else f"category {cat}"
        rec.objects.append(ObjectRecord((x, y, x + w, y + h), label, name, iscrowd=bool(ann.get("iscrowd", 0)),
                                        line=int(ann.get("id", 0)), source=json_path, where=where,
                                        raw=f"bbox {bbox}"))
    return DatasetSpec(json_path.parent, "coco", names, {split: list(records.values())}, issues)

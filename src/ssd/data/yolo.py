"""YOLO txt reader (the Ultralytics conventions).

A ``data.yaml`` names ``path`` (dataset root; default: the YAML's folder), ``train``/``val``/``test`` (a folder of
images, a ``.txt`` list of image paths, or a list of those; relative to ``path``) and ``names`` (a list, or a dict
``{id: name}``). Each image ``.../images/x.jpg`` pairs with ``.../labels/x.txt`` (the last ``images`` folder replaced
by ``labels``); each line is ``class cx cy w h`` normalized to ``[0, 1]`` (a polygon ``class x1 y1 x2 y2 ...`` is
read as its bounding box). An empty or missing label file means an image with no objects. Text files may have
Windows line ends or a UTF-8 BOM.

Paths are made absolute without resolving symbolic links: labels are looked up beside the images' path as given
(an ``images/`` folder that links elsewhere still pairs with the ``labels/`` folder beside the link).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import yaml

from ssd.data.images import is_image, read_image_size
from ssd.data.memo import decode_parsed, encode_parsed, remembered
from ssd.data.records import DatasetSpec, ImageRecord, Issue, ObjectRecord, broken_link, relative_path
from ssd.data.voc import check_class_count, read_class_file, read_lines
from ssd.errors import DataError, ImageError
from ssd.limits import MAX_CLASSES, is_whole, value_text
from ssd.text import few
from ssd.yamlfile import safe_load

__all__ = ["read_yolo_yaml", "read_yolo_folder", "read_yolo_record", "label_path", "read_description", "parse_names"]

_SPLITS = {"train": "train", "val": "val", "valid": "val", "test": "test"}


def label_path(image: Path) -> Path:
    """``.../images/a/b.jpg`` -> ``.../labels/a/b.txt`` (Ultralytics pairing; same folder when there is no images/)."""
    parts = list(image.parts)
    if "images" in parts:
        i = len(parts) - 1 - parts[::-1].index("images")
        parts[i] = "labels"
    return Path(*parts).with_suffix(".txt")


def parse_names(raw, source: Path) -> list[str]:
    """The class names of a YAML's ``names`` (a list, or a dict ``{id: name}`` of ids 0..K-1), checked."""
    if isinstance(raw, (dict, list, tuple)):
        check_class_count(len(raw), source, "'names'")
    if isinstance(raw, dict):
        by_id: dict[int, object] = {}
        for key, value in raw.items():  # whole numbers only: 1.5 or True would be cut to a class id silently
            if isinstance(key, str) and key.isdigit() and key.isascii():
                key = int(key)
            if not is_whole(key):
                raise DataError(f"{source}: 'names' key {value_text(key)} is not a class id (keys must be whole "
                                "numbers 0, 1, ...)")
            if key in by_id:
                raise DataError(f"{source}: 'names' key {key} is given twice ({value_text(by_id[key])} and "
                                f"{value_text(value)}): each class id names one class")
            by_id[key] = value
        keys = sorted(by_id)
        if keys != list(range(len(keys))):
            raise DataError(f"{source}: 'names' keys must be 0..{len(keys) - 1} without gaps, got {keys}")
        raw = [by_id[k] for k in keys]
    if not isinstance(raw, (list, tuple)):
        raise DataError(f"{source}: 'names' must be a list or a dict {{id: name}}, got {type(raw).__name__}")
    if not raw:
        raise DataError(f"{source}: 'names' is empty: list the class names (e.g. names: [cat, dog]; label k is the "
                        "k-th name)")
    bad = [n for n in raw if isinstance(n, (list, tuple, dict, bool)) or n is None or not str(n).strip()]
    if bad:
        raise DataError(f"{source}: 'names' must be plain names (text), got {value_text(bad[0])}")
    return [str(n).strip() for n in raw]


def _absolute(path: Path) -> Path:
    """``path`` absolute and normalized, symbolic links kept (labels pair with the image path as given)."""
    return Path(os.path.abspath(path))


def _resolve(root: Path, entry: str) -> Path:
    p = Path(entry)
    p = p if p.is_absolute() else (root / p)
    if not p.exists() and str(entry).startswith("../"):  # Ultralytics' fallback for Roboflow exports
        p = root / str(entry)[3:]
    return _absolute(p)


def _images(entries, root: Path, source: Path, split: str, watched: list[Path]) -> list[Path]:
    """The images a split names (folders, list files); each folder and list file appended to ``watched``."""
    images: list[Path] = []
    for entry in entries if isinstance(entries, (list, tuple)) else [entries]:
        if not (isinstance(entry, str) or is_whole(entry)):  # a folder may be named 2017
            raise DataError(f"{source}: split {split!r} must name image folders or .txt lists of images (text), "
                            f"got {value_text(entry)}")
        try:
            p = _resolve(root, str(entry))
            watched.append(p)
            if p.is_dir():
                images += sorted(q for q in p.rglob("*") if is_image(q))
                continue
            if p.is_file() and p.suffix == ".txt":
                images += [_absolute(p.parent / line) for line in read_lines(p)]
                continue
        except DataError:
            raise
        except (OSError, ValueError) as e:  # a name too long, a NUL byte, a folder that cannot be listed
            raise DataError(f"{source}: split {split!r}: cannot list {value_text(entry)} ({e})") from e
        raise DataError(f"{source}: split {split!r} points to {p}, which does not exist "
                        "(paths are relative to 'path', or to the YAML's folder when 'path' is absent)")
    return images


GLUED_HINT = ("(two lines run together? a label file missing its final newline, then appended to, joins its last "
              "line to the next: put each box on a line of its own)")


def _decimals(token: str) -> int:
    return len(token.partition(".")[2])


def _glued(tokens: list[str], num_classes: int) -> bool:
    """Whether a polygon line is a box line run into the next line: its ``h`` followed by the next class
    (``0.2`` + ``0`` -> ``0.20``) has more decimals than the values mostly have, the extra digits a class id."""
    if len(tokens) < 9 or any(c in t for t in tokens for c in "eE") or "." not in tokens[4]:
        return False
    places = Counter(_decimals(t) for i, t in enumerate(tokens[1:], start=1) if i != 4).most_common(1)[0][0]
    extra = _decimals(tokens[4]) - places
    return extra > 0 and (not num_classes or int(tokens[4][-extra:]) < num_classes)


@remembered("yolo", encode_parsed, decode_parsed)
def parse_label_file(path: Path, rel: str, width: int, height: int, class_names: list[str]):
    """Objects of one label file (pixel xyxy) and the parse problems found (file:line, the bad text, the rule)."""
    objects, issues = [], []
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [], [Issue("error", "parse_error", f"{rel}: cannot read label file ({e})", rel)]
    for number, line in enumerate(lines, start=1):
        tokens = line.split()
        if not tokens:
            continue
        where = f"{rel}:{number}"
        rule = "(YOLO lines are 'class cx cy w h' with an integer class and normalized coordinates)"
        if len(tokens) < 5 or (len(tokens) > 5 and len(tokens) % 2 == 0) or _glued(tokens, len(class_names)):
            hint = f" {GLUED_HINT}" if len(tokens) > 5 else ""
            issues.append(Issue("error", "parse_error", f"{where}: {line.strip()!r} has {len(tokens)} values {rule}"
                                f"{hint}", rel, number))
            continue
        try:
            cls_f = float(tokens[0])
            values = [float(t) for t in tokens[1:]]
        except ValueError:
            issues.append(Issue("error", "parse_error", f"{where}: {line.strip()!r} is not numeric {rule}", rel,
                                number))
            continue
        if not cls_f.is_integer():
            issues.append(Issue("error", "parse_error", f"{where}: class {tokens[0]!r} is not an integer {rule}",
                                rel, number))
            continue
        if len(values) == 4:
            cx, cy, w, h = values
            box = ((cx - w / 2) * width, (cy - h / 2) * height, (cx + w / 2) * width, (cy + h / 2) * height)
        else:  # polygon: its bounding box
            if len(values) == 6:  # more often a box line with two stray values than a triangle
                issues.append(Issue("warning", "short_polygon", f"{where}: {len(tokens)} values are read as a "
                                    "3-point polygon (its bounding box); a box line has 5: 'class cx cy w h'", rel,
                                    number))
            xs, ys = values[0::2], values[1::2]
            box = (min(xs) * width, min(ys) * height, max(xs) * width, max(ys) * height)
        label = int(cls_f)
        if label >= MAX_CLASSES:  # out of range for any dataset, and it may not even fit the index's int64 labels
            issues.append(Issue("error", "label_out_of_range", f"{where}: class {tokens[0]} is out of range (class "
                                f"ids are below {MAX_CLASSES:,}, the most classes a dataset may have; this dataset "
                                f"has {len(class_names)})", rel, number))
            continue
        if label < 0:  # a literal -1 would read as the "unknown name" marker, so it is reported here
            issues.append(Issue("error", "label_out_of_range", f"{where}: class {tokens[0]} is out of range for "
                                f"{len(class_names)} classes {class_names} (classes are 0..{len(class_names) - 1})",
                                rel, number))
            continue
        name = class_names[label] if 0 <= label < len(class_names) else f"class {label}"
        objects.append(ObjectRecord(box, label, name, line=number, source=path, where=where,
                                    raw=" ".join(tokens[1:])))
    return objects, issues


def read_yolo_record(image: Path, split: str, root: Path, class_names: list[str], issues: list[Issue],
                     size: tuple[int, int] | None = None) -> ImageRecord | None:
    """The record of one image and its label file, its problems appended to ``issues``; None when it cannot be read
    (said in ``issues``). The dataset index reads an edited file again with it alone, giving the ``size`` of an
    image it knows unchanged (its header is not read again)."""
    rel = relative_path(image, root)
    lbl = label_path(image)
    rel_lbl = relative_path(lbl, root)
    if why := broken_link(image):
        issues.append(Issue("error", "broken_link", f"{rel}: {why}, so it cannot be read", rel, split=split,
                            image=image))
        return None
    try:
        width, height = read_image_size(image) if size is None else size
        has_label = lbl.is_file()
    except ImageError as e:
        issues.append(Issue("error", e.code, f"{rel}: {e.reason}", rel, split=split, image=image))
        return None
    except PermissionError:  # a labels/ folder without read access: the objects are unknown, not absent
        issues.append(Issue("error", "unreadable_folder", f"{rel}: its label file {rel_lbl} cannot be read: the "
                            f"folder {relative_path(lbl.parent, root)} is not readable (permission denied; give "
                            f"read access: chmod u+rx {lbl.parent})", rel_lbl, split=split, image=image))
        return None
    objects: list[ObjectRecord] = []
    if has_label:
        objects, found = parse_label_file(lbl, rel_lbl, width, height, class_names)
        for issue in found:
            issue.split, issue.image = split, image
        issues.extend(found)
    else:
        issues.append(Issue("warning", "missing_label_file", f"{rel}: no label file {rel_lbl}; "
                            "read as an image without objects", rel_lbl, split=split, image=image))
    return ImageRecord(image, lbl if has_label else None, objects, width, height, image.stem)


def _read_split(images: list[Path], split: str, root: Path, class_names: list[str], issues: list[Issue]
                ) -> Iterator[ImageRecord]:
    """Each image's record, read as it is asked for (issues appended as they are met; the label files without an
    image, after the last)."""
    for image in images:
        if (rec := read_yolo_record(image, split, root, class_names, issues)) is not None:
            yield rec
    expected = {os.fspath(label_path(image)) for image in images}  # text: a Path costs several times its string
    folders = {os.path.dirname(p) for p in expected} - {os.fspath(i.parent) for i in images}  # linear in the images
    for folder in sorted(Path(f) for f in folders if os.path.isdir(f)):  # a labels/ folder: its .txt are all labels
        orphans = sorted(p.name for p in folder.glob("*.txt") if os.fspath(p) not in expected)
        if orphans:
            issues.append(Issue("warning", "label_without_image", f"{relative_path(folder, root)}: "
                                f"{len(orphans)} label file(s) without an image are not read: {few(orphans)}",
                                relative_path(folder, root), split=split))


def read_description(yaml_path: Path):
    """The parsed YAML of a data description; ``DataError`` naming the file (and line) when it cannot be read."""
    try:
        desc = safe_load(yaml_path.read_bytes())  # bytes: PyYAML detects the encoding and skips a BOM
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise DataError(f"{yaml_path}{line}: YAML does not parse ({e})") from e
    except (OSError, RecursionError) as e:
        raise DataError(f"{yaml_path}: cannot read ({type(e).__name__}: {e})") from e
    return desc


def read_yolo_yaml(yaml_path: Path, desc=None, lazy: bool = False) -> DatasetSpec:
    """Read a YOLO dataset described by ``data.yaml`` (splits named there; ``valid`` is renamed ``val``); ``desc``:
    its :func:`read_description` when already read. ``lazy``: each split an iterator that reads an image's labels
    when it is reached (read once, in order; the issues appended meanwhile), so that no record need be held."""
    desc = read_description(yaml_path) if desc is None else desc
    if not isinstance(desc, dict) or "names" not in desc:
        raise DataError(f"{yaml_path}: a YOLO data.yaml needs 'names' (a list of class names) and split folders "
                        "('train', 'val', optionally 'test')")
    names = parse_names(desc["names"], yaml_path)
    nc = desc.get("nc", len(names))
    if not is_whole(nc) or nc != len(names):
        raise DataError(f"{yaml_path}: nc: {value_text(nc)} disagrees with the {len(names)} names {names} (nc is the "
                        "number of names; it may be left out)")
    if not isinstance(desc.get("path") or "", str):
        raise DataError(f"{yaml_path}: 'path' must be a folder (text), got {value_text(desc['path'])}")
    root = _absolute(yaml_path.parent / desc["path"] if desc.get("path") else yaml_path.parent)
    issues: list[Issue] = []
    splits, watched = {}, []
    for key, split in _SPLITS.items():
        if desc.get(key):
            images = _images(desc[key], root, yaml_path, split, watched)
            watched += sorted({label_path(image).parent for image in images})  # a label file added later is seen
            splits[split] = _read_split(images, split, root, names, issues)
    if not splits:
        raise DataError(f"{yaml_path}: no split listed (give at least 'train: images/train')")
    if desc.get("flags"):
        path = root / str(desc["flags"])
        flags, last = _read_flags(yaml_path, path, root), list(splits)[-1]
        splits = {s: _flagged(records, flags, path, s == last) for s, records in splits.items()}
        watched.append(path)
    return DatasetSpec(root, "yolo", names, splits if lazy else {s: list(r) for s, r in splits.items()}, issues,
                       watched=watched)


def _read_flags(yaml_path: Path, path: Path, root: Path) -> dict[tuple[Path, int], tuple[int, dict]]:
    """The ``difficult`` / ``iscrowd`` flags that plain YOLO cannot write, from the ``flags`` file a ``data.yaml``
    names (``ssd data convert`` writes it): a JSON object a line, ``{"file": label file relative to the root,
    "line": its line, "difficult": bool, "iscrowd": bool}``, and ``occluded``, ``truncated`` (bool) and ``z_order``
    (int) when set. Keyed by (label file, line): (the flags file's line, the entry), the last entry of an object
    kept."""
    flags = {}
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise DataError(f"{yaml_path}: flags file {path} cannot be read ({e.strerror})") from e
    for number, text in enumerate(lines, start=1):
        try:
            entry = json.loads(text)
            flags[(_absolute(root / entry["file"]), entry["line"])] = number, entry
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path}:{number}: not a flags line {{\"file\": ..., \"line\": ...}} ({e})") from e
        if not is_whole(entry.get("z_order", 0)):
            raise DataError(f"{path}:{number}: z_order {value_text(entry['z_order'])} is not a whole number")
    return flags


def _flagged(records: Iterable[ImageRecord], flags: dict, path: Path, last: bool) -> Iterator[ImageRecord]:
    """``records`` with the attributes of ``flags`` (:func:`_read_flags`, its entries taken as they are used) set;
    after the ``last`` split, an entry left over is no object of the dataset."""
    for record in records:
        for obj in record.objects:
            if (found := flags.pop((record.annotation, obj.line), None)) is not None:
                entry = found[1]
                obj.difficult, obj.iscrowd = entry.get("difficult") is True, entry.get("iscrowd") is True
                obj.occluded, obj.truncated = entry.get("occluded") is True, entry.get("truncated") is True
                obj.z_order = entry.get("z_order", 0)
        yield record
    if last and flags:
        number, entry = min(flags.values(), key=lambda found: found[0])
        raise DataError(f"{path}:{number}: {entry['file']} line {entry['line']} is no object of the dataset")


def read_yolo_folder(folder: Path) -> DatasetSpec:
    """A folder without YAML: ``images/`` + ``labels/`` (split ``train``) or ``<split>/images`` + ``<split>/labels``.

    Class names come from ``classes.txt`` in the folder, else ``class0..class{max label}``.
    """
    class_file = folder / "classes.txt"
    names = read_class_file(class_file) if class_file.is_file() else []
    split_dirs = {_SPLITS[p.name]: p / "images" for p in sorted(folder.iterdir())
                  if p.name in _SPLITS and (p / "images").is_dir()}
    if not split_dirs:
        split_dirs = {"train": folder / "images"}
    issues: list[Issue] = []
    splits = {s: list(_read_split(sorted(q for q in d.rglob("*") if is_image(q)), s, folder, names, issues))
              for s, d in split_dirs.items()}
    if not names:
        top = max((o.label for recs in splits.values() for r in recs for o in r.objects), default=-1)
        names = [f"class{i}" for i in range(top + 1)]
        for recs in splits.values():
            for r in recs:
                for o in r.objects:
                    o.name = names[o.label] if 0 <= o.label < len(names) else o.name
    return DatasetSpec(folder, "yolo", names, splits, issues)

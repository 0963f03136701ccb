"""YOLO txt reader (the Ultralytics conventions).

A ``data.yaml`` names ``path`` (dataset root; default: the YAML's folder), ``train``/``val``/``test`` (a folder of
images, a ``.txt`` list of image paths, or a list of those; relative to ``path``) and ``names`` (a list, or a dict
``{id: name}``). Each image ``.../images/x.jpg`` pairs with ``.../labels/x.txt`` (the last ``images`` folder replaced
by ``labels``); each line is ``class cx cy w h`` normalized to ``[0, 1]`` (a polygon ``class x1 y1 x2 y2 ...`` is
read as its bounding box). An empty or missing label file means an image with no objects.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ssd.data.images import image_size, is_image
from ssd.data.records import DataError, DatasetSpec, ImageRecord, Issue, ObjectRecord, relative_path

__all__ = ["read_yolo_yaml", "read_yolo_folder", "label_path"]

_SPLITS = {"train": "train", "val": "val", "valid": "val", "test": "test"}


def label_path(image: Path) -> Path:
    """``.../images/a/b.jpg`` -> ``.../labels/a/b.txt`` (Ultralytics pairing; same folder when there is no images/)."""
    parts = list(image.parts)
    if "images" in parts:
        i = len(parts) - 1 - parts[::-1].index("images")
        parts[i] = "labels"
    return Path(*parts).with_suffix(".txt")


def _names(raw, source: Path) -> list[str]:
    if isinstance(raw, dict):
        keys = sorted(int(k) for k in raw)
        if keys != list(range(len(keys))):
            raise DataError(f"{source}: 'names' keys must be 0..{len(keys) - 1} without gaps, got {keys}")
        return [str(raw[k] if k in raw else raw[str(k)]) for k in keys]
    if isinstance(raw, (list, tuple)):
        return [str(n) for n in raw]
    raise DataError(f"{source}: 'names' must be a list or a dict {{id: name}}, got {type(raw).__name__}")


def _resolve(root: Path, entry: str) -> Path:
    p = Path(entry)
    p = p if p.is_absolute() else (root / p)
    if not p.exists() and str(entry).startswith("../"):  # Ultralytics' fallback for Roboflow exports
        p = root / str(entry)[3:]
    return p.resolve()


def _images(entries, root: Path, source: Path, split: str) -> list[Path]:
    images: list[Path] = []
    for entry in entries if isinstance(entries, (list, tuple)) else [entries]:
        p = _resolve(root, str(entry))
        if p.is_dir():
            images += sorted(q for q in p.rglob("*") if is_image(q))
        elif p.is_file() and p.suffix == ".txt":
            for line in p.read_text().splitlines():
                if line.strip():
                    q = Path(line.strip())
                    images.append(q if q.is_absolute() else (p.parent / q).resolve())
        else:
            raise DataError(f"{source}: split {split!r} points to {p}, which does not exist "
                            "(paths are relative to 'path', or to the YAML's folder when 'path' is absent)")
    return images


def parse_label_file(path: Path, rel: str, width: int, height: int, class_names: list[str]):
    """Objects of one label file (pixel xyxy) and the parse problems found (file:line, the bad text, the rule)."""
    objects, issues = [], []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        return [], [Issue("error", "parse_error", f"{rel}: cannot read label file ({e})", rel)]
    for number, line in enumerate(lines, start=1):
        tokens = line.split()
        if not tokens:
            continue
        where = f"{rel}:{number}"
        rule = "(YOLO lines are 'class cx cy w h' with an integer class and normalized coordinates)"
        if len(tokens) < 5 or (len(tokens) > 5 and len(tokens) % 2 == 0):
            issues.append(Issue("error", "parse_error", f"{where}: {line.strip()!r} has {len(tokens)} values {rule}",
                                rel, number))
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
            xs, ys = values[0::2], values[1::2]
            box = (min(xs) * width, min(ys) * height, max(xs) * width, max(ys) * height)
        label = int(cls_f)
        name = class_names[label] if 0 <= label < len(class_names) else f"class {label}"
        objects.append(ObjectRecord(box, label, name, line=number, source=path, where=where,
                                    raw=" ".join(tokens[1:])))
    return objects, issues


def _read_split(images: list[Path], split: str, root: Path, class_names: list[str], issues: list[Issue]):
    records = []
    for image in images:
        rel = relative_path(image, root)
        lbl = label_path(image)
        rel_lbl = relative_path(lbl, root)
        try:
            width, height = image_size(image)
        except OSError as e:
            issues.append(Issue("error", "corrupt_image", f"{rel}: cannot read image ({e})", rel, split=split,
                                image=image))
            continue
        objects: list[ObjectRecord] = []
        if lbl.is_file():
            objects, found = parse_label_file(lbl, rel_lbl, width, height, class_names)
            for issue in found:
                issue.split, issue.image = split, image
            issues.extend(found)
        else:
            issues.append(Issue("warning", "missing_label_file", f"{rel}: no label file {rel_lbl}; "
                                "read as an image without objects", rel_lbl, split=split, image=image))
        records.append(ImageRecord(image, lbl if lbl.is_file() else None, objects, width, height, image.stem))
    return records


def read_yolo_yaml(yaml_path: Path) -> DatasetSpec:
    """Read a YOLO dataset described by ``data.yaml`` (splits named there; ``valid`` is renamed ``val``)."""
    try:
        desc = yaml.safe_load(yaml_path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise DataError(f"{yaml_path}{line}: YAML does not parse ({e})") from e
    if not isinstance(desc, dict) or "names" not in desc:
        raise DataError(f"{yaml_path}: a YOLO data.yaml needs 'names' (a list of class names) and split folders "
                        "('train', 'val', optionally 'test')")
    names = _names(desc["names"], yaml_path)
    if "nc" in desc and (desc["nc"] != len(names) or isinstance(desc["nc"], bool)):
        raise DataError(f"{yaml_path}: nc: {desc['nc']!r} disagrees with the {len(names)} names {names} (nc, when "
                        "given, must be the number of names)")
    root = (yaml_path.parent / str(desc.get("path") or "")).resolve()  # an absolute 'path' replaces the folder
    issues: list[Issue] = []
    splits = {}
    for key, split in _SPLITS.items():
        if desc.get(key):
            splits[split] = _read_split(_images(desc[key], root, yaml_path, split), split, root, names, issues)
    if not splits:
        raise DataError(f"{yaml_path}: no split listed (give at least 'train: images/train')")
    return DatasetSpec(root, "yolo", names, splits, issues)


def read_yolo_folder(folder: Path) -> DatasetSpec:
    """A folder without YAML: ``images/`` + ``labels/`` (split ``train``) or ``<split>/images`` + ``<split>/labels``.

    Class names come from ``classes.txt`` in the folder, else ``class0..class{max label}``.
    """
    class_file = folder / "classes.txt"
    names = [n.strip() for n in class_file.read_text().splitlines() if n.strip()] if class_file.is_file() else []
    split_dirs = {_SPLITS[p.name]: p / "images" for p in sorted(folder.iterdir())
                  if p.name in _SPLITS and (p / "images").is_dir()}
    if not split_dirs:
        split_dirs = {"train": folder / "images"}
    issues: list[Issue] = []
    splits = {s: _read_split(sorted(q for q in d.rglob("*") if is_image(q)), s, folder, names, issues)
              for s, d in split_dirs.items()}
    if not names:
        top = max((o.label for recs in splits.values() for r in recs for o in r.objects), default=-1)
        names = [f"class{i}" for i in range(top + 1)]
        for recs in splits.values():
            for r in recs:
                for o in r.objects:
                    o.name = names[o.label] if 0 <= o.label < len(names) else o.name
    return DatasetSpec(folder, "yolo", names, splits, issues)

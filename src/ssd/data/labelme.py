"""LabelMe JSON reader: a folder of per-image ``.json`` files, as the LabelMe tool saves them beside the images.

Each file is an object with ``shapes`` (each a ``label``, a ``shape_type`` and ``points`` ``[[x, y], ...]`` in
pixels; files of LabelMe before 3.0 have no ``shape_type``: polygons), ``imagePath`` (relative to the JSON's folder;
Windows separators are fine) and ``imageWidth``/``imageHeight``. A ``rectangle`` (two opposite corners, in any order)
and a ``mask`` (its two corners bound the mask) are boxes; a ``polygon`` becomes its bounding box (said once per
dataset: :mod:`ssd.data.shapes`); ``circle``, ``line``, ``point`` and ``linestrip`` have no box and are each a
warning. The image is ``imagePath``, else the file of that name beside the JSON; an image embedded in ``imageData``
only is not read (the message says so). Points are continuous pixel coordinates, as the records' boxes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ssd.data.images import is_image
from ssd.data.memo import decode_parsed, encode_parsed, remembered
from ssd.data.records import ImageRecord, Issue, ObjectRecord, relative_path
from ssd.data.shapes import POLYGON_RAW, bounding_box, find_image, image_size, unlisted_images
from ssd.limits import is_whole

__all__ = ["read_labelme_split", "read_labelme_record", "parse_labelme", "is_labelme"]

_BOXES = {"rectangle": 2, "mask": 2}
"""Shape types that are boxes, and their number of points."""
_RULE = "(LabelMe shapes are {'label': name, 'shape_type': type, 'points': [[x, y], ...]})"


def is_labelme(head: str) -> bool:
    """Whether the start of a JSON file (see :func:`ssd.data.shapes.peek`) is a LabelMe file's."""
    return head.startswith("{") and '"shapes"' in head and '"categories"' not in head


def _points(raw) -> list[tuple[float, float]] | None:
    if not isinstance(raw, list) or not raw:
        return None
    points = []
    for p in raw:
        if (not isinstance(p, list) or len(p) != 2
                or any(type(v) not in (int, float) for v in p)):  # parsed JSON: exact types (bool is no number)
            return None
        points.append((float(p[0]), float(p[1])))
    return points


def _shape(shape, index: int, path: Path, rel: str, objects: list[ObjectRecord], issues: list[Issue]) -> None:
    """The object of ``shapes[index - 1]`` appended to ``objects``, or its issue to ``issues``."""
    label = shape.get("label") if isinstance(shape, dict) else None
    where = f"{rel} shape {index} ({label if isinstance(label, str) and label.strip() else 'no label'})"
    if not isinstance(label, str) or not label.strip():
        issues.append(Issue("error", "parse_error", f"{where}: {shape!r:.80} has no 'label' {_RULE}", rel, index))
        return
    kind = shape.get("shape_type") or "polygon"  # LabelMe < 3.0 wrote polygons only, without a type
    points = _points(shape.get("points"))
    need = _BOXES.get(kind, 3 if kind == "polygon" else None)
    if need is None:
        issues.append(Issue("warning", "shape_not_read", f"{where}: a {kind!r} has no box and is not read (draw a "
                            "rectangle or a polygon)", rel, index))
        return
    if points is None or len(points) < need or (kind in _BOXES and len(points) != need):
        issues.append(Issue("error", "parse_error", f"{where}: points {shape.get('points')!r:.80} are not {need}"
                            f"{' or more' if kind == 'polygon' else ''} [x, y] pairs for a {kind!r} {_RULE}", rel,
                            index))
        return
    raw = f"{POLYGON_RAW if kind == 'polygon' else kind + ' '}{[list(p) for p in points]}"
    objects.append(ObjectRecord(bounding_box(points), -1, label.strip(), line=index, source=path, where=where,
                                raw=raw))


def _encode(parsed: tuple) -> list:
    image, declared, objects, issues = parsed
    return [image, declared, encode_parsed((objects, issues))]


def _decode(stored: list) -> tuple:
    image, declared, parsed = stored
    return (image, None if declared is None else tuple(declared), *decode_parsed(parsed))


@remembered("labelme", _encode, _decode)
def parse_labelme(path: Path, rel: str) -> tuple[str | None, tuple[int, int] | None, list[ObjectRecord],
                                                 list[Issue]]:
    """One LabelMe file: ``(imagePath, (imageWidth, imageHeight) or None, objects, issues)`` (labels left at -1);
    imagePath ``""`` when absent, None when the file itself cannot be read (the issue says why)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        return None, None, [], [Issue("error", "parse_error", f"{rel}:{e.lineno}: JSON does not parse ({e.msg})",
                                      rel, e.lineno)]
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        return None, None, [], [Issue("error", "parse_error", f"{rel}: cannot read ({type(e).__name__}: {e})", rel)]
    if not isinstance(data, dict) or not isinstance(data.get("shapes"), list):
        return None, None, [], [Issue("error", "parse_error", f"{rel}: not a LabelMe file (a JSON object with a "
                                      "list 'shapes' and an 'imagePath')", rel)]
    image = data.get("imagePath") if isinstance(data.get("imagePath"), str) else ""
    size = (data.get("imageWidth"), data.get("imageHeight"))
    declared = size if all(is_whole(v) and v > 0 for v in size) else None
    objects: list[ObjectRecord] = []
    issues: list[Issue] = []
    for index, shape in enumerate(data["shapes"], start=1):
        _shape(shape, index, path, rel, objects, issues)
    if data.get("imageData") and not image:
        issues.append(Issue("error", "missing_image", f"{rel}: the image is embedded in 'imageData' only: save it "
                            "as a file beside the JSON and name it in 'imagePath'", rel))
    return image, declared, objects, issues


def read_labelme_split(folder: Path, root: Path, split: str, issues: list[Issue]) -> list[ImageRecord]:
    """The images of the LabelMe files directly in ``folder``; images without a file are a warning."""
    by_image: dict[Path, str] = {}
    records = [record for path in sorted(p for p in folder.iterdir() if p.suffix.lower() == ".json" and not p.is_dir())
               if (record := read_labelme_record(path, root, split, issues, by_image)) is not None]
    issues += unlisted_images(folder, set(by_image), root, split)
    return records


def read_labelme_record(path: Path, root: Path, split: str, issues: list[Issue],
                        by_image: dict[Path, str] | None = None, size: tuple[int, int] | None = None
                        ) -> ImageRecord | None:
    """The record of one LabelMe file, its problems appended to ``issues``; None when it gives none (said in
    ``issues``). ``by_image``: the files that annotated each image so far (a second one is an error). The dataset
    index reads an edited file again with it alone, giving the ``size`` of an image it knows unchanged."""
    by_image = {} if by_image is None else by_image
    rel = relative_path(path, root)
    reference, declared, objects, found = parse_labelme(path, rel)
    for issue in found:
        issue.split = split
    issues += found
    if reference is None:
        return None  # the file itself failed: said above
    image = find_image(reference, [path.parent]) if reference else None
    image = image or next((p for p in sorted(path.parent.glob(f"{path.stem}.*")) if is_image(p)), None)
    if image is None:
        issues.append(Issue("error", "missing_image", f"{rel}: image {reference!r} not found (imagePath is "
                            f"relative to {relative_path(path.parent, root) or '.'})", rel, split=split))
        return None
    image = Path(os.path.abspath(image))
    if image in by_image:
        issues.append(Issue("error", "duplicate_image", f"{rel}: image {relative_path(image, root)} is also "
                            f"annotated by {by_image[image]}; one picture would be trained on twice", rel,
                            split=split, image=image))
        return None
    by_image[image] = rel
    for issue in found:
        issue.image = image
    known = image_size(image, declared, rel, root, split, issues, size)
    return None if known is None else ImageRecord(image, path, objects, *known)

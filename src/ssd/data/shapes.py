"""What the readers of annotation tools' exports (LabelMe, CVAT, Label Studio) share: shapes to boxes, images found
by name, and the dataset they make.

A polygon (or a mask's outline) becomes its bounding box, marked in the object's ``raw`` text (``polygon ...``) so
that the dataset says once how many were converted (``polygon_as_box``); a shape that has no box (a line, a point) is
a ``shape_not_read`` warning of its own, never dropped silently.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ssd.data.images import is_image, read_image_size
from ssd.data.records import DatasetSpec, ImageRecord, Issue, broken_link, relative_path
from ssd.data.voc import CLASS_FILE, assign_labels, check_class_count, read_class_file
from ssd.errors import DataError, ImageError
from ssd.text import few

__all__ = ["POLYGON_RAW", "bounding_box", "find_image", "image_size", "tool_dataset", "peek", "unlisted_images",
           "polygon_issues"]

POLYGON_RAW = "polygon "
"""How the ``raw`` text of an object read from a polygon starts."""


def peek(path: Path, size: int = 4096) -> str:
    """The start of a text file (BOM and leading blanks removed), to tell formats apart without parsing them."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
    except OSError as e:
        raise DataError(f"{path}: cannot read ({e})") from e
    return head.decode("utf-8", "replace").lstrip("\ufeff \t\r\n")


def bounding_box(points: Sequence[Sequence[float]]) -> tuple[float, float, float, float]:
    """The ``xyxy`` box around ``points`` ``[(x, y), ...]`` (rectangle corners in any order, a polygon)."""
    xs, ys = [float(p[0]) for p in points], [float(p[1]) for p in points]
    return min(xs), min(ys), max(xs), max(ys)


def find_image(reference: str, bases: Sequence[Path]) -> Path | None:
    """The image a tool's ``reference`` (a path, maybe Windows-style, or a bare name) points to: as written under
    each base (or absolute), else by its file name in each base; None when none exists."""
    written = Path(reference.replace("\\", "/"))
    for candidate in ([written] if written.is_absolute() else [b / written for b in bases]):
        if candidate.is_file():
            return Path(os.path.abspath(candidate))
    for base in bases:
        if (base / written.name).is_file():
            return Path(os.path.abspath(base / written.name))
    return None


def image_size(image: Path, declared: tuple | None, rel: str, root: Path, split: str,
               issues: list[Issue], size: tuple[int, int] | None = None) -> tuple[int, int] | None:
    """``(width, height)`` of ``image`` as decoded, or None with the issue said (a broken link, an unreadable
    image). ``declared``: the size the annotation states, a warning when it differs (other than by an EXIF
    rotation) since the boxes were probably drawn on another version of the picture; ``size``: the image's size
    when known (the dataset index's, of an unchanged image: its header is not read again)."""
    rel_image = relative_path(image, root)
    if why := broken_link(image):
        issues.append(Issue("error", "broken_link", f"{rel_image}: {why}, so it cannot be read", rel_image,
                            split=split, image=image))
        return None
    try:
        width, height = read_image_size(image) if size is None else size
    except ImageError as e:
        issues.append(Issue("error", e.code, f"{rel_image}: {e.reason}", rel_image, split=split, image=image))
        return None
    if declared is not None and declared not in ((width, height), (height, width)):
        issues.append(Issue("warning", "size_mismatch", f"{rel}: says the image is {declared[0]}x{declared[1]} but "
                            f"{rel_image} is {width}x{height} (boxes are read in the image's pixels; if they were "
                            "drawn on another version of the picture they are misplaced)", rel, split=split,
                            image=image))
    return width, height


def unlisted_images(folder: Path, listed: set[Path], root: Path, split: str) -> list[Issue]:
    """A warning naming the images of ``folder`` that no annotation lists (not part of the dataset)."""
    unread = sorted(p.name for p in folder.iterdir() if is_image(p) and Path(os.path.abspath(p)) not in listed)
    if not unread:
        return []
    rel = relative_path(folder, root)
    return [Issue("warning", "image_without_annotation", f"{rel}: {len(unread)} image(s) without an annotation are "
                  f"not read: {few(unread)}", rel, split=split)]


def _polygon_summary(splits: dict[str, list[ImageRecord]], fmt: str) -> list[Issue]:
    return polygon_issues([o.where for records in splits.values() for r in records for o in r.objects
                           if o.raw.startswith(POLYGON_RAW)], fmt)


def polygon_issues(converted: list[str], fmt: str) -> list[Issue]:
    """The one warning that names the polygons read as boxes (``converted``: their locations, in reading order)."""
    if not converted:
        return []
    return [Issue("warning", "polygon_as_box", f"{len(converted)} polygon(s) of the {fmt} annotations are read as "
                  f"their bounding boxes (this detector learns boxes): {few(converted)}", converted[0])]


def tool_dataset(root: Path, fmt: str, splits: dict[str, list[ImageRecord]], issues: list[Issue],
                 names: list[str] | None = None) -> DatasetSpec:
    """The dataset of a tool's splits: class names ``names``, else from ``classes.txt`` in ``root``, else the sorted
    names of the objects; labels assigned; the polygons converted said once."""
    records = [r for recs in splits.values() for r in recs]
    class_file = root / CLASS_FILE
    if names is None:
        names = read_class_file(class_file) if class_file.is_file() else sorted({o.name for r in records
                                                                                  for o in r.objects})
    check_class_count(len(names), root, "different object names")
    assign_labels(records, names)
    return DatasetSpec(root, fmt, names, splits, issues + _polygon_summary(splits, fmt))

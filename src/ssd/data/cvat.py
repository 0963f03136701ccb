"""CVAT XML reader ("CVAT for images 1.1" and "CVAT for video 1.1": ``annotations.xml``).

Images: each ``<image id name width height>`` holds ``<box label xtl ytl xbr ybr occluded z_order>`` (pixels,
continuous, as the records' boxes) and ``<polygon label points="x,y;x,y;...">`` (its bounding box, said once per
dataset: :mod:`ssd.data.shapes`); ``occluded`` and ``z_order`` are kept on the records. Video: each ``<track id
label>`` holds a shape per frame (``<box frame outside ...>``; ``outside="1"``: the object has left the picture, no
object) and the frames are images named as CVAT exports them, ``frame_000000.png`` (the frame number in six
digits, any image suffix). Other shapes (polylines, points, ellipses, cuboids, masks, skeletons, tags) are a
``shape_not_read`` warning each. Class names: the labels of ``<meta>`` (``task``, ``project`` or ``job``), in
CVAT's order, else ``classes.txt``, else the sorted names read. Images are looked up by their name under the image
folder given, else ``images/`` beside the XML, the XML's folder and the dataset's folder (and its ``images/``).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from pathlib import Path

from ssd.data.images import is_image
from ssd.data.records import ImageRecord, Issue, ObjectRecord, relative_path
from ssd.data.shapes import POLYGON_RAW, bounding_box, find_image, image_size
from ssd.data.voc import xml_problem
from ssd.errors import DataError

__all__ = ["read_cvat_split", "cvat_labels", "is_cvat"]

_RULE = "(CVAT boxes are <box label= xtl= ytl= xbr= ybr=> in pixels)"
_FRAME = re.compile(r"^frame_(\d{6,})$")
_FLAGS = {"0": False, "1": True}


def is_cvat(head: str) -> bool:
    """Whether the start of an XML file (see :func:`ssd.data.shapes.peek`) is a CVAT file's."""
    return re.search(r"<annotations[\s>]", head) is not None


def _parse(xml_path: Path) -> ET.Element:
    try:
        root = ET.parse(xml_path).getroot()
    except ET.ParseError as e:
        line = f":{e.position[0]}" if e.position else ""
        raise DataError(f"{xml_path}{line}: {xml_problem(e)}") from e
    except OSError as e:
        raise DataError(f"{xml_path}: cannot read ({e})") from e
    if root.tag != "annotations":
        raise DataError(f"{xml_path}: the root element is <{root.tag}>, not <annotations> (a CVAT for images or "
                        "video 1.1 file)")
    return root


def cvat_labels(root: ET.Element) -> list[str] | None:
    """The label names ``<meta>`` lists (a task's, a project's or a job's), in order; None when it lists none."""
    names = [(label.findtext("name") or "").strip() for label in root.iterfind("meta/*/labels/label")]
    return [n for n in names if n] or None


def _numbers(element: ET.Element) -> tuple[tuple[float, float, float, float], str]:
    """The box of a ``<box>`` or ``<polygon>`` and its text as written; ``ValueError`` saying what is wrong."""
    if element.tag == "box":
        written = [element.get(k) for k in ("xtl", "ytl", "xbr", "ybr")]
        raw = " ".join(f"{k}={v!r}" for k, v in zip(("xtl", "ytl", "xbr", "ybr"), written))
        try:
            return tuple(float(v) for v in written), raw
        except (TypeError, ValueError):
            raise ValueError(f"{raw} are not four numbers") from None
    points = element.get("points") or ""
    try:
        pairs = [tuple(float(v) for v in p.split(",")) for p in points.split(";")]
    except ValueError:
        pairs = []
    if len(pairs) < 3 or any(len(p) != 2 for p in pairs):
        raise ValueError(f"points {points!r:.60} are not 3 or more 'x,y' pairs")
    return bounding_box(pairs), f"{POLYGON_RAW}{points}"


def _shape(element: ET.Element, index: int, where: str, rel: str, source: Path, objects: list[ObjectRecord],
           issues: list[Issue]) -> None:
    """The object of a ``<box>`` or ``<polygon>`` appended to ``objects``, or its issue to ``issues``."""
    label = (element.get("label") or "").strip()
    where = f"{where} {element.tag} {index} ({label or 'no label'})"
    if element.tag not in ("box", "polygon"):
        issues.append(Issue("warning", "shape_not_read", f"{where}: a <{element.tag}> has no box and is not read "
                            "(draw a box or a polygon)", rel, index))
        return
    z_order = element.get("z_order", "0")
    try:
        if not label:
            raise ValueError("has no label")
        box, raw = _numbers(element)
        if not re.fullmatch(r"-?\d+", z_order):
            raise ValueError(f"z_order={z_order!r} is not an integer")
    except ValueError as e:
        issues.append(Issue("error", "parse_error", f"{where}: {e} {_RULE}", rel, index))
        return
    occluded = element.get("occluded", "0")
    if occluded not in _FLAGS:
        issues.append(Issue("warning", "bad_flag", f"{where}: occluded={occluded!r} is read as 0 (write 0 or 1)",
                            rel, index, object_index=len(objects)))
    objects.append(ObjectRecord(box, -1, label, line=index, source=source, where=where, raw=raw,
                                occluded=_FLAGS.get(occluded, False), z_order=int(z_order)))


def _frame_images(bases: list[Path]) -> dict[int, Path]:
    """The frames CVAT exported (``frame_000123.png``) in ``bases``, by frame number (the first base that has it)."""
    frames: dict[int, Path] = {}
    for base in bases:
        for path in sorted(base.iterdir()) if base.is_dir() else []:
            if (match := _FRAME.match(path.stem)) and is_image(path):
                frames.setdefault(int(match[1]), Path(os.path.abspath(path)))
    return frames


def _tracks(root: ET.Element, rel: str, source: Path,
            issues: list[Issue]) -> dict[int, tuple[list[ObjectRecord], list[Issue]]]:
    """The objects of every frame of the video's tracks and their issues (shapes ``outside`` the picture left out)."""
    frames: dict[int, tuple[list[ObjectRecord], list[Issue]]] = {}
    for track in root.iter("track"):
        where = f"{rel} track {track.get('id')}"
        for element in track:
            if element.get("outside") == "1" or element.tag == "attribute":
                continue
            frame = element.get("frame", "")
            if not frame.isdigit():
                issues.append(Issue("error", "parse_error", f"{where}: <{element.tag} frame={frame!r}> is not a "
                                    "frame number", rel))
                continue
            element.set("label", track.get("label") or "")
            objects, found = frames.setdefault(int(frame), ([], []))
            _shape(element, len(objects) + len(found) + 1, f"{where} frame {frame}", rel, source, objects, found)
    return frames


def _image_file(name: str, bases: list[Path]) -> Path | None:
    """An image's file by its CVAT name; a name without a suffix (a video's frame) by its stem."""
    found = find_image(name, bases)
    if found is None and not Path(name).suffix:
        found = next((Path(os.path.abspath(p)) for b in bases if b.is_dir()
                      for p in sorted(b.glob(f"{Path(name).name}.*")) if is_image(p)), None)
    return found


def read_cvat_split(xml_path: Path, root: Path, split: str, issues: list[Issue],
                    image_root: Path | None = None) -> tuple[list[ImageRecord], list[str] | None]:
    """The images (or video frames) of one CVAT file as split ``split`` (see the module docstring), and the labels
    its ``<meta>`` lists (None: none)."""
    tree = _parse(xml_path)
    rel = relative_path(xml_path, root)
    here = xml_path.parent
    bases = [image_root] if image_root else list(dict.fromkeys([here / "images", here, root / "images", root]))
    entries: list[tuple[str, object, Path | None, tuple | None, list[ObjectRecord], list[Issue]]] = []
    for image in tree.iter("image"):
        name, found = image.get("name") or "", []
        objects: list[ObjectRecord] = []
        where = f"{rel} image {image.get('id')} ({name})"
        for index, element in enumerate((e for e in image if e.tag != "attribute"), start=1):
            _shape(element, index, where, rel, xml_path, objects, found)
        width, height = image.get("width", ""), image.get("height", "")
        declared = (int(width), int(height)) if width.isdigit() and height.isdigit() else None
        image_id = int(image.get("id")) if (image.get("id") or "").isdigit() else name
        entries.append((where, image_id, _image_file(name, bases), declared, objects, found))
    frames = _tracks(tree, rel, xml_path, issues)
    if frames or not entries:
        files = _frame_images(bases)
        for frame in sorted(frames.keys() | files.keys()):
            entries.append((f"{rel} frame {frame}", frame, files.get(frame), None, *frames.get(frame, ([], []))))
    records, by_image = [], {}
    for where, image_id, path, declared, objects, found in entries:
        if path is None:
            issues.append(Issue("error", "missing_image", f"{where}: image not found in "
                                f"{', '.join(str(b) for b in bases)}", rel, split=split))
            continue
        if path in by_image:
            issues.append(Issue("error", "duplicate_image", f"{where}: image {relative_path(path, root)} is also "
                                f"{by_image[path]}; one picture would be trained on twice", rel, split=split,
                                image=path))
            continue
        by_image[path] = where
        for issue in found:
            issue.split, issue.image = split, path
        issues += found
        size = image_size(path, declared, where, root, split, issues)
        if size is not None:
            records.append(ImageRecord(path, xml_path, objects, *size, image_id=image_id))
    return records, cvat_labels(tree)

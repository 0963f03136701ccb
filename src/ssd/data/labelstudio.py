"""Label Studio JSON export reader: a list of tasks, each ``data.image`` (the image's reference) and the
``annotations`` people made (each a ``result`` list).

A result of type ``rectanglelabels`` has ``value`` ``x``, ``y``, ``width``, ``height`` in percent of the image
(``original_width``/``original_height``; the image's decoded size is used, a warning when they differ), its
``rectanglelabels`` (one name) and a ``rotation`` in degrees about the box's top-left corner: a quarter turn keeps the
box a box (read exactly), any other angle is a ``rotated_box`` error (never straightened silently; ``--skip-invalid``
leaves that object out). ``polygonlabels`` become their bounding boxes (:mod:`ssd.data.shapes`); other result types
are a ``shape_not_read`` warning each. A task's last annotation that was not cancelled is read (several: a
warning); a task with predictions only (``ssd predict --format labelstudio`` writes those) was never corrected and
is not read: its count is a warning, and an export holding no annotation at all is refused.

Images: ``data.image`` is a path as ``ssd predict`` wrote it, or a Label Studio URL (``/data/upload/<project>/
<8 hex>-<name>``, ``/data/local-files/?d=<path>``, ``http(s)://``, ``s3://``); it is looked up as written, then by
its file name (an upload's also without Label Studio's prefix) in the image folder given, else in the JSON's folder,
the dataset's folder (where split folders hold the exports) and their ``images/`` subfolders. Images not found are
each a ``missing_image`` error.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from ssd.data.records import ImageRecord, Issue, ObjectRecord, relative_path
from ssd.data.shapes import POLYGON_RAW, bounding_box, find_image, image_size
from ssd.errors import DataError
from ssd.text import few

__all__ = ["read_labelstudio_split", "image_names"]

_UPLOAD_PREFIX = re.compile(r"^[0-9a-f]{8}-")
"""Label Studio names an uploaded file ``<8 hex digits>-<its name>``."""
_RULE = ("(Label Studio rectangles are 'value': {'x', 'y', 'width', 'height' in percent, 'rotation', "
         "'rectanglelabels': [name]})")


def image_names(reference: str) -> list[str]:
    """The paths a task's ``data.image`` may name, most specific first: the ``d`` of a local-files URL, an upload's
    file name and that name without Label Studio's prefix, a URL's last part, or the path as written."""
    url = urlsplit(reference)
    if url.path.rstrip("/").endswith("/data/local-files") and "d" in parse_qs(url.query):
        return [parse_qs(url.query)["d"][0]]
    if url.scheme in ("http", "https", "s3", "gs", "azure-blob") or url.path.startswith("/data/"):
        name = unquote(url.path.rsplit("/", 1)[-1])
        stripped = _UPLOAD_PREFIX.sub("", name)
        return [name] + ([stripped] if stripped != name else [])
    return [reference]


def _load(json_path: Path) -> list:
    try:
        tasks = json.loads(json_path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise DataError(f"{json_path}:{e.lineno}: JSON does not parse ({e.msg})") from e
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DataError(f"{json_path}: cannot read the JSON ({type(e).__name__}: {e})") from e
    if not isinstance(tasks, list):
        raise DataError(f"{json_path}: a Label Studio export is a JSON list of tasks (Export > JSON), not a "
                        f"{type(tasks).__name__}")
    return tasks


def _numbers(value: dict, keys: tuple[str, ...]) -> list[float] | None:
    values = [value.get(k, 0 if k == "rotation" else None) for k in keys]
    if any(type(v) not in (int, float) or not math.isfinite(v) for v in values):  # bool is no number here
        return None
    return [float(v) for v in values]


def _rectangle(value: dict, width: int, height: int) -> tuple[tuple[float, float, float, float], bool] | None:
    """The pixel box of a rectangle ``value`` and whether it is straight (rotated by a multiple of 90 degrees)."""
    numbers = _numbers(value, ("x", "y", "width", "height", "rotation"))
    if numbers is None:
        return None
    x, y, w, h, rotation = numbers
    x, y, w, h = x * width / 100, y * height / 100, w * width / 100, h * height / 100
    turn = math.radians(rotation)
    cos, sin = math.cos(turn), math.sin(turn)
    quarter = rotation % 90 == 0
    if quarter:  # exact corners: cos and sin of a quarter turn are 0 or +-1
        cos, sin = round(cos), round(sin)
    corners = [(x + a * cos - b * sin, y + a * sin + b * cos) for a, b in ((0, 0), (w, 0), (0, h), (w, h))]
    return bounding_box(corners), quarter


def _result(result, index: int, where: str, size: tuple[int, int], objects: list[ObjectRecord],
            issues: list[Issue], rel: str, source: Path) -> None:
    """The object of one result appended to ``objects``, or its issue to ``issues``."""
    kind = result.get("type") if isinstance(result, dict) else None
    value = result.get("value") if isinstance(result, dict) else None
    where = f"{where} result {result.get('id', index) if isinstance(result, dict) else index}"
    if kind not in ("rectanglelabels", "polygonlabels"):
        issues.append(Issue("warning", "shape_not_read", f"{where}: a {kind!r:.40} result has no box and is not read "
                            "(boxes are rectanglelabels)", rel, index))
        return
    names = value.get(kind) if isinstance(value, dict) else None
    if not isinstance(names, list) or len(names) != 1 or not isinstance(names[0], str) or not names[0].strip():
        issues.append(Issue("error", "parse_error", f"{where}: {kind} {names!r:.60} is not one name {_RULE}", rel,
                            index))
        return
    name = names[0].strip()
    where = f"{where} ({name})"
    width, height = size
    if kind == "polygonlabels":
        points = value.get("points")
        if not isinstance(points, list) or len(points) < 3 or any(
                not isinstance(p, list) or len(p) != 2 or type(p[0]) not in (int, float)
                or type(p[1]) not in (int, float) for p in points):
            issues.append(Issue("error", "parse_error", f"{where}: points {points!r:.60} are not 3 or more [x, y] "
                                "pairs in percent", rel, index))
            return
        box = bounding_box([(px * width / 100, py * height / 100) for px, py in points])
        objects.append(ObjectRecord(box, -1, name, line=index, source=source, where=where,
                                    raw=f"{POLYGON_RAW}{points}"))
        return
    rectangle = _rectangle(value, width, height)
    raw = " ".join(f"{k}={value.get(k)!r}" for k in ("x", "y", "width", "height", "rotation") if k in value)
    if rectangle is None:
        issues.append(Issue("error", "parse_error", f"{where}: {raw or value!r:.80} are not numbers {_RULE}", rel,
                            index))
        return
    box, straight = rectangle
    if not straight:
        issues.append(Issue("error", "rotated_box", f"{where}: the box is rotated by {value['rotation']:g} degrees; "
                            "this detector learns upright boxes (draw it unrotated, or --skip-invalid leaves it out)",
                            rel, index, object_index=len(objects)))
    objects.append(ObjectRecord(box, -1, name, line=index, source=source, where=where, raw=raw))


def _annotation(task: dict, where: str, rel: str, issues: list[Issue]) -> dict | None:
    """The annotation of a task that is read: its last one not cancelled (several: a warning)."""
    annotations = [a for a in task.get("annotations") or [] if isinstance(a, dict) and not a.get("was_cancelled")]
    if len(annotations) > 1:
        issues.append(Issue("warning", "several_annotations", f"{where}: {len(annotations)} annotations; the last "
                            f"(id {annotations[-1].get('id')}) is read", rel))
    return annotations[-1] if annotations else None


def read_labelstudio_split(json_path: Path, root: Path, split: str, issues: list[Issue],
                           image_root: Path | None = None) -> tuple[list[ImageRecord], None]:
    """The annotated tasks of one export as split ``split`` (see the module docstring), and None: an export declares
    no class list."""
    rel = relative_path(json_path, root)
    bases = [image_root] if image_root else list(dict.fromkeys([json_path.parent, json_path.parent / "images", root,
                                                                root / "images"]))
    records, unannotated = [], []
    by_image: dict[Path, str] = {}
    for index, task in enumerate(_load(json_path)):
        where = f"{rel} task {task.get('id', f'[{index}]') if isinstance(task, dict) else f'[{index}]'}"
        data = task.get("data") if isinstance(task, dict) else None
        reference = data.get("image") if isinstance(data, dict) else None
        if not isinstance(reference, str) or not reference:
            issues.append(Issue("error", "parse_error", f"{where}: no image ('data': {{'image': ...}}) in "
                                f"{task!r:.80}", rel, index + 1, split=split))
            continue
        found: list[Issue] = []
        annotation = _annotation(task, where, rel, found)
        if annotation is None:
            unannotated.append(where)
            continue
        if "frame" in data:
            issues.append(Issue("error", "video_frame", f"{where}: frame {data['frame']} of the video {reference}: "
                                "video frames are not read (save the frames as images)", rel, index + 1, split=split))
            continue
        image = next((p for name in image_names(reference) if (p := find_image(name, bases))), None)
        if image is None:
            issues.append(Issue("error", "missing_image", f"{where}: image {reference!r} not found (looked for "
                                f"{' or '.join(map(repr, image_names(reference)))} in "
                                f"{', '.join(str(b) for b in bases)})", rel, index + 1, split=split))
            continue
        results = annotation.get("result") or []
        first = next((r for r in results if isinstance(r, dict) and "original_width" in r), {})
        declared = (first.get("original_width"), first.get("original_height")) if first else None
        if image in by_image:
            issues.append(Issue("error", "duplicate_image", f"{where}: image {relative_path(image, root)} is also "
                                f"{by_image[image]}; one picture would be trained on twice", rel, index + 1,
                                split=split, image=image))
            continue
        by_image[image] = where
        size = image_size(image, declared, where, root, split, issues)
        if size is None:
            continue
        objects: list[ObjectRecord] = []
        for number, result in enumerate(results, start=1):
            _result(result, number, where, size, objects, found, rel, json_path)
        for issue in found:
            issue.split, issue.image = split, image
        issues += found
        task_id = task.get("id")
        records.append(ImageRecord(image, json_path, objects, *size,
                                   image_id=task_id if type(task_id) in (int, str) else image.stem))
    if unannotated:
        issues.append(Issue("warning", "not_annotated", f"{rel}: {len(unannotated)} task(s) without an annotation "
                            f"are not read (predictions are not ground truth: correct them in Label Studio, then "
                            f"export): {few(unannotated)}", rel, split=split))
    if not records and unannotated:
        raise DataError(f"{json_path}: none of its {len(unannotated)} task(s) has an annotation (predictions, as "
                        "ssd predict --format labelstudio writes them, are not ground truth: import the file into "
                        "Label Studio, correct and submit the tasks, then export them as JSON)")
    return records, None


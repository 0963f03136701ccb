"""The detections file of ``ssd predict --format``, assembled from the run's JSONL records one at a time.

Each format is written through :func:`ssd.files.atomic_write` (never half a file) from an iterator of records (what
:func:`ssd.inference.writers.read_jsonl` yields: ``file``, ``width``, ``height``, ``frame`` for video frames,
``detections`` of ``box`` xyxy pixels, ``score``, ``label``, ``name`` and ``track_id`` when tracking), so memory
stays flat in the number of images:

- ``json``: ``predictions.json``, ``{"class_names": [...], "images": [record, ...]}``.
- ``coco``: ``predictions_coco.json``, COCO detection results (:func:`~ssd.inference.coco_results.to_coco_detections`;
  ``image_id`` the record's index, ``category_id`` the dataset's id when the model stores them, else the label).
- ``csv``: ``predictions.csv``, one row per detection (an image without any: one row with empty detection cells);
  a file or class name that a spreadsheet would run as a formula starts with ``'`` (:func:`csv_text`).
- ``labelstudio``: ``predictions_labelstudio.json``, Label Studio tasks to import with their pre-annotations:
  ``data.image`` what Label Studio's local-files storage serves (:func:`local_files_url`; a video frame's own image
  file, which the writer saves), ``predictions[0].result`` rectangle labels in percent of the image; a record
  without an image file (in memory, a frame past ``limits.MAX_SAVED_FRAMES``) has no task.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO
from urllib.parse import quote

from ssd.errors import ConfigError
from ssd.files import atomic_write
from ssd.inference.coco_results import to_coco_detections

__all__ = ["FORMATS", "CSV_COLUMNS", "URL_SCHEMES", "check_format", "csv_text", "local_files_url", "ls_folder",
           "write_results"]

FORMATS = {"json": "predictions.json", "coco": "predictions_coco.json", "csv": "predictions.csv",
           "labelstudio": "predictions_labelstudio.json"}
CSV_COLUMNS = ("file", "frame", "width", "height", "label", "name", "score", "x1", "y1", "x2", "y2")
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise ConfigError(f"unknown results format {fmt!r} (choose {', '.join(FORMATS)})")


def _json_list(f: IO[str], items: Iterable) -> None:
    """``items`` as a JSON list, one item a line, written as they come."""
    f.write("[")
    for index, item in enumerate(items):
        f.write(("," if index else "") + "\n" + json.dumps(item))
    f.write("\n]\n")


def _write_json(f: IO[str], records: Iterable[dict], class_names: list[str], **_) -> None:
    f.write('{"class_names": ' + json.dumps(class_names) + ', "images": ')
    _json_list(f, records)
    f.write("}\n")


def _coco(records: Iterable[dict], category_ids: list[int] | None) -> Iterable[dict]:
    for index, record in enumerate(records):
        detections = record["detections"]
        yield from to_coco_detections([{"boxes": [d["box"] for d in detections],
                                        "scores": [d["score"] for d in detections],
                                        "labels": [d["label"] for d in detections]}],
                                      image_ids=[index], category_ids=category_ids)


def _write_coco(f: IO[str], records: Iterable[dict], category_ids: list[int] | None, **_) -> None:
    _json_list(f, _coco(records, category_ids))


def csv_text(text: str) -> str:
    """A text cell that a spreadsheet shows as text, never runs as a formula: one that starts with ``=``, ``+``,
    ``-``, ``@``, a tab or a carriage return gets a leading ``'``, as OWASP's CSV injection page recommends (the
    csv module quotes the cell as needed)."""
    return "'" + text if text[:1] in _FORMULA_STARTS else text


def _write_csv(f: IO[str], records: Iterable[dict], tracked: bool, **_) -> None:
    writer = csv.writer(f)
    writer.writerow(CSV_COLUMNS + ("track_id",) * tracked)
    for record in records:
        image = [csv_text(record["file"]), record.get("frame", ""), record["width"], record["height"]]
        if not record["detections"]:
            writer.writerow(image + [""] * (len(CSV_COLUMNS) - len(image) + tracked))
        for d in record["detections"]:
            track = [d.get("track_id", "")] if tracked else []
            writer.writerow(image + [d["label"], csv_text(d["name"]), d["score"], *d["box"], *track])


URL_SCHEMES = ("http://", "https://")


def ls_folder(root: str) -> str:
    """The local folder a Label Studio root stands for: a URL prefix serves the current directory."""
    return os.getcwd() if root.startswith(URL_SCHEMES) else root


def local_files_url(path: str | Path, root: str = "/") -> str:
    """``path`` as Label Studio reads it: ``/data/local-files/?d=<path relative to root>`` for its local-files storage
    (``root`` its ``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``), or ``root`` + the path relative to the current directory
    when ``root`` is a URL prefix (the current directory served there). ``path`` must be inside that folder."""
    relative = quote(os.path.relpath(os.path.abspath(path), os.path.abspath(ls_folder(root))))
    return root.rstrip("/") + "/" + relative if root.startswith(URL_SCHEMES) else "/data/local-files/?d=" + relative


def _labelstudio_task(record: dict, model_version: str, image: Callable[[dict], str | None]) -> dict:
    width, height = record["width"], record["height"]
    results = []
    for index, d in enumerate(record["detections"]):
        x1, y1, x2, y2 = d["box"]
        result = {"id": f"r{index}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
                  "original_width": width, "original_height": height, "image_rotation": 0, "score": d["score"],
                  "value": {"x": 100 * x1 / width, "y": 100 * y1 / height, "width": 100 * (x2 - x1) / width,
                            "height": 100 * (y2 - y1) / height, "rotation": 0, "rectanglelabels": [d["name"]]}}
        if "track_id" in d:
            result["meta"] = {"track_id": d["track_id"]}
        results.append(result)
    data = {"image": image(record)}
    if "frame" in record:
        data["frame"] = record["frame"]
    score = min((d["score"] for d in record["detections"]), default=0.0)  # the task is as sure as its least box
    return {"data": data, "predictions": [{"model_version": model_version, "score": score, "result": results}]}


def _write_labelstudio(f: IO[str], records: Iterable[dict], model_version: str,
                       image: Callable[[dict], str | None] | None, **_) -> None:
    image = image or (lambda record: record["file"])
    _json_list(f, (_labelstudio_task(record, model_version, image) for record in records
                   if image(record) is not None))  # an in-memory image, a frame past the cap: nothing to show


_WRITERS: dict[str, Callable[..., None]] = {"json": _write_json, "coco": _write_coco, "csv": _write_csv,
                                            "labelstudio": _write_labelstudio}


def write_results(fmt: str, records: Iterable[dict], path: Path, *, class_names: list[str],
                  category_ids: list[int] | None = None, model_version: str = "ssd", tracked: bool = False,
                  image: Callable[[dict], str | None] | None = None) -> Path:
    """Write ``records`` to ``path`` in ``fmt`` (a key of :data:`FORMATS`), atomically. ``tracked``: the CSV gets a
    ``track_id`` column. ``image``: a record -> its Label Studio ``data.image`` (default: its ``file``)."""
    with atomic_write(path, "w", newline="") as f:  # csv writes its own line ends
        _WRITERS[fmt](f, records, class_names=class_names, category_ids=category_ids, model_version=model_version,
                      tracked=tracked, image=image)
    return path

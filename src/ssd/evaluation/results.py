"""Ground truths of dataset records, and detections read from a COCO results file, in the per-image form every
metric of :mod:`ssd.evaluation` takes; :func:`evaluate_detections` scores such a file (``ssd val --detections``)."""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ssd.data.gate import load_training_data
from ssd.data.records import ImageRecord
from ssd.errors import DetectionsError, InputError
from ssd.evaluation.evaluator import check_metric, score_detections
from ssd.evaluation.report import attach_report
from ssd.jsonfile import read_json
from ssd.limits import MAX_DETECTIONS_FILE_BYTES, MAX_DETECTIONS_PER_IMAGE, is_whole, value_text
from ssd.schemas import ValConfig
from ssd.text import few

__all__ = ["ground_truths_from_records", "detections_from_coco_results", "evaluate_detections"]

_RESULT_KEYS = {"image_id", "category_id", "bbox", "score"}


def ground_truths_from_records(records: Sequence[ImageRecord]) -> list[dict[str, Any]]:
    """One dict per record: ``boxes [M, 4]`` float32 pixel xyxy, ``labels [M]`` int64, ``difficult [M]`` bool
    (VOC difficult or COCO crowd: ignored by evaluation), ``image_size`` ``(h, w)`` and ``image_id``.

    Records must have their ``width`` / ``height`` (as the readers give them).
    """
    out = []
    for record in records:
        if record.width is None or record.height is None:
            raise InputError(f"{record.path}: image size unknown (read the dataset with ssd.data.load_dataset)")
        out.append({"boxes": torch.tensor([o.box for o in record.objects], dtype=torch.float32).reshape(-1, 4),
                    "labels": torch.tensor([o.label for o in record.objects], dtype=torch.int64),
                    "difficult": torch.tensor([o.ignore for o in record.objects], dtype=torch.bool),
                    "image_size": (record.height, record.width), "image_id": record.image_id})
    return out


class _Detections:
    """COCO results collected one at a time into compact arrays: the JSON decoder's ``object_hook`` (no dict per
    detection is kept), or called on each item of a list. Types are checked here, ranges on the arrays."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.image_ids: dict[str, int] = {}  # the id as text -> its index, in order of first appearance
        self.images, self.categories, self.values = array("q"), array("q"), array("d")  # values: x, y, w, h, score

    def error(self, index: int, text: str) -> ValueError:
        return DetectionsError(f"{self.source}: detection {index}: {text}")

    def __call__(self, item: Mapping[str, Any]) -> None:
        index = len(self.images)
        if not isinstance(item, Mapping) or not item.keys() >= _RESULT_KEYS:
            raise self.error(index, f"{value_text(item)} is not a COCO result dict(image_id, category_id, bbox=[x, "
                             "y, width, height], score) (a nested object counts as one)")
        image_id, category, bbox, score = (item[k] for k in ("image_id", "category_id", "bbox", "score"))
        if not (is_whole(image_id) or isinstance(image_id, str)):
            raise self.error(index, f"image_id {value_text(image_id)} must be an integer or a string")
        if not is_whole(category) or not -2**63 <= category < 2**63:
            raise self.error(index, f"category_id {value_text(category)} must be an integer")
        if not (isinstance(bbox, list) and len(bbox) == 4 and all(_is_number(v) for v in bbox)):
            raise self.error(index, f"bbox {value_text(bbox)} must be a list of exactly 4 finite numbers [x, y, "
                             "width, height]")
        if not _is_number(score):
            raise self.error(index, f"score {value_text(score)} must be a number in [0, 1]")
        self.images.append(self.image_ids.setdefault(str(image_id), len(self.image_ids)))
        self.categories.append(category)
        self.values.extend((*bbox, score))

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(image index [N], category id [N], x y w h score [N, 5])``, ranges checked."""
        values = np.frombuffer(self.values, np.float64).reshape(-1, 5)
        checks = ((~np.isfinite(values).all(axis=1), "bbox and score must be finite numbers"),
                  ((values[:, 2:4] < 0).any(axis=1), "bbox width and height must be >= 0 ([x, y, width, height])"),
                  ((values[:, 4] < 0) | (values[:, 4] > 1), "score must be in [0, 1]"))
        for bad, rule in checks:
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                raise self.error(i, f"bbox {values[i, :4].tolist()}, score {values[i, 4]}: {rule}")
        return np.frombuffer(self.images, np.int64), np.frombuffer(self.categories, np.int64), values


def _is_number(value: Any) -> bool:
    """A JSON number that fits a float (infinity is refused later, with the others out of range)."""
    return isinstance(value, float) or (is_whole(value) and abs(value) < 2**1023)


def detections_from_coco_results(results: str | Path | Sequence[Mapping[str, Any]], records: Sequence[ImageRecord],
                                 num_classes: int, category_ids: Sequence[int] | None = None
                                 ) -> list[dict[str, Any]]:
    """Per-image detections (one dict per record, in record order; ``boxes [N, 4]`` pixel xyxy, ``scores [N]``,
    ``labels [N]``, ``image_id``, ``path``) of a COCO results list or JSON file (``image_id``, ``category_id``,
    ``bbox`` ``[x, y, w, h]``, ``score``).

    A file is read by :func:`ssd.jsonfile.read_json` (at most :data:`ssd.limits.MAX_DETECTIONS_FILE_BYTES`) straight
    into arrays. ``category_ids``: the dataset's category id of each label (COCO); default the labels ``0..K-1``.

    Raises:
        DetectionsError: naming the file and the detection index: not a result dict, a bbox that is not 4 finite
            numbers with width and height >= 0, a score outside [0, 1]; the first image ids and category ids that are
            not the dataset's; an image with more than :data:`ssd.limits.MAX_DETECTIONS_PER_IMAGE` detections.
    """
    source = str(results) if isinstance(results, (str, Path)) else "detections"
    found = _Detections(source)
    if isinstance(results, (str, Path)):
        read_json(results, max_bytes=MAX_DETECTIONS_FILE_BYTES, bound="ssd.limits.MAX_DETECTIONS_FILE_BYTES",
                  what="a COCO results file", object_hook=found, array=True)
    elif isinstance(results, Sequence) and not isinstance(results, str):
        for item in results:
            found(item)
    else:
        raise DetectionsError(f"{source}: a COCO results file is a JSON list of detections, got "
                              f"{type(results).__name__}")
    image_of, category, values = found.arrays()
    index = {str(r.image_id): i for i, r in enumerate(records)}
    unknown_images = [i for i in found.image_ids if i not in index]
    if unknown_images:
        raise DetectionsError(f"{source}: {len(unknown_images)} image id(s) are not images of the split: "
                              f"{few(sorted(unknown_images))} (the split's ids look like {few(list(index)[:3])})")
    known = np.array(category_ids if category_ids is not None else range(num_classes), dtype=np.int64)  # per label
    sorter = np.argsort(known, kind="stable")
    labels = sorter[np.minimum(np.searchsorted(known, category, sorter=sorter), len(known) - 1)]
    unknown = known[labels] != category
    if unknown.any():
        expected = few([str(c) for c in known]) if category_ids is not None else f"0..{num_classes - 1}"
        raise DetectionsError(f"{source}: detection {int(np.flatnonzero(unknown)[0])}: category id(s) "
                              f"{few([str(c) for c in np.unique(category[unknown])])} are not the dataset's "
                              f"({expected})")
    record_of = np.array([index[i] for i in found.image_ids] or [0], dtype=np.int64)[image_of]
    counts = np.bincount(record_of, minlength=len(records))
    if counts.max(initial=0) > MAX_DETECTIONS_PER_IMAGE:
        crowded = int(counts.argmax())
        raise DetectionsError(f"{source}: image {records[crowded].image_id} has {counts[crowded]:,} detections, "
                              f"more than {MAX_DETECTIONS_PER_IMAGE:,} (ssd.limits.MAX_DETECTIONS_PER_IMAGE)")
    order = np.argsort(record_of, kind="stable")
    xywh = torch.from_numpy(values[order, :4].astype(np.float32))
    boxes = torch.cat([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], dim=1)
    scores = torch.from_numpy(values[order, 4].astype(np.float32))
    labels_t = torch.from_numpy(labels[order])
    starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [{"boxes": boxes[a:b], "scores": scores[a:b], "labels": labels_t[a:b], "image_id": record.image_id,
             "path": str(record.path)} for record, a, b in zip(records, starts[:-1], starts[1:])]


def evaluate_detections(results: str | Path | Sequence[Mapping[str, Any]], data: str | Path,
                        metric: str = ValConfig.metric, split: str = ValConfig.split, *, skip_invalid: bool = False,
                        report: bool = False, project: str | Path | None = None, name: str = ValConfig.name,
                        exist_ok: bool = False) -> dict[str, Any]:
    """Score detections already made (a COCO results file or list, e.g. ``ssd val --save-json`` or another tool's,
    with the dataset's own category ids) against a split, as :func:`evaluate` scores a network's; ``report`` /
    ``project`` as there (no default-box coverage: there is no model). Image and category ids that are not the
    dataset's are refused, naming the first ones
    (:func:`ssd.evaluation.results.detections_from_coco_results`)."""
    check_metric(metric)
    spec = load_training_data(data, skip_invalid=skip_invalid, splits=(split,))
    records, class_names = spec.records(split), list(spec.class_names)
    category_ids = getattr(spec, "category_ids", None)
    truths = ground_truths_from_records(records)
    detections = detections_from_coco_results(results, records, len(class_names), category_ids)
    result = {**score_detections(detections, truths, class_names, metric), "ground_truths": truths,
              "class_names": class_names}
    if report or project is not None:
        attach_report(result, None, data, split, category_ids, project, name, exist_ok=exist_ok)
    return result

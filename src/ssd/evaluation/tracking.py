"""``ssd val --track``: a tracker scored on MOT-format ground truth (:func:`evaluate_tracking`) with HOTA, IDF1 and
MOTA, computed by TrackEval (the ``track`` extra: the maintained ``trackeval`` package, NumPy 2 ready).

Each sequence of :func:`ssd.data.mot.read_mot` is tracked as ``ssd predict --track`` tracks a video
(:meth:`ssd.inference.detector.Detector.track` over its frames in order); the detections ByteTrack has not confirmed
(``track_id`` -1) are not hypotheses. A tracked box that covers an object not to score (flag 0) is removed before
scoring, as MOTChallenge does: the one-to-one assignment of largest IoU over every object of the frame pairs it with
that object at IoU >= 0.5. Boxes match at IoU >= 0.5 for MOTA and IDF1; HOTA averages over IoU 0.05..0.95.
Sequences are combined as TrackEval combines them (sums of counts, not a mean of the sequences' scores).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchvision.ops import box_iou

from ssd.data.mot import MotFrame, read_mot
from ssd.errors import InputError
from ssd.inference.detector import Detector
from ssd.inference.results import Result
from ssd.optional import require
from ssd.schemas import ValConfig
from ssd.settings import EVALUATE, PREDICT

__all__ = ["TRACK_METRICS", "evaluate_tracking", "validate_tracking", "score_tracks", "format_tracking"]

TRACK_METRICS = ("HOTA", "DetA", "AssA", "IDF1", "MOTA", "MOTP", "IDSW", "CLR_FP", "CLR_FN")
"""The figures reported per sequence and overall: TrackEval's names (CLR_FP, CLR_FN: false positives and misses)."""

MATCH_IOU = 0.5


def evaluate_tracking(detector: Detector, data: str | Path, *, tracker: str | Path | dict | None = None,
                      score_threshold: float | None = None, iou_threshold: float = PREDICT.iou_threshold,
                      max_detections: int = PREDICT.max_detections, batch_size: int = 8) -> dict[str, Any]:
    """Track every sequence of the MOT ground truth ``data`` with ``detector`` (ByteTrack with the ``tracker``
    settings, thresholds as ``ssd predict --track``'s) and score it: ``{"sequences": {name: figures}, "overall":
    figures}``, figures keyed by :data:`TRACK_METRICS` (rates in ``[0, 1]``, counts as ints). The ground truth is
    read and checked, and the tracker settings too, before any frame is tracked."""
    require("trackeval", "track", "ssd val --track")
    from ssd.inference.tracking import tracker_settings

    settings = tracker if isinstance(tracker, dict) else tracker_settings(tracker)
    sequences = read_mot(data)
    tracked = {seq.name: (seq.truth, detector.track(seq.frames, tracker=settings, batch_size=batch_size,
                                                     score_threshold=score_threshold, iou_threshold=iou_threshold,
                                                     max_detections=max_detections))
               for seq in sequences}
    return score_tracks(tracked)


def validate_tracking(config: ValConfig) -> tuple[dict[str, Any], Path | None]:
    """``ssd val --track``: :func:`evaluate_tracking` of ``config.weights`` on ``config.data``, and where its figures
    were written (``tracking.json`` in a new run directory, ``None`` with ``--no-save``). ``--conf`` left at its
    default is the model's own confidence, as in ``ssd predict --track`` (val's 0.01 suits AP, not a tracker)."""
    from ssd.files import atomic_write, make_run_dir
    from ssd.inference.detector import load

    require("trackeval", "track", "ssd val --track")
    from ssd.inference.tracking import tracker_settings

    settings = tracker_settings(config.tracker)
    read_mot(config.data)  # its errors before the model is opened
    score = None if config.score_threshold == EVALUATE.score_threshold else config.score_threshold
    result = evaluate_tracking(load(config.weights, device=config.device), config.data, tracker=settings,
                               score_threshold=score, iou_threshold=config.iou_threshold,
                               max_detections=config.max_detections, batch_size=config.batch_size)
    if not config.save:
        return result, None
    path = make_run_dir(config.project, config.name, config.exist_ok) / "tracking.json"
    with atomic_write(path, "w") as f:
        json.dump({"data": str(config.data), "weights": str(config.weights), **result}, f, indent=2)
    return result, path


def score_tracks(tracked: dict[str, tuple[Sequence[MotFrame], Sequence[Result]]]) -> dict[str, Any]:
    """The figures of each sequence (its ground truth and its tracked results, frame by frame) and overall, as
    :func:`evaluate_tracking` returns them."""
    trackeval = require("trackeval", "track", "ssd val --track")
    metrics = [trackeval.metrics.HOTA(), trackeval.metrics.CLEAR({"THRESHOLD": MATCH_IOU, "PRINT_CONFIG": False}),
               trackeval.metrics.Identity({"THRESHOLD": MATCH_IOU, "PRINT_CONFIG": False})]
    per_sequence: dict[str, dict[str, dict]] = {}
    for name, (truth, results) in tracked.items():
        if len(truth) != len(results):
            raise InputError(f"sequence {name}: {len(truth)} frames of ground truth, {len(results)} results")
        data = _trackeval_data(truth, results)
        per_sequence[name] = {type(m).__name__: m.eval_sequence(data) for m in metrics}
    overall = {type(m).__name__: m.combine_sequences({name: res[type(m).__name__]
                                                      for name, res in per_sequence.items()}) for m in metrics}
    return {"sequences": {name: _figures(res) for name, res in per_sequence.items()}, "overall": _figures(overall)}


def _figures(res: dict[str, dict]) -> dict[str, float | int]:
    merged = {**res["HOTA"], **res["CLEAR"], **res["Identity"]}
    return {key: int(merged[key]) if key in ("IDSW", "CLR_FP", "CLR_FN") else float(np.mean(merged[key]))
            for key in TRACK_METRICS}


def _trackeval_data(truth: Sequence[MotFrame], results: Sequence[Result]) -> dict[str, Any]:
    """TrackEval's input for one sequence: per frame the ground truth's and the tracker's ids (numbered from 0) and
    their IoUs ``[n_gt, n_tracker]``; tracked boxes on objects not to score removed."""
    gt_ids, tracker_ids, similarity = [], [], []
    for frame, result in zip(truth, results):
        tracked = result.track_ids >= 0
        boxes, ids = result.boxes[tracked].double(), result.track_ids[tracked]
        keep = _not_on_ignored(frame, boxes)
        boxes, ids = boxes[keep], ids[keep]
        gt_ids.append(frame.ids)
        tracker_ids.append(ids.numpy())
        similarity.append(box_iou(torch.from_numpy(frame.boxes), boxes).numpy())
    gt_ids, num_gt = _renumbered(gt_ids)
    tracker_ids, num_tracker = _renumbered(tracker_ids)
    return {"num_timesteps": len(truth), "gt_ids": gt_ids, "tracker_ids": tracker_ids, "num_gt_ids": num_gt,
            "num_tracker_ids": num_tracker, "num_gt_dets": sum(len(i) for i in gt_ids),
            "num_tracker_dets": sum(len(i) for i in tracker_ids), "similarity_scores": similarity}


def _not_on_ignored(frame: MotFrame, boxes: torch.Tensor) -> torch.Tensor:
    """``[N]`` bool: the tracked ``boxes`` that the one-to-one assignment of largest IoU over all of the frame's
    objects does not pair, at IoU >= 0.5, with an object not to score."""
    keep = torch.ones(len(boxes), dtype=torch.bool)
    if len(frame.ignored) == 0 or len(boxes) == 0:
        return keep
    from scipy.optimize import linear_sum_assignment

    objects = torch.from_numpy(np.concatenate([frame.boxes, frame.ignored]))
    iou = box_iou(objects, boxes).numpy()
    rows, cols = linear_sum_assignment(np.where(iou >= MATCH_IOU - np.finfo(float).eps, iou, 0), maximize=True)
    for row, col in zip(rows, cols):
        if row >= len(frame.boxes) and iou[row, col] >= MATCH_IOU - np.finfo(float).eps:
            keep[col] = False
    return keep


def _renumbered(ids: list[np.ndarray]) -> tuple[list[np.ndarray], int]:
    """The ids of every frame numbered 0..K-1 in the order of their values (TrackEval's rule), and K."""
    unique = np.unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64)
    return [np.searchsorted(unique, frame_ids).astype(int) for frame_ids in ids], len(unique)


def format_tracking(result: dict[str, Any]) -> str:
    """The figures as a table: one row per sequence and the overall row."""
    header = f"{'sequence':<24}" + "".join(f"{name:>9}" for name in TRACK_METRICS)
    rows = [*result["sequences"].items(), ("overall", result["overall"])]
    lines = [header] + [f"{name[:24]:<24}" + "".join(
        f"{value:>9d}" if isinstance(value, int) else f"{value:>9.3f}" for value in figures.values())
        for name, figures in rows]
    return "\n".join(lines)

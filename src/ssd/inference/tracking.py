"""Track ids across the frames of a video or a live stream: ByteTrack from the ``trackers`` package (the optional
``track`` extra), fed the :class:`~ssd.inference.results.Result` of each frame in order.

:class:`Tracker` gives each result its ``track_ids`` (``-1`` for a detection not yet confirmed as a track, in the
result's order) and keeps each track's recent box centres for drawing its trail. ByteTrack's point is its second
association: boxes scored below the user's confidence still continue the tracks they overlap, so an object whose
score dips (partly hidden, blurred) keeps its track. :func:`track_frames` therefore runs the detector down to
``low_conf_det_threshold``, and the tracker keeps the boxes at or above the user's confidence plus those below it
that continue a track (written with their id); a low-scored box that continues nothing is dropped, as the
detector's threshold would have dropped it. The settings come from a small YAML file (``--tracker``, as in
Ultralytics) read by :func:`tracker_settings`; the defaults::

    tracker_type: bytetrack          # the one tracker offered
    track_activation_threshold: 0.7  # score a detection needs to start a track
    high_conf_det_threshold: 0.6     # scores above: first association; below: second (ByteTrack's low-score pass)
    low_conf_det_threshold: 0.1      # the lowest score passed to the second association (ByteTrack's paper: 0.1)
    minimum_iou_threshold: 0.1       # IoU a detection needs with a track's prediction to continue it
    minimum_consecutive_frames: 2    # frames a track needs before it gets an id
    lost_track_buffer: 30            # frames (at 30 fps) a lost track is kept for
    frame_rate: 30                   # the video's frame rate
    per_class: true                  # one ByteTrack per class; false: one for all boxes (see Tracker)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ssd.errors import ConfigError
from ssd.limits import MAX_TRACK_FRAMES, MAX_TRACKER_FILE_BYTES, is_real, value_text
from ssd.names import did_you_mean
from ssd.optional import require

if TYPE_CHECKING:
    from ssd.inference.detector import Detector
    from ssd.inference.results import Frame, Result

__all__ = ["LOW_CONF_DET_THRESHOLD", "TRACKERS", "TRACKER_SETTINGS", "TRAIL_LENGTH", "Tracker", "detect_threshold",
           "track_frames", "tracker_settings"]

TRACKERS = ("bytetrack",)
TRAIL_LENGTH = 30
"""Box centres kept per track for its drawn trail (about a second of video)."""
LOW_CONF_DET_THRESHOLD = 0.1
"""The lowest score the detector passes to ByteTrack's second association (the paper's low threshold)."""

_UNIT = ("in [0, 1]", lambda v: 0 <= v <= 1)
TRACKER_SETTINGS = {  # ByteTrack's argument (and low_conf_det_threshold, the detector's) -> (type, rule, check)
    "track_activation_threshold": (float, *_UNIT),
    "high_conf_det_threshold": (float, *_UNIT),
    "low_conf_det_threshold": (float, *_UNIT),
    "minimum_iou_threshold": (float, *_UNIT),
    "minimum_consecutive_frames": (int, f"in 1..{MAX_TRACK_FRAMES}", lambda v: 1 <= v <= MAX_TRACK_FRAMES),
    "lost_track_buffer": (int, f"in 0..{MAX_TRACK_FRAMES}", lambda v: 0 <= v <= MAX_TRACK_FRAMES),
    "frame_rate": (float, "in [1, 1000] frames per second", lambda v: 1 <= v <= 1000),  # 5e-324: no track at all
}


def tracker_settings(tracker: str | Path | dict | None) -> dict:
    """:class:`Tracker`'s settings from the YAML file ``tracker``, or checked from a dict of the same keys (``None``:
    the defaults of ``trackers``). Raises :class:`~ssd.errors.ConfigError` naming the file, the key, the value and the
    rule: a file over :data:`~ssd.limits.MAX_TRACKER_FILE_BYTES` (before it is read), an unknown key (with the
    closest ones), a value of the wrong type or out of range, a ``tracker_type`` other than ``bytetrack``."""
    require("trackers", "track", "tracking")  # before any work, not at the first frame
    if tracker is None or isinstance(tracker, dict):
        return _checked(tracker or {}, "tracker")
    from ssd.yamlfile import safe_load

    path = Path(tracker)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_TRACKER_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"--tracker {path}: cannot read it ({e.strerror or e})") from None
    if len(data) > MAX_TRACKER_FILE_BYTES:
        raise ConfigError(f"--tracker {path}: over {MAX_TRACKER_FILE_BYTES:,} bytes (limits.MAX_TRACKER_FILE_BYTES): "
                          "a tracker's settings take a few lines")
    try:
        values = safe_load(data)
    except Exception as e:  # yaml.YAMLError and its bounded-size subclass
        raise ConfigError(f"--tracker {path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"--tracker {path}: expected a mapping of settings, got {type(values).__name__}")
    return _checked(values, f"--tracker {path}")


def _checked(values: dict, source: str) -> dict:
    settings = {}
    for key, value in values.items():
        where = f"{source}: {value_text(key)}"
        if key == "tracker_type":
            if value not in TRACKERS:
                raise ConfigError(f"{where}: {value_text(value)} is not a tracker{did_you_mean(str(value), TRACKERS)}")
            continue
        if key == "per_class":
            if not isinstance(value, bool):
                raise ConfigError(f"{where} = {value_text(value)}: must be true or false")
            settings[key] = value
            continue
        if key not in TRACKER_SETTINGS:
            known = ["tracker_type", "per_class", *TRACKER_SETTINGS]
            raise ConfigError(f"{where} is not a setting{did_you_mean(str(key), known)}")
        kind, rule, check = TRACKER_SETTINGS[key]
        if (not is_real(value, finite=True) or isinstance(value, bool) or (kind is int and value != int(value))
                or not check(value)):
            raise ConfigError(f"{where} = {value_text(value)}: must be {'an integer' if kind is int else 'a number'} "
                              f"{rule}")
        settings[key] = kind(value)
    return settings


class Tracker:
    """ByteTrack over the results of one video or stream, frame after frame (see the module docstring).

    ``score_threshold``: the user's confidence: a box scored below it is kept only when it continues a track (the
    detector runs down to :func:`detect_threshold`, see :func:`track_frames`). ``settings``: ByteTrack's arguments
    (:func:`tracker_settings`). ``per_class`` (default): one ByteTrack per class (a box continues only a track of its
    own class, so objects of different classes that cross never swap ids; a box whose class flickers starts a new
    track, and its old one resumes within ``lost_track_buffer`` when the class flicks back), ids numbered across
    classes; else one ByteTrack for every box, as ByteTrack is. ``trails`` maps each track id seen in the last
    :data:`TRAIL_LENGTH` frames to its recent box centres ``(x, y)`` in pixels, oldest first."""

    def __init__(self, score_threshold: float = 0.0, per_class: bool = True, **settings):
        settings.pop("low_conf_det_threshold", None)  # the detector's (detect_threshold), not ByteTrack's
        self._make = lambda: require("trackers", "track", "tracking").ByteTrackTracker(**settings)
        self._sv = require("supervision", "track", "tracking")
        self.per_class, self.frame_rate = per_class, settings.get("frame_rate", 30.0)
        self.score_threshold = score_threshold
        self._bytetracks: dict[int, object] = {} if per_class else {-1: self._make()}  # label (-1: all) -> tracker
        self._ids: dict[tuple[int, int], int] = {}  # (label, the class tracker's id) -> track id, with per_class
        self.trails: dict[int, deque[tuple[float, float]]] = {}
        self._seen: dict[int, int] = {}  # track id -> the last frame it was seen in
        self._frame = -1

    def update(self, result: Result, frame_index: int) -> Result:
        """``result`` with ``track_ids`` ``[N]`` int64 (``-1``: not a confirmed track yet), less its boxes scored
        below ``score_threshold`` that continue no track (the others in their order). ``frame_index``: the frame's
        number in its source, increasing; motion is predicted over the frames between two calls (those a live
        stream dropped)."""
        count = len(result.scores)
        labels = np.asarray(result.labels)
        detections = self._sv.Detections(xyxy=np.asarray(result.boxes).astype(np.float32).reshape(count, 4),
                                         confidence=np.asarray(result.scores), class_id=labels,
                                         data={"index": np.arange(count)})
        if self.per_class:
            for label in np.unique(labels).tolist():
                self._bytetracks.setdefault(label, self._make())
        ids = np.full(count, -1, dtype=np.int64)
        for label, bytetrack in self._bytetracks.items():  # every tracker each frame: lost tracks age
            mine = detections if label == -1 else detections[labels == label]
            tracked = bytetrack.update(mine, timestamp=frame_index / self.frame_rate)
            found = tracked.data.get("index", np.zeros(0, dtype=np.int64))  # no detections: a result without data
            ids[found] = [t if t < 0 or label == -1 else self._ids.setdefault((label, t), len(self._ids))
                          for t in tracked.tracker_id.tolist()]
        self._frame = frame_index
        keep = (np.asarray(result.scores) > self.score_threshold) | (ids >= 0)  # strictly above, as NMS
        names = [name for name, kept in zip(result.names, keep.tolist()) if kept]
        if not isinstance(result.scores, np.ndarray):  # tensors (numpy arrays without PyTorch) index tensors
            import torch

            keep, ids = torch.from_numpy(keep), torch.from_numpy(ids)
        result = replace(result, boxes=result.boxes[keep], scores=result.scores[keep], labels=result.labels[keep],
                         names=names, track_ids=ids[keep])
        centres = ((result.boxes[:, :2] + result.boxes[:, 2:]) / 2).tolist()
        for track_id, centre in zip(result.track_ids.tolist(), centres):
            if track_id >= 0:
                self.trails.setdefault(track_id, deque(maxlen=TRAIL_LENGTH)).append(tuple(centre))
                self._seen[track_id] = self._frame
        for track_id in [t for t, last in self._seen.items() if self._frame - last >= TRAIL_LENGTH]:
            del self.trails[track_id], self._seen[track_id]
        return result


def track_frames(detector: Detector, batches: Iterable[list[Frame]], settings: dict | None,
                 **options) -> Iterator[tuple[Result, Frame, Tracker | None]]:
    """Detect (``detector.detect(..., **options)``) and track each batch of frames, one :class:`Tracker` per stream
    with ByteTrack's ``settings`` (``None``: detect only): yields each frame's result (``path`` the frame's source,
    ``track_ids`` set when tracking), the frame and its stream's tracker (whose ``trails`` draw it) or ``None``.
    When tracking, the detector runs down to :func:`detect_threshold` and each tracker keeps, of the boxes below
    ``options["score_threshold"]`` (``None``: :meth:`Detector.confidence`), those that continue its tracks."""
    trackers: dict[int, Tracker] = {}
    shown = detector.confidence(options.get("score_threshold"))[0]
    if settings is not None:
        options = {**options, "score_threshold": detect_threshold(shown, settings)}
    for batch in batches:
        results = detector.detect([frame.image for frame in batch], [frame.source for frame in batch], **options)
        for result, frame in zip(results, batch):
            if settings is None:
                yield result, frame, None
                continue
            if frame.stream not in trackers:
                trackers[frame.stream] = Tracker(shown, **settings)
            tracker = trackers[frame.stream]
            yield tracker.update(result, frame.index), frame, tracker


def detect_threshold(score_threshold: float, settings: dict) -> float:
    """The score the detector keeps boxes down to when tracking with ``settings``: the user's ``score_threshold``
    or ``low_conf_det_threshold``, the lower."""
    return min(score_threshold, settings.get("low_conf_det_threshold", LOW_CONF_DET_THRESHOLD))

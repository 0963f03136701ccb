"""What a prediction gives back, in one module that needs neither the detector nor PyTorch: :class:`Result` (the
detections of one image, what :meth:`ssd.inference.detector.Detector.predict`, ``ssd predict``'s files and
:class:`ssd.client.Client` give), :class:`Frame` (one image of a sequence, as the frame loop of
:mod:`ssd.inference.frames` takes it) and :class:`PredictSummary` (what
:func:`ssd.inference.sources.predict_source` did). Their arrays are tensors, or numpy arrays of the same shapes and
types without PyTorch (the runtime install, :mod:`ssd.arrays`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ssd.errors import InputError
from ssd.log import LOGGER
from ssd.optional import require

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Frame", "PredictSummary", "Result"]


@dataclass
class Result:
    """Detections of one image.

    Without PyTorch (the runtime install, :mod:`ssd.arrays`) the arrays are numpy arrays of the same shapes and
    types.

    Attributes:
        boxes: ``[N, 4]`` float32 pixel ``xyxy`` of the original image, sorted by decreasing score.
        scores: ``[N]`` float32.
        labels: ``[N]`` int64 in ``0..K-1``.
        names: ``N`` class names (``class_names[label]``).
        width, height: the original image size in pixels.
        path: the image file, or ``None`` for in-memory images.
        track_ids: ``[N]`` int64 track ids when tracking (:meth:`~ssd.inference.detector.Detector.track`; ``-1``: a
            detection the tracker has not confirmed as a track yet), else ``None``.
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    names: list[str]
    width: int
    height: int
    path: str | None = None
    track_ids: Tensor | None = None

    def to_dict(self) -> dict:
        """JSON-able: ``file``, ``width``, ``height``, ``detections`` (``box`` xyxy pixels, ``score``, ``label``,
        ``name``, and ``track_id`` when tracking)."""
        detections = [
            {"box": box, "score": score, "label": label, "name": name}
            for box, score, label, name in zip(self.boxes.tolist(), self.scores.tolist(), self.labels.tolist(),
                                               self.names)
        ]
        if self.track_ids is not None:
            for detection, track_id in zip(detections, self.track_ids.tolist()):
                detection["track_id"] = track_id
        return {"file": self.path, "width": self.width, "height": self.height, "detections": detections}

    def check(self) -> None:
        """Raise :class:`~ssd.errors.InputError` naming the image and the first bad detection unless ``boxes`` is
        ``[N, 4]`` of finite ``x1 <= x2``, ``y1 <= y2``, ``labels`` ``[N]`` at least 0 and ``width``, ``height``
        positive: what the files written from a result (labels, crops) rely on; a result made through the API may
        hold anything."""
        # numpy: a result holds tensors, or numpy arrays on the runtime without PyTorch
        boxes, labels, where = np.asarray(self.boxes), np.asarray(self.labels), self.path or "an in-memory image"
        if boxes.ndim != 2 or boxes.shape[-1] != 4 or labels.shape != boxes.shape[:1] or min(
                self.width, self.height) < 1:
            raise InputError(f"result of {where}: boxes {list(boxes.shape)}, labels {list(labels.shape)} in a "
                             f"{self.width}x{self.height} image: expected boxes [N, 4], labels [N], a size >= 1")
        bad = ~(np.isfinite(boxes).all(1) & (boxes[:, 2] >= boxes[:, 0]) & (boxes[:, 3] >= boxes[:, 1])) | (
            labels < 0)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise InputError(f"result of {where}: detection {k}, box {boxes[k].tolist()} label "
                             f"{int(labels[k])}: a box must be finite pixels x1 <= x2, y1 <= y2, a label >= 0")

    def to_supervision(self):
        """This result as ``supervision.Detections`` (the optional ``supervision`` extra): ``xyxy [N, 4]`` pixels,
        ``confidence [N]``, ``class_id [N]``, ``tracker_id [N]`` when tracking, ``data["class_name"]`` the names."""
        sv = require("supervision", "supervision", "Result.to_supervision")
        return sv.Detections(xyxy=np.asarray(self.boxes), confidence=np.asarray(self.scores),
                             class_id=np.asarray(self.labels),
                             tracker_id=None if self.track_ids is None else np.asarray(self.track_ids),
                             data={"class_name": np.array(self.names, dtype=str)})



@dataclass
class Frame:
    """One frame: ``image`` ``[3, H, W]`` uint8 RGB (a tensor; numpy without PyTorch), ``stream`` (the source's index
    in its group), ``index`` (the frame's number in its source, dropped frames counted), ``time``
    (``time.perf_counter()`` when read) and ``source`` (the source it came from: a file, a stream's name (its URL
    with the secrets hidden), or ``None`` for an in-memory image)."""

    image: Any
    stream: int
    index: int
    time: float
    source: str | None


@dataclass
class PredictSummary:
    """What :func:`~ssd.inference.sources.predict_source` did: counts, where it wrote, and the inputs it skipped (name
    and reason)."""

    save_dir: Path
    results_file: Path
    images: int = 0
    videos: int = 0
    frames: int = 0
    detections: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    streams: int = 0
    live_frames: int = 0
    dropped: int = 0
    stopped: str | None = None
    """Why live streams ended before their end: ``"Ctrl-C"``, ``"SIGTERM"`` (under ``ssd predict``) or the
    :class:`~ssd.errors.StreamError` of the streams that failed."""
    main: bool = True
    """This summary tells the whole run: ``False`` on the ranks other than 0 of a run under torchrun, which tell
    their own share only (rank 0 tells the whole run)."""

    def __str__(self) -> str:
        done = f"{self.images} image{'s' * (self.images != 1)}"
        if self.videos:
            done += f", {self.videos} video{'s' * (self.videos != 1)} ({self.frames} frames)"
        if self.streams:
            done += (f", {self.live_frames} frames of {self.streams} live stream{'s' * (self.streams != 1)} "
                     f"({self.dropped} more dropped while the model was busy)")
        lines = [f"{done}, {self.detections} detections -> {self.results_file}", *self.notes]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} unreadable file{'s' * (len(self.skipped) != 1)}:")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)

    SHARDED: ClassVar[tuple[str, ...]] = ("images", "videos", "frames", "detections", "skipped")
    """The fields a sharded run's ranks add up (a count, or the list of skipped inputs)."""

    def counts(self) -> dict:
        """What a sharded run's rank adds to rank 0's summary (:meth:`add_counts`): its :attr:`SHARDED` fields."""
        return {name: getattr(self, name) for name in self.SHARDED}

    def add_counts(self, ranks: list[dict]) -> None:
        """Add the :meth:`counts` of the other ranks of a sharded run (in rank order: the inputs' order)."""
        for counts in ranks:
            for name in self.SHARDED:
                setattr(self, name, getattr(self, name) + counts[name])

    def skip(self, path: Path, error: Exception) -> None:
        """Record an unreadable input and say so now on the ``ssd`` logger (shown by the command, silent in library
        use and off rank 0); image errors name the file themselves: their reason only."""
        reason = getattr(error, "reason", str(error))
        self.skipped.append((str(path), reason))
        LOGGER.warning(f"skipped {path}: {reason}")


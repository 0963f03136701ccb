"""``ssd predict`` over frames: the video files and live streams of :func:`ssd.inference.sources.predict_source`.

Frames come in batches (:func:`ssd.inference.streams.video_frames`: every frame of a file, in order;
:class:`ssd.inference.streams.StreamGroup`: the newest frame of each live stream), are detected and, with
``--track``, tracked with one tracker per source (:func:`ssd.inference.tracking.track_frames`); each result goes to
the run's :class:`~ssd.inference.writers.PredictionWriter` as it comes, and each source's drawn frames to its mp4 and
to the ``--show`` window.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from torch import Tensor
from tqdm import tqdm

from ssd.errors import StreamError
from ssd.inference.streams import StreamGroup, VideoFile
from ssd.inference.tracking import Tracker, track_frames
from ssd.log import progress as progress_bar
from ssd.optional import require

if TYPE_CHECKING:
    from ssd.inference.detector import Detector, Result
    from ssd.inference.sources import PredictSummary
    from ssd.inference.writers import PredictionWriter

__all__ = ["draw_result", "predict_frames", "predict_live", "predict_video"]


def draw_result(image: Tensor, result: Result, class_names: list[str], tracker: Tracker | None = None) -> Tensor:
    """``image`` ``[3, H, W]`` uint8 with ``result`` drawn (:func:`ssd.plots.draw_detections`), its track ids and
    the ``tracker``'s trails when tracking."""
    from ssd.plots import draw_detections

    return draw_detections(image, result.boxes, result.labels, result.scores, class_names,
                           track_ids=result.track_ids, trails=tracker.trails if tracker is not None else None)


def predict_video(detector: Detector, path: Path, batch_size: int, settings: dict | None, progress: bool,
                  run: dict) -> None:
    """Every frame of a video file, ``batch_size`` at a time (see :func:`predict_frames`); a video OpenCV cannot
    read is skipped."""
    video = VideoFile(path)
    bar = progress_bar(total=video.length or None, desc=path.name, unit="frame", disable=not progress)
    try:
        frames = predict_frames(detector, video.batches(batch_size), [video.fps], settings, bar, **run)
    except StreamError as e:
        run["summary"].skip(path, ValueError(str(e).removeprefix(f"{path}: ")))
        return
    finally:
        bar.close()
    run["summary"].videos += 1
    run["summary"].frames += frames


def predict_live(detector: Detector, group: StreamGroup, settings: dict | None, progress: bool, run: dict) -> None:
    """The newest frames of live streams until they end, one fails or Ctrl-C (see :func:`predict_frames`)."""
    summary = run["summary"]
    summary.streams = len(group.streams)
    bar = progress_bar(total=None, desc="streams", unit="frame", disable=not progress)
    try:
        predict_frames(detector, group, [s.fps for s in group.streams], settings, bar, **run)
    except KeyboardInterrupt:
        summary.stopped = "Ctrl-C"
    except StreamError as e:
        summary.stopped = str(e)
    finally:
        bar.close()
        summary.live_frames, summary.dropped = run["results"].count, group.dropped  # a live run writes nothing else


def predict_frames(detector: Detector, batches, fps: list[float], settings: dict | None, bar: tqdm, *,
                   outputs: dict | None, options: dict, results: PredictionWriter, summary: PredictSummary,
                   window) -> int:
    """Batches of :class:`~ssd.inference.streams.Frame` (a video's or live streams'): detect, and track with one
    tracker per stream when ``settings``; each result written as its frame (``frame`` its index in its source), drawn
    into ``outputs[source]`` (mp4 at the source's ``fps[stream]``, 25 when unknown) and shown in ``window``. Returns
    the number of frames done."""
    cv2 = require("cv2", "video", "reading video")
    videos, count = {}, 0
    try:
        for result, frame, tracker in track_frames(detector, batches, settings, **options):
            results.write(result, frame.image, frame.index)
            summary.detections += len(result.scores)
            count += 1
            bar.update()
            if outputs is None and window is None:
                continue
            drawn = draw_result(frame.image, result, detector.class_names, tracker)
            if window is not None:
                window.show(frame.source, drawn)
            if outputs is not None:
                if frame.stream not in videos:
                    out = outputs[frame.source] if frame.source in outputs else outputs[Path(frame.source)]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    videos[frame.stream] = cv2.VideoWriter(str(out), cv2.VideoWriter_fourcc(*"mp4v"),
                                                           fps[frame.stream] or 25.0, tuple(drawn.shape[:0:-1]))
                bgr = cv2.cvtColor(np.ascontiguousarray(drawn.permute(1, 2, 0).numpy()), cv2.COLOR_RGB2BGR)
                videos[frame.stream].write(bgr)
    finally:
        for video in videos.values():
            video.release()
    return count

"""``ssd predict``'s one loop over frames: the images, video files and live streams of
:func:`ssd.inference.sources.predict_source`, as the methods of a :class:`Run`.

Frames come in batches (:func:`image_frames`: image files decoded ahead in threads by :func:`decode_files`, one
sequence in name order;
:class:`ssd.inference.videos.VideoFile`: every frame of a file, in order;
:class:`ssd.inference.streams.StreamGroup`: the newest frame of each live stream) and go through
:meth:`Run.frames`: detected and, with ``--track``, tracked with one tracker per source
(:func:`ssd.inference.tracking.track_frames`); each result goes to the run's
:class:`~ssd.inference.writers.PredictionWriter` as it comes, each drawn frame to its image file or its source's video
(:class:`~ssd.inference.videos.VideoOut`) and to the ``--show`` window.

Pillow releases the GIL while it decodes, so a few threads decode the next images while the network runs on the
current batch, instead of one image at a time between batches. At most ``ahead`` decoded images wait, so memory is
bounded whatever the number of files, and they come out in the order of the files.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

from tqdm import tqdm

from ssd.data.images import read_image
from ssd.errors import ConfigError, StreamError
from ssd.inference.results import Frame, PredictSummary
from ssd.inference.signals import Terminated
from ssd.inference.streams import is_live
from ssd.inference.tracking import Tracker, track_frames
from ssd.inference.videos import VideoFile, VideoOut
from ssd.log import progress as progress_bar
from ssd.pools import map_ahead

if TYPE_CHECKING:
    from torch import Tensor

    from ssd.inference.detector import Detector
    from ssd.inference.display import Window
    from ssd.inference.results import Result
    from ssd.inference.streams import StreamGroup
    from ssd.inference.writers import PredictionWriter

__all__ = ["Run", "decode_files", "draw_result", "image_frames"]


def draw_result(image: Tensor, result: Result, class_names: list[str], tracker: Tracker | None = None) -> Tensor:
    """``image`` ``[3, H, W]`` uint8 with ``result`` drawn (:func:`ssd.plots.draw_detections`), its track ids and
    the ``tracker``'s trails when tracking."""
    from ssd.plots import draw_detections

    return draw_detections(image, result.boxes, result.labels, result.scores, class_names,
                           track_ids=result.track_ids, trails=tracker.trails if tracker is not None else None)


def _decode(path: Path) -> Tensor | Exception:
    try:
        return read_image(path)
    except (ValueError, OSError) as e:  # an unreadable file is the caller's to report, in its place
        return e


def decode_files(paths: Iterable[Path], workers: int, ahead: int = 16
                 ) -> Iterator[tuple[Path, Tensor | Exception]]:
    """``(path, image [3, H, W] uint8)`` for each path in order, or ``(path, error)`` for a file that cannot be read
    (:func:`ssd.data.images.read_image`'s ``ValueError`` / ``OSError``). ``workers`` threads decode up to ``ahead``
    files ahead of the consumer; ``workers=0`` decodes each file when it is asked for, in the calling thread."""
    if workers < 0 or ahead < 1:
        raise ConfigError(f"workers must be >= 0 and ahead >= 1, got workers={workers}, ahead={ahead}")
    paths = iter(paths)
    if workers == 0:
        yield from ((path, _decode(path)) for path in paths)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="ssd-decode") as pool:
        yield from map_ahead(pool, lambda path: (path, _decode(path)), paths, ahead)


def image_frames(paths: Iterable[Path], batch_size: int, workers: int, summary: PredictSummary, bar: tqdm
                 ) -> Iterator[list[Frame]]:
    """Image files as batches of frames of one sequence (stream 0, ``index`` the running count of images read),
    decoded ahead by ``workers`` threads (:func:`decode_files`); an unreadable file is
    skipped and reported in ``summary`` (and counted on ``bar``)."""
    decoded, index = decode_files(paths, workers, ahead=2 * batch_size), 0
    while chunk := list(islice(decoded, batch_size)):
        batch = []
        for path, image in chunk:
            if isinstance(image, Exception):
                summary.skip(path, image)
                bar.update()
            else:
                batch.append(Frame(image, 0, index, time.perf_counter(), str(path)))
                index += 1
        if batch:
            yield batch


@dataclass
class Run:
    """One ``ssd predict`` run as its frame loop sees it: ``detector`` and ``options`` (:meth:`Detector.detect`'s
    keywords: the thresholds, the class labels, the tile, ``tta``), the tracker's ``settings`` (``None``: no
    tracking), where each result goes (``writer``; ``outputs``: each input's drawn copy, ``None`` when none is
    drawn; ``window``: the ``--show`` window or ``None``), what it counts (``summary``), and how the files are read
    (``batch_size``, ``workers`` decoding threads) and told (``progress`` bars)."""

    detector: Detector
    options: dict
    settings: dict | None
    writer: PredictionWriter
    summary: PredictSummary
    outputs: dict[Path | str, Path] | None
    window: Window | None
    batch_size: int
    workers: int
    progress: bool

    def images(self, paths: list[Path]) -> None:
        """Image files, :attr:`batch_size` at a time (:func:`image_frames`; with tracking, one sequence in their
        order)."""
        bar = progress_bar(total=len(paths), desc="images", unit="img", disable=not self.progress or not paths)
        try:
            batches = image_frames(paths, self.batch_size, self.workers, self.summary, bar)
            self.summary.images += self.frames(batches, None, bar)
        finally:
            bar.close()

    def video(self, path: Path) -> None:
        """Every frame of a video file, :attr:`batch_size` at a time; a video OpenCV cannot read is skipped."""
        video = VideoFile(path)
        bar = progress_bar(total=video.length or None, desc=path.name, unit="frame", disable=not self.progress)
        try:
            frames = self.frames(video.batches(self.batch_size), [video.fps], bar)
        except StreamError as e:
            self.summary.skip(path, ValueError(str(e).removeprefix(f"{path}: ")))
            return
        finally:
            bar.close()
        self.summary.videos += 1
        self.summary.frames += frames

    def live(self, group: StreamGroup) -> None:
        """The newest frames of live streams until they end, one fails, Ctrl-C or SIGTERM (SIGTERM raises
        :class:`~ssd.inference.signals.Terminated` under ``ssd predict``): why is :attr:`PredictSummary.stopped`."""
        summary = self.summary
        summary.streams = len(group.streams)
        bar = progress_bar(total=None, desc="streams", unit="frame", disable=not self.progress)
        try:
            self.frames(group, [s.fps for s in group.streams], bar)
        except KeyboardInterrupt as e:
            summary.stopped = "SIGTERM" if isinstance(e, Terminated) else "Ctrl-C"
        except StreamError as e:
            summary.stopped = str(e)
        finally:
            bar.close()
            summary.live_frames, summary.dropped = self.writer.count, group.dropped  # a live run writes nothing else

    def frames(self, batches: Iterable[list[Frame]], fps: list[float] | None, bar: tqdm) -> int:
        """Batches of :class:`~ssd.inference.results.Frame` (images', a video's or live streams'): detect, and track
        with one tracker per stream when :attr:`settings`; each result written, drawn into ``outputs[source]`` and
        shown in :attr:`window`. ``fps``: each stream's frame rate (a video or a stream: each result written as its
        frame, ``frame`` its index in its source, drawn into its video at ``fps[stream]``, 25 when unknown; a change
        of size said in the summary's notes), or ``None`` for still images (each result an image's, drawn into an
        image file, all shown in one window). Returns the number of frames done."""
        outputs, window, videos, count = self.outputs, self.window, {}, 0
        if outputs is not None and fps is None:  # looked up once per run, not per drawn frame
            from ssd.plots import save_image
        try:
            for result, frame, tracker in track_frames(self.detector, batches, self.settings, **self.options):
                self.writer.write(result, frame.image, None if fps is None else frame.index)
                self.summary.detections += len(result.scores)
                count += 1
                bar.update()
                if outputs is None and window is None:
                    continue
                drawn = draw_result(frame.image, result, self.writer.class_names, tracker)
                if window is not None:
                    window.show("images" if fps is None else frame.source, drawn)
                if outputs is not None and fps is None:
                    save_image(drawn, outputs[Path(frame.source)], sync=False)  # per image: not synced
                elif outputs is not None:
                    if frame.stream not in videos:
                        out = outputs[frame.source] if frame.source in outputs else outputs[Path(frame.source)]
                        videos[frame.stream] = VideoOut(out, fps[frame.stream], drawn, frame.source,
                                                        live=is_live(frame.source))
                    videos[frame.stream].write(drawn, frame.index)
        finally:
            for video in videos.values():
                video.release()
                if (note := video.note()) is not None:
                    self.summary.notes.append(note)
        return count

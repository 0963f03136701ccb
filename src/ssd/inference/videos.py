"""Video files for ``ssd predict``: :class:`VideoFile` reads one whole (every frame, in order), :func:`source_frames`
gives batches of frames of a video file or of live sources (:class:`ssd.inference.streams.StreamGroup`), and
:class:`VideoOut` writes a drawn video, one per video or live stream.

Every drawn video is an ``.avi``, a container that players read without its closing index, so that a run killed
outright (``kill -9``, a power cut) leaves a video readable up to its last frames (an MP4's index is written at
the end: killed, it is unreadable). A video file is drawn in MPEG-4 Part 2 through OpenCV's FFmpeg writer (the size
of the ``.mp4`` it replaces; killed, what FFmpeg had buffered, a few hundred KB, is lost); a live stream, which
usually ends that way, in Motion JPEG by OpenCV's own writer, each frame written as it comes. Ctrl-C and SIGTERM
finish both (``ssd predict`` turns SIGTERM into what Ctrl-C does). A writer OpenCV cannot open (no codec, no
space, no permission) is an :class:`OutputError` at the first frame, not a video that silently stays empty; a source
whose frames change size is drawn at its first size and said (:meth:`VideoOut.note`), while each frame's results
keep its own size.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ssd.errors import OutputError, StreamError
from ssd.inference.bgr import from_bgr, to_bgr
from ssd.inference.results import Frame
from ssd.inference.streams import StreamGroup, is_live, live_sources
from ssd.optional import require

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["DRAWN_VIDEO_SUFFIX", "VideoFile", "VideoOut", "source_frames", "video_frames"]

DRAWN_VIDEO_SUFFIX = ".avi"
"""The suffix of every drawn video: AVI, readable after the run is killed."""


class VideoOut:
    """A drawn video at ``path``, ``fps`` frames a second, sized by its first frame: Motion JPEG for a ``live``
    stream, else MPEG-4 Part 2 (see the module docstring); ``name`` is its source's name (for :meth:`note`)."""

    def __init__(self, path: Path, fps: float, first: Tensor, name: str, live: bool = False):
        cv2 = self._cv2 = require("cv2", "video", "writing video")
        self.path, self.name, self.size = path, name, (int(first.shape[2]), int(first.shape[1]))
        self._resized: tuple[int, int, int] | None = None  # the first frame of another size: index, width, height
        if live:
            codec, args = "MJPG", (cv2.CAP_OPENCV_MJPEG, cv2.VideoWriter_fourcc(*"MJPG"))
        else:
            codec, args = "mp4v", (cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*"mp4v"))
        path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = cv2.VideoWriter(str(path), *args, fps or 25.0, self.size)
        if not self._writer.isOpened():
            self._writer.release()
            raise OutputError(f"{path}: OpenCV cannot write this video (its {codec} writer did not open: a codec "
                              f"this OpenCV lacks, a full disk or a folder it cannot write); run with "
                              f"--no-save-images to write the results without drawn copies")

    def write(self, image: Tensor, index: int) -> None:
        """Append ``image`` ``[3, H, W]`` uint8 RGB, frame ``index`` of its source, scaled to the video's size when
        the source changed size (remembered for :meth:`note`)."""
        bgr = to_bgr(image)
        if (size := (bgr.shape[1], bgr.shape[0])) != self.size:
            if self._resized is None:
                self._resized = (index, *size)
            bgr = self._cv2.resize(bgr, self.size)
        self._writer.write(bgr)

    def note(self) -> str | None:
        """What the summary says about the drawn frames when the source changed size, else ``None``."""
        if self._resized is None:
            return None
        index, width, height = self._resized
        return (f"{self.name} changed size from {self.size[0]}x{self.size[1]} to {width}x{height} at frame {index}: "
                f"{self.path} shows its frames scaled to {self.size[0]}x{self.size[1]} (predictions.jsonl keeps "
                f"each frame's own size and boxes)")

    def release(self) -> None:
        self._writer.release()


class VideoFile:
    """A video file opened once: ``fps`` and ``length`` (frames) as its header announces them (0 when it does not
    say), and :meth:`batches`, every frame in order."""

    def __init__(self, path: str | Path):
        cv2 = require("cv2", "video", "reading video")
        self.path = path
        self._capture = cv2.VideoCapture(str(path))
        self.fps = self._capture.get(cv2.CAP_PROP_FPS) or 0.0
        self.length = max(int(self._capture.get(cv2.CAP_PROP_FRAME_COUNT) or 0), 0)

    def batches(self, batch_size: int, stream: int = 0) -> Iterator[list[Frame]]:
        """Every frame, in order (none dropped), ``batch_size`` at a time, the file closed at the end;
        :class:`StreamError` when OpenCV cannot read a single frame of it."""
        index = 0
        try:
            while True:
                batch = []
                while len(batch) < batch_size and (read := self._capture.read())[0]:
                    batch.append(Frame(from_bgr(read[1]), stream, index + len(batch), time.perf_counter(),
                                       str(self.path)))
                if not batch:
                    break
                index += len(batch)
                yield batch
        finally:
            self._capture.release()
        if index == 0:
            raise StreamError(f"{self.path}: cannot read any frame (not a video OpenCV can decode)")


def video_frames(path: str | Path, batch_size: int, stream: int = 0) -> Iterator[list[Frame]]:
    """Every frame of a video file, in order, ``batch_size`` at a time (:meth:`VideoFile.batches`)."""
    return VideoFile(path).batches(batch_size, stream)


def source_frames(source: str | Path, batch_size: int) -> Iterator[list[Frame]]:
    """Batches of frames of a live source (:class:`StreamGroup`: the newest frame of each stream, the readers
    stopped when the iteration ends or is closed) or of a video file (:func:`video_frames`)."""
    if is_live(source):
        with StreamGroup(live_sources(source)) as group:
            yield from group
    else:
        yield from video_frames(source, batch_size)

"""Live sources for ``ssd predict``: a camera index (``0``), an ``rtsp://`` / ``rtmp://`` / ``http(s)://`` URL, or a
``.streams`` text file naming several of them (one a line), read concurrently.

Each source has a reader thread (:class:`LiveStream`, OpenCV ``VideoCapture``) that keeps only the newest frame: a
model slower than the camera skips frames instead of falling behind, and every frame replaced before it was taken
is counted in ``dropped``. A source that stops reconnects with a doubling delay, :data:`RECONNECT_ATTEMPTS` times,
and then fails with a :class:`StreamError` naming it. :class:`StreamGroup` batches the newest frames of all its
sources, and :meth:`StreamGroup.close` stops the readers (what ``ssd predict`` does on Ctrl-C).
"""

from __future__ import annotations

import glob
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ssd.errors import StreamError
from ssd.files import safe_name
from ssd.inference.bgr import from_bgr
from ssd.limits import MAX_STREAMS, value_text
from ssd.optional import require

__all__ = ["LIVE_SCHEMES", "RECONNECT_ATTEMPTS", "RECONNECT_DELAY", "STREAMS_SUFFIX", "Frame", "LiveStream",
           "StreamGroup", "is_live", "live_sources", "source_frames", "stream_name", "VideoFile", "video_frames"]

LIVE_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "tcp://", "udp://", "srt://")
STREAMS_SUFFIX = ".streams"
RECONNECT_ATTEMPTS = 3
RECONNECT_DELAY = 0.5
"""Seconds before the first reconnection attempt; each further attempt waits twice as long."""
TIMEOUT_MS = 5000
"""How long OpenCV may take to open a URL or to read one frame of it before the read counts as failed."""
_FFMPEG_LOG, _FFMPEG_DEBUG = "OPENCV_FFMPEG_LOGLEVEL", "OPENCV_FFMPEG_DEBUG"


class _QuietOpens:
    """Silence OpenCV's log and FFmpeg's while sources open (ssd reports what fails). Both are the process's, and
    streams reconnect from their reader threads: the first open in progress silences OpenCV (``cv2.utils.logging``,
    or ``cv2``'s own functions in wheels without it) and the last restores it; the first FFmpeg open in progress sets
    ``OPENCV_FFMPEG_LOGLEVEL`` to quiet (OpenCV reads it as it opens through FFmpeg: once per process in 5.x, at each
    open in 4.x) and the last removes it, unless the user set it or ``OPENCV_FFMPEG_DEBUG``."""

    def __init__(self) -> None:
        self._lock, self._opening, self._ffmpeg, self._level, self._ours = threading.Lock(), 0, 0, None, False

    @contextmanager
    def __call__(self, cv2, ffmpeg: bool) -> Iterator[None]:
        log = getattr(getattr(cv2, "utils", None), "logging", cv2)  # getLogLevel / setLogLevel in both
        with self._lock:
            if self._opening == 0:
                self._level = log.getLogLevel()
                log.setLogLevel(0)  # silent
            self._opening += 1
            if ffmpeg and self._ffmpeg == 0 and not {_FFMPEG_LOG, _FFMPEG_DEBUG} & os.environ.keys():
                os.environ[_FFMPEG_LOG], self._ours = "-8", True  # AV_LOG_QUIET
            self._ffmpeg += ffmpeg
        try:
            yield
        finally:
            with self._lock:
                self._ffmpeg -= ffmpeg
                if self._ffmpeg == 0 and self._ours:
                    os.environ.pop(_FFMPEG_LOG, None)
                    self._ours = False
                self._opening -= 1
                if self._opening == 0:
                    log.setLogLevel(self._level)


_QUIET_OPENS = _QuietOpens()


@dataclass
class Frame:
    """One frame: ``image`` ``[3, H, W]`` uint8 RGB (a tensor; numpy without PyTorch), ``stream`` (the source's index
    in its group), ``index`` (the frame's number in its source, dropped frames counted), ``time``
    (``time.perf_counter()`` when read) and ``source`` (the source it came from: a file or a stream's name as given,
    or ``None`` for an in-memory image)."""

    image: Any
    stream: int
    index: int
    time: float
    source: str | None


def is_live(source: str | Path) -> bool:
    """A camera index, a URL of :data:`LIVE_SCHEMES`, or a ``.streams`` file."""
    text = str(source)
    return text.isdigit() or text.lower().startswith(LIVE_SCHEMES) or text.lower().endswith(STREAMS_SUFFIX)


def live_sources(source: str | Path) -> list[str]:
    """The sources a live ``source`` names: itself, or the lines of a ``.streams`` file (blank lines and ``#``
    comments skipped; each line a camera index, a URL or a video file). Raises :class:`StreamError` naming the file
    and line for an empty file, a missing file, a line that is none of these, or more than :data:`MAX_STREAMS`."""
    text = str(source)
    if not text.lower().endswith(STREAMS_SUFFIX):
        return [text]
    path = Path(text)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise StreamError(f"{path}: cannot read the streams file ({e})") from None
    sources = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if not (is_live(line) or Path(line).is_file()) or line.lower().endswith(STREAMS_SUFFIX):
            raise StreamError(f"{path}, line {number}: {value_text(line)} is not a camera index, a URL "
                              f"({', '.join(LIVE_SCHEMES)}) or a video file")
        sources.append(line)
    if not sources:
        raise StreamError(f"{path}: no sources in the streams file (write one camera index, URL or video file a line)")
    if len(sources) > MAX_STREAMS:
        raise StreamError(f"{path}: {len(sources)} sources, more than the {MAX_STREAMS} one run reads at once")
    return sources


def stream_name(source: str, suffix: str = "") -> str:
    """A file name for a source's outputs, then ``suffix``: ``camera0``, ``127.0.0.1_8554_live`` (scheme, user and
    query dropped), a video file's stem, made safe and fitted by :func:`ssd.files.safe_name`."""
    if source.isdigit():
        return safe_name(f"camera{source}", suffix)
    if "://" not in source:
        return safe_name(Path(source).stem, suffix, fallback="stream")
    place = source.split("://", 1)[1].split("?", 1)[0].rsplit("@", 1)[-1]
    return safe_name(place, suffix, fallback="stream")


def _open(source: str):
    """An opened ``cv2.VideoCapture``, or ``None``. OpenCV's own log and FFmpeg's are silent meanwhile
    (:class:`_QuietOpens`): a failure is reported once, by :func:`_cannot_open`, not also as OpenCV's raw
    ``[ERROR:0@0.025] ...`` lines or FFmpeg's ``[tcp @ 0x...] Connection to tcp://... failed`` ones."""
    cv2 = require("cv2", "video", "reading cameras and streams")
    with _QUIET_OPENS(cv2, ffmpeg=not source.isdigit()):
        if source.isdigit():
            capture = cv2.VideoCapture(int(source))
        else:
            capture = cv2.VideoCapture(source, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, TIMEOUT_MS,
                                                                cv2.CAP_PROP_READ_TIMEOUT_MSEC, TIMEOUT_MS])
    if capture.isOpened():
        return capture
    capture.release()
    return None


def _cannot_open(source: str) -> StreamError:
    if source.isdigit():
        cameras = sorted(glob.glob("/dev/video*"))
        found = f"cameras here: {', '.join(cameras)}" if cameras else "no /dev/video* device here"
        return StreamError(f"camera {source} cannot be opened: no such camera, or another program uses it ({found})")
    return StreamError(f"cannot open {value_text(source)}: unreachable, not a stream OpenCV's FFmpeg reads, or "
                       f"no answer within {TIMEOUT_MS / 1000:g} s")


class LiveStream:
    """One source read by a thread that keeps only the newest frame (see the module docstring).

    Opened at once (a source that cannot be opened raises :class:`StreamError`); ``frames`` counts the frames read,
    ``dropped`` those replaced before :meth:`take` got them; ``fps`` is what the source announces (``0`` when it
    does not). ``condition`` is shared by the streams of a :class:`StreamGroup` and notified at each new frame and
    at the end. A source with a known frame count (a video file) ends after it; any other ends only by failing."""

    def __init__(self, source: str, stream: int = 0, condition: threading.Condition | None = None, *,
                 reconnect_attempts: int | None = None, reconnect_delay: float | None = None):
        cv2 = require("cv2", "video", "reading cameras and streams")
        self.source, self.stream = source, stream
        self.reconnect_attempts = RECONNECT_ATTEMPTS if reconnect_attempts is None else reconnect_attempts
        self.reconnect_delay = RECONNECT_DELAY if reconnect_delay is None else reconnect_delay
        self.condition = condition or threading.Condition()
        self.frames = self.dropped = 0
        self.error: StreamError | None = None
        self.ended = False
        self._latest: Frame | None = None
        self._stop = threading.Event()
        self._capture = _open(source)
        if self._capture is None:
            raise _cannot_open(source)
        self.fps = self._capture.get(cv2.CAP_PROP_FPS) or 0.0
        count = self._capture.get(cv2.CAP_PROP_FRAME_COUNT)
        self._length = int(count) if 0 < count < 2**31 else None
        self._thread = threading.Thread(target=self._run, name=f"ssd-stream-{stream}", daemon=True)
        self._thread.start()

    def take(self) -> Frame | None:
        """The newest frame not taken yet, or ``None``; call with :attr:`condition` held."""
        frame, self._latest = self._latest, None
        return frame

    @property
    def waiting(self) -> bool:
        """A frame is ready to take; read with :attr:`condition` held."""
        return self._latest is not None

    @property
    def done(self) -> bool:
        """Ended (or failed) and nothing left to take; read with :attr:`condition` held."""
        return self.ended and self._latest is None

    def close(self) -> None:
        """Stop the reader and release the source (the reader exits after its current read)."""
        self._stop.set()
        self._thread.join(timeout=2 * TIMEOUT_MS / 1000)

    def _run(self) -> None:
        capture = self._capture
        try:
            while not self._stop.is_set():
                ok, image = capture.read()
                if not ok:
                    if self._length is not None and self.frames >= self._length:
                        break
                    capture.release()
                    capture = self._reconnect()
                    if capture is None:
                        break
                    continue
                tensor = from_bgr(image)
                with self.condition:
                    self.dropped += self._latest is not None
                    self._latest = Frame(tensor, self.stream, self.frames, time.perf_counter(), self.source)
                    self.frames += 1
                    self.condition.notify_all()
        finally:
            if capture is not None:
                capture.release()
            with self.condition:
                self.ended = True
                self.condition.notify_all()

    def _reconnect(self):
        """A reopened capture, or ``None`` (and :attr:`error` set) after the bounded attempts or a stop."""
        delay = self.reconnect_delay
        for _ in range(self.reconnect_attempts):
            if self._stop.wait(delay):
                return None
            delay *= 2
            if (capture := _open(self.source)) is not None:
                return capture
        attempts = self.reconnect_attempts
        self.error = StreamError(f"{value_text(self.source)} stopped after {self.frames} frames and did not come back "
                                 f"({attempts} reconnection attempt{'s' * (attempts != 1)} over "
                                 f"{self.reconnect_delay * (2 ** attempts - 1):g} s)")
        return None


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


class StreamGroup:
    """Live sources read concurrently; iterate for batches of their newest frames (at most one per source, in source
    order), until every source has ended. A source that failed raises its :class:`StreamError` once the frames it
    read are taken. Use as a context manager: leaving it (Ctrl-C included) stops every reader."""

    def __init__(self, sources: list[str], **reconnect):
        self.condition = threading.Condition()
        self.streams: list[LiveStream] = []
        try:
            for index, source in enumerate(sources):
                self.streams.append(LiveStream(source, index, self.condition, **reconnect))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> StreamGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[list[Frame]]:
        while True:
            with self.condition:
                self.condition.wait_for(self._ready)
                batch = [frame for stream in self.streams if (frame := stream.take()) is not None]
                failed = next((s.error for s in self.streams if s.error is not None and s.done), None)
            if batch:
                yield batch
            if failed is not None:
                raise failed
            if not batch:
                return

    def _ready(self) -> bool:
        return any(s.waiting for s in self.streams) or all(s.ended for s in self.streams)

    @property
    def dropped(self) -> int:
        return sum(s.dropped for s in self.streams)

    @property
    def frames(self) -> int:
        return sum(s.frames for s in self.streams)

    def close(self) -> None:
        for stream in self.streams:
            stream._stop.set()
        for stream in self.streams:
            stream.close()

"""Live sources for ``ssd predict``: a camera index (``0``), an ``rtsp://`` / ``rtmp://`` / ``http(s)://`` URL, or a
``.streams`` text file naming several of them (one a line), read concurrently.

Each source has a reader thread (:class:`LiveStream`, OpenCV ``VideoCapture``). A live one keeps only the newest
frame: a model slower than the camera skips frames instead of falling behind, and every frame replaced before it was
taken is counted in ``dropped``. A video (a file, or a URL whose frame count is known: a video file served over HTTP)
gives every frame, in order, and ends after its last. A live source that stops (a failed read: OpenCV gives up after
:data:`~ssd.inference.capture.TIMEOUT_MS`) is reopened with a doubling delay capped at :data:`MAX_RECONNECT_DELAY`
until it gives a frame again or ``reconnect`` seconds have passed, and then fails with a :class:`StreamError` naming
it; a reader that fails in any other way, or makes no progress for :data:`STALL_S` (a read stuck in OpenCV), fails
so too. :class:`StreamGroup` batches the newest frames of all its
sources (the others go on when one fails, unless ``fail_fast``), and :meth:`StreamGroup.close` stops the readers
(what ``ssd predict`` does on Ctrl-C). A source's URL is used only to open it: frames, outputs and messages name it
with its secrets hidden (:func:`ssd.text.redact_url`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ssd.errors import StreamError
from ssd.files import safe_name
from ssd.inference.bgr import from_bgr
from ssd.inference.capture import QUIET, TIMEOUT_MS, cannot_open, open_capture
from ssd.inference.results import Frame
from ssd.limits import MAX_STREAMS, value_text
from ssd.log import LOGGER
from ssd.optional import require
from ssd.schemas import PredictConfig
from ssd.text import redact_url

__all__ = ["LIVE_SCHEMES", "MAX_RECONNECT_DELAY", "RECONNECT", "RECONNECT_DELAY", "STALL_S", "STREAMS_SUFFIX",
           "Frame", "LiveStream", "StreamGroup", "is_live", "live_sources", "stream_name"]

LIVE_SCHEMES = ("rtsp://", "rtsps://", "rtmp://", "http://", "https://", "tcp://", "udp://", "srt://")
STREAMS_SUFFIX = ".streams"
RECONNECT = PredictConfig.reconnect
"""Seconds a live source that stopped is reopened before it counts as failed (``ssd predict --reconnect``)."""
RECONNECT_DELAY = 0.5
"""Seconds before the first reconnection attempt; each further attempt waits twice as long, up to
:data:`MAX_RECONNECT_DELAY`."""
MAX_RECONNECT_DELAY = 5.0
STALL_S = 3 * TIMEOUT_MS / 1000
"""Seconds a reader may go without a frame, a reconnection attempt or its frame taken before its stream fails: twice
the longest an open and a read may take, plus a reconnection delay."""


def is_live(source: str | Path) -> bool:
    """A camera index, a URL of :data:`LIVE_SCHEMES`, or a ``.streams`` file."""
    text = str(source)
    return text.isdecimal() or text.lower().startswith(LIVE_SCHEMES) or text.lower().endswith(STREAMS_SUFFIX)


def live_sources(source: str | Path) -> list[str]:
    """The sources a live ``source`` names: itself, or the lines of a ``.streams`` file (UTF-8, a byte-order mark
    allowed; blank lines and ``#`` comments skipped; each line a camera index, a URL or a video file, a relative path
    taken from the file's folder). Raises :class:`StreamError` naming the file and line for an empty file, a missing
    file, a line that is none of these, or more than :data:`MAX_STREAMS`."""
    text = str(source)
    if not text.lower().endswith(STREAMS_SUFFIX):
        return [text]
    path = Path(text)
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()  # Notepad's files begin with a BOM
    except (OSError, UnicodeDecodeError) as e:
        raise StreamError(f"{path}: cannot read the streams file ({e})") from None
    sources = []
    for number, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        source = line if is_live(line) else str(path.parent / line)  # an absolute path stays itself
        if not (is_live(source) or Path(source).is_file()) or source.lower().endswith(STREAMS_SUFFIX):
            looked = f" (no file {source})" if source != line and "://" not in line else ""
            raise StreamError(f"{path}, line {number}: {value_text(redact_url(line))}{looked} is not a camera index, a "
                              f"URL ({', '.join(LIVE_SCHEMES)}) or a video file")
        sources.append(source)
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


class LiveStream:
    """One source read by a thread (see the module docstring): a live one keeps only the newest frame, a video gives
    every frame.

    Opened at once (a source that cannot be opened raises :class:`StreamError`); ``source`` is its name (its URL
    with the secrets hidden), ``frames`` counts the frames read, ``dropped`` those replaced before :meth:`take` got
    them; ``fps`` is what the source announces (``0`` when it does not); ``error`` is why it failed. ``condition`` is
    shared by the streams of a :class:`StreamGroup` and notified at each new frame, each frame taken and at the end.
    ``reconnect``: seconds a live source that stopped is reopened (:data:`RECONNECT` when ``None``; ``0`` never)."""

    def __init__(self, source: str, stream: int = 0, condition: threading.Condition | None = None, *,
                 reconnect: float | None = None):
        cv2 = require("cv2", "video", "reading cameras and streams")
        self.source, self.stream, self._url = redact_url(source), stream, source
        self.reconnect = RECONNECT if reconnect is None else reconnect
        self.condition = condition or threading.Condition()
        self.frames = self.dropped = 0
        self.error: StreamError | None = None
        self.ended = False
        self._latest: Frame | None = None
        self._stop = threading.Event()
        self._outage: float | None = None  # when the source stopped giving frames, while it does not
        self.alive = time.monotonic()  # the reader's last sign of progress (a frame, a reopen, a frame taken)
        self._capture = open_capture(source)
        if self._capture is None:
            raise cannot_open(source)
        self.fps = self._capture.get(cv2.CAP_PROP_FPS) or 0.0
        count = self._capture.get(cv2.CAP_PROP_FRAME_COUNT)
        self.length = int(count) if 0 < count < 2**31 else None
        """The frame count a video announces (a file, or a video file served over HTTP); ``None`` when live."""
        self._live = self.length is None and is_live(source)  # a local file of unknown length ends at its end
        self._thread = threading.Thread(target=self._run, args=(cv2,), name=f"ssd-stream-{stream}", daemon=True)
        self._thread.start()

    def take(self) -> Frame | None:
        """The newest frame not taken yet, or ``None``; call with :attr:`condition` held."""
        frame, self._latest = self._latest, None
        if frame is not None:
            self.alive = time.monotonic()
            self.condition.notify_all()  # a video's reader waits for its frame to be taken
        return frame

    @property
    def waiting(self) -> bool:
        """A frame is ready to take; read with :attr:`condition` held."""
        return self._latest is not None

    @property
    def done(self) -> bool:
        """Ended (or failed) and nothing left to take; read with :attr:`condition` held."""
        return self.ended and self._latest is None

    def stop(self) -> None:
        """Ask the reader to stop (it exits after its current read): :meth:`close` then waits for it."""
        self._stop.set()
        with self.condition:
            self.condition.notify_all()

    def close(self) -> None:
        """Stop the reader and release the source."""
        self.stop()
        self._thread.join(timeout=2 * TIMEOUT_MS / 1000)

    def _run(self, cv2) -> None:
        capture = self._capture
        try:
            with QUIET(cv2, ffmpeg=not self._url.isdigit()):  # a read that times out logs OpenCV's own WARN line
                while not self._stop.is_set():
                    ok, image = capture.read()
                    if ok:
                        self._put(from_bgr(image))
                        continue
                    capture.release()
                    capture = self._reconnect() if self._live else None
                    if capture is None:
                        break
        except Exception as e:  # whatever stops a reader stops its stream, and is said
            self.error = StreamError(f"{self.source}: reading failed after {self.frames} frames "
                                     f"({type(e).__name__}: {redact_url(str(e))})")
        finally:
            if capture is not None:
                capture.release()
            if self.error is None and not self._live and self.frames == 0 and not self._stop.is_set():
                self.error = StreamError(
                    f"{self.source}: opened, but no frame could be read (OpenCV cannot read a video whose index is "
                    f"at its end from a server without range requests, such as python -m http.server: download it, "
                    f"or serve it with range requests)" if is_live(self._url) else
                    f"{self.source}: cannot read any frame (not a video OpenCV can decode)")
            with self.condition:
                self.ended = True
                self.condition.notify_all()

    def _put(self, image: Any) -> None:
        """Offer a frame: a live one replaces the one not taken yet (dropped), a video's waits until it is taken."""
        with self.condition:
            if not self._live:
                self.condition.wait_for(lambda: self._latest is None or self._stop.is_set())
            if self._stop.is_set():  # stopped, or failed as stuck: no frame after its end
                return
            self.dropped += self._latest is not None
            self._latest = Frame(image, self.stream, self.frames, time.perf_counter(), self.source)
            self.frames += 1
            self.condition.notify_all()
        self._outage, self.alive = None, time.monotonic()

    def _reconnect(self):
        """A reopened capture, or ``None`` after a stop or :attr:`reconnect` seconds of outage (:attr:`error` set).
        The outage lasts until a frame comes: a source that reopens and then gives no frame is not retried forever."""
        self.alive = time.monotonic()
        self._outage = self.alive if self._outage is None else self._outage
        deadline, delay, attempts = self._outage + self.reconnect, RECONNECT_DELAY, 0
        while (left := deadline - time.monotonic()) > 0:
            if self._stop.wait(min(delay, left)):
                return None
            delay = min(2 * delay, MAX_RECONNECT_DELAY)
            if (left := deadline - time.monotonic()) <= 0:
                break
            attempts, self.alive = attempts + 1, time.monotonic()
            if (capture := open_capture(self._url, min(TIMEOUT_MS, 1000 * left))) is not None:
                return capture
        self.error = StreamError(f"{self.source} stopped after {self.frames} frames and did not come back within "
                                 f"{self.reconnect:g} s ({attempts} reconnection attempt{'s' * (attempts != 1)})")
        return None


class StreamGroup:
    """Live sources read concurrently; iterate for batches of their newest frames (at most one per source, in source
    order), until every source has ended. A source that fails is said at once (a warning) while the others go on,
    and its :class:`StreamError` raised once all have ended (one line naming each that failed); with ``fail_fast``
    the first failure is raised at once. ``reconnect``: see :class:`LiveStream`. Use as a context manager: leaving it
    (Ctrl-C included) stops every reader. :attr:`names`: the sources' names (their URLs with secrets hidden)."""

    def __init__(self, sources: list[str], *, reconnect: float | None = None, fail_fast: bool = False):
        self.condition = threading.Condition()
        self.streams: list[LiveStream] = []
        self.fail_fast = fail_fast
        try:
            for index, source in enumerate(sources):
                self.streams.append(LiveStream(source, index, self.condition, reconnect=reconnect))
        except BaseException:
            self.close()
            raise
        self.names = [s.source for s in self.streams]

    def __enter__(self) -> StreamGroup:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> Iterator[list[Frame]]:
        said: set[int] = set()
        while True:
            with self.condition:
                while not self.condition.wait_for(self._ready, timeout=STALL_S / 4):
                    self._fail_stalled()
                batch = [frame for stream in self.streams if (frame := stream.take()) is not None]
                failed = [s for s in self.streams if s.error is not None and s.done and s.stream not in said]
                over = all(s.done for s in self.streams)
            if batch:
                yield batch
            for stream in failed:
                said.add(stream.stream)
                if self.fail_fast:
                    raise stream.error
                if not over:
                    LOGGER.warning(f"{stream.error}; the other streams go on")
            if over and not batch:
                errors = [str(s.error) for s in self.streams if s.error is not None]
                if errors:
                    raise StreamError("; ".join(errors))
                return

    def _fail_stalled(self) -> None:
        """Fail a stream whose reader is stuck (:data:`STALL_S`); its thread is left to end (a daemon)."""
        for stream in self.streams:
            if not stream.ended and not stream.waiting and time.monotonic() - stream.alive > STALL_S:
                stream.error = StreamError(f"{stream.source}: no frame for {STALL_S:g} s (OpenCV's read neither "
                                           f"returned nor timed out)")
                stream.ended = True
                stream.stop()

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
            stream.stop()
        for stream in self.streams:
            stream.close()

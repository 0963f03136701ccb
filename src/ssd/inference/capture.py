"""Opening cameras and streams with OpenCV, quietly: :func:`open_capture` and :func:`cannot_open` (one message naming
the source, its secrets hidden, instead of OpenCV's and FFmpeg's own log lines); :data:`QUIET` keeps both logs silent
while a source opens or is read (:mod:`ssd.inference.streams` reports what fails).
"""

from __future__ import annotations

import glob
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ssd.errors import StreamError
from ssd.limits import value_text
from ssd.optional import require
from ssd.text import redact_url

__all__ = ["QUIET", "TIMEOUT_MS", "cannot_open", "open_capture"]

TIMEOUT_MS = 5000
"""How long OpenCV may take to open a URL or to read one frame of it before the open or read counts as failed."""
_FFMPEG_LOG, _FFMPEG_DEBUG = "OPENCV_FFMPEG_LOGLEVEL", "OPENCV_FFMPEG_DEBUG"


class _Quiet:
    """Silence OpenCV's log and FFmpeg's while sources open or are read (ssd reports what fails: a read that times
    out would print OpenCV's raw ``[ WARN:...]`` line). Both are the process's, and streams open and read from their
    reader threads: the first user in progress silences OpenCV (``cv2.utils.logging``, or ``cv2``'s own functions in
    wheels without it) and the last restores it; the first FFmpeg user sets ``OPENCV_FFMPEG_LOGLEVEL`` to quiet
    (OpenCV reads it as it opens through FFmpeg: once per process in 5.x, at each open in 4.x) and the last removes it,
    unless the user set it or ``OPENCV_FFMPEG_DEBUG``."""

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


QUIET = _Quiet()


def open_capture(source: str, timeout_ms: float = TIMEOUT_MS):
    """An opened ``cv2.VideoCapture`` of a camera index or a URL (FFmpeg, opening and each read bounded by
    ``timeout_ms``), or ``None``; OpenCV's and FFmpeg's logs are silent meanwhile (:data:`QUIET`): a failure is
    reported once, by :func:`cannot_open`, not also as OpenCV's raw ``[ERROR:0@0.025] ...`` lines or FFmpeg's
    ``[tcp @ 0x...] Connection to tcp://... failed`` ones."""
    cv2 = require("cv2", "video", "reading cameras and streams")
    timeout = max(int(timeout_ms), 1)
    with QUIET(cv2, ffmpeg=not source.isdigit()):
        if source.isdigit() and int(source) < 2**31:  # a C int: a larger index is no camera, never an overflow
            capture = cv2.VideoCapture(int(source))
        else:
            capture = cv2.VideoCapture(source, cv2.CAP_FFMPEG, [cv2.CAP_PROP_OPEN_TIMEOUT_MSEC, timeout,
                                                                cv2.CAP_PROP_READ_TIMEOUT_MSEC, timeout])
    if capture.isOpened():
        return capture
    capture.release()
    return None


def cannot_open(source: str) -> StreamError:
    """Why ``source`` (a camera index or a URL, named with its secrets hidden) did not open."""
    if source.isdigit():
        cameras = sorted(glob.glob("/dev/video*"))
        found = f"cameras here: {', '.join(cameras)}" if cameras else "no /dev/video* device here"
        return StreamError(f"camera {source} cannot be opened: no such camera, or another program uses it ({found})")
    return StreamError(f"cannot open {value_text(redact_url(source))}: unreachable, not a stream OpenCV's FFmpeg "
                       f"reads, or no answer within {TIMEOUT_MS / 1000:g} s")

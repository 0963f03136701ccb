"""Live sources under pressure (ssd.inference.streams): a source that gives no frame, a reader that fails, a video
served over HTTP, reconnecting for as long as asked, one failed source among several, and `.streams` files as
editors write them. Real streams come from servers on 127.0.0.1 made by the tests; where a real stream is not needed,
a fake capture stands in for OpenCV's, so every count is exact and no test waits on a clock."""

import functools
import http.server
import subprocess
import sys
import threading

import numpy as np
import pytest

from ssd.cli import main
from ssd.errors import StreamError
from ssd.inference.sources import predict_source
from ssd.inference.streams import StreamGroup, live_sources
from ssd.inference.writers import read_jsonl
from ssd.schemas import PredictConfig
from test_streams import MjpegServer, frame_number, grey, write_video

cv2 = pytest.importorskip("cv2")


class FakeCapture:
    """A ``cv2.VideoCapture`` stand-in: ``frames`` reads succeed (frame ``i`` is :func:`grey` of ``i % 20``), then
    each read returns ``(False, None)``, or raises ``fail`` when given; ``count`` is its announced frame count."""

    def __init__(self, frames: int, fail: Exception | None = None, count: float = -1.0):
        self.left, self.read_count, self.fail, self.count, self.released = frames, 0, fail, count, False

    def read(self):
        if self.left == 0:
            if self.fail is not None:
                raise self.fail
            return False, None
        self.left -= 1
        self.read_count += 1
        return True, grey((self.read_count - 1) % 20)

    def get(self, prop):
        return self.count if prop == cv2.CAP_PROP_FRAME_COUNT else 0.0

    def release(self):
        self.released = True


def fake_opens(monkeypatch, captures: dict):
    """Make ``open_capture(url, timeout)`` hand out, per source, the next of its list of captures (``None``: the
    source does not open); returns the list of ``(source, timeout_ms)`` of every open."""
    opens = []

    def open_capture(source, timeout_ms=5000):
        opens.append((source, timeout_ms))
        queue = captures[source]
        return queue.pop(0) if len(queue) > 1 else queue[0]

    monkeypatch.setattr("ssd.inference.streams.open_capture", open_capture)
    monkeypatch.setattr("ssd.inference.streams.RECONNECT_DELAY", 0.01)
    return opens


def read_all(group: StreamGroup) -> list:
    return [frame for batch in group for frame in batch]


class FileServer:
    """Python's own ``http.server`` (no range requests, as ``python -m http.server``) serving ``folder`` on
    127.0.0.1 until the test leaves."""

    def __init__(self, folder):
        handler = functools.partial(type("Quiet", (http.server.SimpleHTTPRequestHandler,),
                                         {"log_message": lambda *a: None}), directory=str(folder))
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_mp4_served_by_python_http_server_ends_with_an_error_instead_of_waiting_forever(tmp_path):
    # OpenCV opens it (the header says 100 frames) but reads none: the index is at the end, and the server cannot
    # seek there; the reader reopened it forever before
    writer = cv2.VideoWriter(str(tmp_path / "v.mp4"), cv2.VideoWriter_fourcc(*"mp4v"), 30, (64, 48))
    rng = np.random.default_rng(0)
    for _ in range(100):
        writer.write(rng.integers(0, 255, (48, 64, 3), np.uint8))
    writer.release()
    with FileServer(tmp_path) as server, StreamGroup([f"{server.base}/v.mp4"]) as group:
        with pytest.raises(StreamError, match=r"/v.mp4: opened, but no frame could be read \(OpenCV cannot read a "
                                              r"video whose index is at its end from a server without range"):
            read_all(group)
        assert group.frames == 0


@pytest.mark.slow
def test_video_url_with_a_frame_count_gives_every_frame_in_order(tiny_checkpoint, tmp_path):
    write_video(tmp_path / "clip.avi", 6)
    with FileServer(tmp_path) as server:
        url = f"{server.base}/clip.avi"
        summary = predict_source(PredictConfig(weights=tiny_checkpoint, source=url, save_dir=tmp_path / "out",
                                               save_images=False), progress=False)
        with StreamGroup([url]) as group:
            frames = read_all(group)
    # the model is slower than the download: a live stream would drop frames, a video gives each one
    assert summary.stopped is None and (summary.live_frames, summary.dropped) == (6, 0)
    assert [r["frame"] for r in read_jsonl(summary.save_dir / "predictions.jsonl")] == list(range(6))
    assert [frame_number(f.image) for f in frames] == [f.index for f in frames] == list(range(6))


def test_a_url_that_opens_but_never_gives_a_frame_is_retried_for_the_seconds_asked_only(monkeypatch):
    url = "rtsp://127.0.0.1:9/cam"
    opens = fake_opens(monkeypatch, {url: [FakeCapture(2), FakeCapture(0)]})  # then every reopen: no frame
    with StreamGroup([url], reconnect=0.2) as group, pytest.raises(
            StreamError, match=r"^rtsp://127.0.0.1:9/cam stopped after 2 frames and did not come back within 0.2 s "
                               r"\(\d+ reconnection attempts?\)$"):
        read_all(group)
    assert len(opens) >= 2  # reopened, and given up although each reopen succeeded
    # no open may outlast what is left of the 0.2 s (an open's own 5 s timeout made 3.5 s take 25 s)
    assert all(timeout <= 200 for _, timeout in opens[1:])


def test_reader_that_fails_is_an_error_with_a_nonzero_exit(monkeypatch, tiny_checkpoint, tmp_path, capsys):
    url = "rtsp://127.0.0.1:9/cam"
    fake_opens(monkeypatch, {url: [FakeCapture(3, fail=RuntimeError("decoder exploded"))]})
    with StreamGroup([url]) as group, pytest.raises(
            StreamError, match=r"^rtsp://127.0.0.1:9/cam: reading failed after 3 frames \(RuntimeError: decoder "
                               r"exploded\)$"):
        read_all(group)
    fake_opens(monkeypatch, {url: [FakeCapture(3, fail=RuntimeError("decoder exploded"))]})
    code = main(["predict", "--weights", str(tiny_checkpoint), "--source", url, "--save-dir", str(tmp_path / "o")])
    assert code == 1
    assert "error: rtsp://127.0.0.1:9/cam: reading failed after 3 frames (RuntimeError: decoder exploded)" \
        in capsys.readouterr().err


def test_one_failed_camera_does_not_stop_the_others_unless_asked(monkeypatch, ssd_messages):
    a, b = "rtsp://127.0.0.1:9/a", "rtsp://127.0.0.1:9/b"
    a_failed = threading.Event()

    class Failing(FakeCapture):
        def release(self):
            a_failed.set()

    class AfterA(FakeCapture):  # a video of 40 frames, read once a has failed
        def read(self):
            a_failed.wait(30)
            return super().read()

    fake_opens(monkeypatch, {a: [Failing(1)], b: [AfterA(40, count=40)]})
    with StreamGroup([a, b], reconnect=0) as group:
        with pytest.raises(StreamError, match=r"^rtsp://127.0.0.1:9/a stopped after 1 frames and did not come back "
                                              r"within 0 s \(0 reconnection attempts\)$"):
            frames = []
            for batch in group:
                frames += batch
        assert [f.index for f in frames if f.stream == 1] == list(range(40))  # b read to its end
    assert "rtsp://127.0.0.1:9/a stopped after 1 frames and did not come back within 0 s (0 reconnection attempts); " \
        "the other streams go on" in ssd_messages()

    class Endless(FakeCapture):  # a camera that never stops
        def read(self):
            return True, grey(0)

    fake_opens(monkeypatch, {a: [FakeCapture(1), None], b: [Endless(0)]})
    with StreamGroup([a, b], reconnect=0, fail_fast=True) as group, pytest.raises(
            StreamError, match=r"^rtsp://127.0.0.1:9/a stopped after 1 frames"):
        read_all(group)


def test_streams_file_with_a_bom_and_relative_paths_from_its_own_folder(tmp_path, monkeypatch):
    (tmp_path / "cams").mkdir()
    write_video(tmp_path / "cams" / "a.avi", 3)
    listing = tmp_path / "cams" / "site.streams"
    listing.write_bytes("\ufeffa.avi\n# the gate\nrtsp://127.0.0.1:9/gate\n".encode("utf-8"))  # as Notepad saves
    monkeypatch.chdir(tmp_path)  # not the file's folder
    assert live_sources(listing) == [str(tmp_path / "cams" / "a.avi"), "rtsp://127.0.0.1:9/gate"]
    listing.write_text("b.avi\n")
    with pytest.raises(StreamError, match=r"line 1: 'b.avi' \(no file .*cams/b.avi\) is not a camera"):
        live_sources(listing)


def test_streams_video_of_unknown_length_ends_at_its_end(monkeypatch, tmp_path):
    video = str(tmp_path / "clip.avi")
    opens = fake_opens(monkeypatch, {video: [FakeCapture(3), FakeCapture(3)]})  # no frame count in its header
    with StreamGroup([video]) as group:
        frames = read_all(group)  # it looped forever: each end reopened it
    assert [f.index for f in frames] == [0, 1, 2] and len(opens) == 1


@pytest.mark.slow
def test_a_stream_that_drops_reconnects_quietly_and_fails_in_one_line(tiny_checkpoint, tmp_path, capfd, monkeypatch):
    # a process of its own, as `ssd predict` runs: OpenCV's WARN lines and FFmpeg's come from C, on its stderr
    monkeypatch.delenv("OPENCV_FFMPEG_LOGLEVEL", raising=False)
    server = MjpegServer(5)
    server.server.timeout = 120  # the run starts Python and torch before it connects
    with server:
        done = subprocess.run([sys.executable, "-m", "ssd", "predict", "--weights", str(tiny_checkpoint), "--source",
                               server.url, "--save-dir", str(tmp_path / "o"), "--reconnect", "0.5"], timeout=120)
    err = capfd.readouterr().err
    assert done.returncode == 1
    assert "/feed stopped after 5 frames and did not come back within 0.5 s (" in err
    assert not [line for line in err.splitlines() if line.startswith("[")]  # [ WARN:0@...], [http @ 0x...], ...


def test_reconnect_takes_seconds_from_zero_to_a_week():
    from ssd.errors import ConfigError
    from ssd.schemas import PredictConfig

    assert PredictConfig(weights="w.pt", source="0", reconnect=0).reconnect == 0
    for bad in (-1, float("nan"), float("inf"), True, "3"):
        with pytest.raises(ConfigError, match=r"--reconnect must be a number of seconds from 0 to 604800 \(a week\)"):
            PredictConfig(weights="w.pt", source="0", reconnect=bad)


def test_a_reader_stuck_in_opencv_fails_its_stream(monkeypatch):
    # a read that neither returns nor times out (a driver or FFmpeg bug): the run must not wait on it forever
    release = threading.Event()

    class Stuck(FakeCapture):
        def read(self):
            if self.left == 0:
                release.wait(60)
                return False, None
            return super().read()

    url = "rtsp://127.0.0.1:9/cam"
    fake_opens(monkeypatch, {url: [Stuck(2)]})
    monkeypatch.setattr("ssd.inference.streams.STALL_S", 0.2)
    with StreamGroup([url]) as group:
        with pytest.raises(StreamError, match=r"^rtsp://127.0.0.1:9/cam: no frame for 0.2 s \(OpenCV's read neither "
                                              r"returned nor timed out\)$"):
            read_all(group)
        assert group.streams[0].frames == 2
        release.set()  # the stuck read returns at last: its stream is over, the reader exits

"""Live sources (ssd.inference.streams): real local streams made by the tests, an MJPEG feed over HTTP from a
server on 127.0.0.1 (bounded in requests and time) and video files read as streams; frame counts are exact, since
every frame read is either taken or counted as dropped."""

import http.server
import json
import os
import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from ssd.cli import main
from ssd.errors import ConfigError, StreamError
from ssd.inference.detector import load
from ssd.inference.sources import predict_source
from ssd.inference.streams import StreamGroup, is_live, live_sources, stream_name
from ssd.inference.videos import source_frames, video_frames
from ssd.inference.writers import read_jsonl
from ssd.schemas import PredictConfig

cv2 = pytest.importorskip("cv2")

GREYS = 20  # frame i of a test stream is uniform grey 10 * i: a frame's content tells its number


def grey(index: int, size=(48, 64)) -> np.ndarray:
    return np.full((*size, 3), 10 * index, np.uint8)


def frame_number(image) -> int:
    """The number of a frame of :func:`grey` (JPEG and MJPG keep a uniform grey within a few levels)."""
    return round(float(image.float().mean()) / 10)


class MjpegServer:
    """Serves ``count`` JPEG frames (``frame`` of ``i % GREYS``, :func:`grey` by default) as one
    multipart/x-mixed-replace response to each of ``requests`` requests on 127.0.0.1, then stops listening; each wait
    for a request gives up after 10 s, and a response ends early when the client leaves or after ``seconds``."""

    def __init__(self, count: int, requests: int = 1, seconds: float = 30, frame=grey):
        jpegs = [cv2.imencode(".jpg", frame(i))[1].tobytes() for i in range(min(count, GREYS))]

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                deadline = time.monotonic() + seconds
                for i in range(count):
                    if time.monotonic() > deadline:
                        return
                    jpeg = jpegs[i % GREYS]
                    try:
                        self.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n%s\r\n"
                                         % (len(jpeg), jpeg))
                    except (BrokenPipeError, ConnectionResetError):
                        return

            def log_message(self, *args):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.server.timeout = 10
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/feed"
        self.thread = threading.Thread(target=self._serve, args=(requests,), daemon=True)

    def _serve(self, requests: int) -> None:
        for _ in range(requests):
            self.server.handle_request()
        self.server.server_close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.thread.join(timeout=30)


def write_video(path, count: int, size=(48, 64)):
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, size[::-1])
    for i in range(count):
        writer.write(grey(i, size))
    writer.release()
    return path


def read_all(group: StreamGroup) -> list:
    return [frame for batch in group for frame in batch]


def test_is_live_and_names():
    assert [is_live(s) for s in ("0", "12", "rtsp://cam/live", "HTTP://x/y.mjpg", "a.streams", "clip.mp4", "d")] \
        == [True, True, True, True, True, False, False]
    assert [stream_name(s) for s in ("0", "rtsp://user:pw@10.0.0.2:8554/live/cam?x=1", "clips/a.mp4")] \
        == ["camera0", "10.0.0.2_8554_live_cam", "a"]
    # one sanitizer with the crops' class folders (files.safe_name): unsafe characters, ends, length
    assert stream_name("http://h/é t/../x?y", ".mp4") == "h_é t_.._x.mp4"
    assert stream_name("rtsp://" + "a" * 400 + "/", ".mp4").endswith(".mp4")
    assert len(stream_name("rtsp://" + "a" * 400 + "/", ".mp4").encode()) <= 255
    assert stream_name("rtsp://./") == "stream"


def test_mjpeg_stream_over_http_ends_with_a_clear_error():
    with MjpegServer(12) as server, StreamGroup([server.url], reconnect=0) as group:
        frames = []
        with pytest.raises(StreamError, match=r"/feed stopped after 12 frames and did not come back within 0 s "
                                              r"\(0 reconnection attempts\)"):
            for batch in group:
                frames += batch
        stream = group.streams[0]
        # each frame read is taken or counted dropped; each taken one is the frame its index says
        assert len(frames) + stream.dropped == stream.frames == 12
        assert [frame_number(f.image) for f in frames] == [f.index for f in frames]
        assert [f.index for f in frames] == sorted({f.index for f in frames})
        assert {(f.source, f.stream, tuple(f.image.shape)) for f in frames} == {(server.url, 0, (3, 48, 64))}


def test_stream_reconnects_after_a_drop(monkeypatch):
    monkeypatch.setattr("ssd.inference.streams.RECONNECT_DELAY", 0.01)
    with MjpegServer(5, requests=2) as server, StreamGroup([server.url], reconnect=0.5) as group:
        with pytest.raises(StreamError, match="stopped after 10 frames"):
            read_all(group)
        assert group.frames == 10


def test_streams_file_reads_sources_concurrently(tmp_path):
    write_video(tmp_path / "a.avi", 8)
    write_video(tmp_path / "b.avi", 6, size=(32, 40))
    listing = tmp_path / "cams.streams"
    listing.write_text(f"# two cameras\n{tmp_path / 'a.avi'}\n\n  {tmp_path / 'b.avi'}  \n")
    assert live_sources(listing) == [str(tmp_path / "a.avi"), str(tmp_path / "b.avi")]
    with StreamGroup(live_sources(listing)) as group:
        batches = list(group)  # files end after their frame count: no error
        # a batch holds the newest frame of each stream that has one, in stream order
        assert all([f.stream for f in batch] in ([0], [1], [0, 1]) for batch in batches)
        frames = [f for batch in batches for f in batch]
        for stream, count in ((0, 8), (1, 6)):
            mine = [f for f in frames if f.stream == stream]
            assert len(mine) + group.streams[stream].dropped == count
            assert [frame_number(f.image) for f in mine] == [f.index for f in mine]
        assert {tuple(f.image.shape) for f in frames if f.stream == 1} == {(3, 32, 40)}


def test_video_frames_keep_every_frame_in_order(tmp_path):
    path = write_video(tmp_path / "clip.avi", 7)
    batches = list(video_frames(path, 3))
    assert [len(b) for b in batches] == [3, 3, 1]
    assert [frame_number(f.image) for b in batches for f in b] == list(range(7))
    assert [f.index for b in batches for f in b] == list(range(7))
    (tmp_path / "broken.avi").write_bytes(b"not a video")
    with pytest.raises(StreamError, match="broken.avi: cannot read any frame"):
        list(video_frames(tmp_path / "broken.avi", 3))


def test_closing_stops_every_reader():
    with MjpegServer(GREYS) as server:
        batches = source_frames(server.url, 1)
        first = next(batches)
        batches.close()  # what an interrupted run does: the group's readers stop and release their captures
        assert first[0].index >= 0
    assert not [t for t in threading.enumerate() if t.name.startswith("ssd-stream-")]


def test_bad_sources_say_what_is_wrong(tmp_path):
    empty = tmp_path / "none.streams"
    empty.write_text("# nothing yet\n\n")
    with pytest.raises(StreamError, match=r"none.streams: no sources in the streams file"):
        live_sources(empty)
    bad = tmp_path / "bad.streams"
    bad.write_text("0\nnot-here.mp4\n")
    with pytest.raises(StreamError, match=r"line 2: 'not-here.mp4' \(no file .*/not-here.mp4\) is not a camera"):
        live_sources(bad)
    with pytest.raises(StreamError, match=r"missing.streams: cannot read the streams file"):
        live_sources(tmp_path / "missing.streams")
    with pytest.raises(StreamError, match=r"camera 7 cannot be opened: no such camera"):
        StreamGroup(["7"])
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StreamError, match=rf"cannot open 'http://127.0.0.1:{port}/x': unreachable"):
        StreamGroup([f"http://127.0.0.1:{port}/x"])


def test_an_unreachable_stream_is_reported_once_without_ffmpegs_own_log_line(tiny_checkpoint, tmp_path, capfd,
                                                                              monkeypatch):
    # a process of its own: FFmpeg takes its log level when the process first uses it, as `ssd predict` does here
    monkeypatch.delenv("OPENCV_FFMPEG_LOGLEVEL", raising=False)  # a level the user set would be kept
    done = subprocess.run([sys.executable, "-m", "ssd", "predict", "--weights", str(tiny_checkpoint), "--source",
                           "rtsp://127.0.0.1:9/none", "--project", str(tmp_path)], timeout=60)  # port 9: discard
    err = capfd.readouterr().err
    assert done.returncode == 1
    assert "cannot open 'rtsp://127.0.0.1:9/none': unreachable, not a stream OpenCV's FFmpeg reads" in err
    assert "[tcp @" not in err and "Connection refused" not in err
    with pytest.raises(StreamError, match="unreachable"):
        StreamGroup(["rtsp://127.0.0.1:9/none"])
    assert "OPENCV_FFMPEG_LOGLEVEL" not in os.environ  # the environment as it was


class _FakeLogging:
    LOG_LEVEL_SILENT = 0

    def __init__(self):
        self.level, self.set = 3, []

    def getLogLevel(self):  # OpenCV's names
        return self.level

    def setLogLevel(self, level):
        self.level = level
        self.set.append(level)


def test_opens_at_once_keep_opencv_and_ffmpeg_silent_until_the_last_ends(monkeypatch):
    from types import SimpleNamespace

    from ssd.inference.capture import _Quiet

    logging = _FakeLogging()
    cv2 = SimpleNamespace(utils=SimpleNamespace(logging=logging))
    for name in ("OPENCV_FFMPEG_LOGLEVEL", "OPENCV_FFMPEG_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    quiet = _Quiet()
    with quiet(cv2, ffmpeg=False):  # a camera: no FFmpeg
        assert "OPENCV_FFMPEG_LOGLEVEL" not in os.environ and logging.level == 0
        with quiet(cv2, ffmpeg=True):  # a stream opening meanwhile (a reader reconnecting)
            with quiet(cv2, ffmpeg=True):  # and another
                assert os.environ["OPENCV_FFMPEG_LOGLEVEL"] == "-8"
            assert os.environ["OPENCV_FFMPEG_LOGLEVEL"] == "-8"  # the first still opens
        assert "OPENCV_FFMPEG_LOGLEVEL" not in os.environ and logging.level == 0  # the camera still opens
    assert logging.set == [0, 3]  # silenced once, restored once, by the last
    with quiet(SimpleNamespace(getLogLevel=logging.getLogLevel, setLogLevel=logging.setLogLevel), ffmpeg=True):
        assert logging.level == 0 and os.environ["OPENCV_FFMPEG_LOGLEVEL"] == "-8"  # a wheel without cv2.utils.logging
    assert logging.level == 3 and "OPENCV_FFMPEG_LOGLEVEL" not in os.environ
    monkeypatch.setenv("OPENCV_FFMPEG_DEBUG", "1")  # the user asked for FFmpeg's log
    with quiet(cv2, ffmpeg=True):
        assert "OPENCV_FFMPEG_LOGLEVEL" not in os.environ


def test_predict_on_a_streams_file_writes_each_stream(tiny_checkpoint, tmp_path):
    write_video(tmp_path / "a.avi", 4)
    write_video(tmp_path / "b.avi", 3)
    listing = tmp_path / "two.streams"
    listing.write_text(f"{tmp_path / 'a.avi'}\n{tmp_path / 'b.avi'}\n")
    summary = predict_source(PredictConfig(weights=tiny_checkpoint, source=listing, save_dir=tmp_path / "out"),
                             progress=False)
    assert summary.stopped is None and summary.streams == 2
    assert (summary.live_frames, summary.dropped) == (7, 0)  # video files give every frame
    records = list(read_jsonl(summary.save_dir / "predictions.jsonl"))
    assert len(records) == summary.live_frames
    assert {r["file"] for r in records} <= {str(tmp_path / "a.avi"), str(tmp_path / "b.avi")}
    assert [r["frame"] for r in records if r["file"].endswith("b.avi")] == [0, 1, 2]
    drawn = cv2.VideoCapture(str(summary.save_dir / "b.avi"))
    assert drawn.get(cv2.CAP_PROP_FRAME_COUNT) == len([r for r in records if r["file"].endswith("b.avi")])
    drawn.release()
    assert f"{summary.live_frames} frames of 2 live streams ({summary.dropped} more dropped" in str(summary)


def test_predict_cli_on_a_stream_that_stops(tiny_checkpoint, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("ssd.inference.streams.RECONNECT_DELAY", 0.01)
    with MjpegServer(6) as server:
        code = main(["predict", "--weights", str(tiny_checkpoint), "--source", server.url, "--save-dir",
                     str(tmp_path / "out"), "--track", "--reconnect", "0.2"])
    err = capsys.readouterr().err
    assert code == 1 and "/feed stopped after 6 frames and did not come back within 0.2 s (" in err
    records = json.loads((tmp_path / "out" / "predictions.json").read_text())["images"]  # written all the same
    assert 1 <= len(records) <= 6 and all(r["file"] == server.url for r in records)
    assert all("track_id" in d for r in records for d in r["detections"])
    assert (tmp_path / "out" / "127.0.0.1_{}_feed.avi".format(server.url.split(":")[2].split("/")[0])).is_file()


def test_ctrl_c_stops_a_live_run_with_valid_outputs(tiny_checkpoint, tmp_path):
    detector = load(tiny_checkpoint)
    detect, calls = detector.detect, []

    def interrupted(*args, **kwargs):  # the user presses Ctrl-C while the third frame is being detected
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return detect(*args, **kwargs)

    detector.detect = interrupted
    with MjpegServer(10**9) as server:  # a stream that goes on until the run stops reading it (30 s at most)
        summary = predict_source(PredictConfig(source=server.url, save_dir=tmp_path / "out"), detector, progress=False)
    assert summary.stopped == "Ctrl-C" and summary.live_frames == 2
    assert len(json.loads(summary.results_file.read_text())["images"]) == 2
    assert not [t for t in threading.enumerate() if t.name.startswith("ssd-stream-")]


def test_live_source_errors_come_before_any_output(tiny_checkpoint, tmp_path, monkeypatch):
    detector = load(tiny_checkpoint)
    with pytest.raises(StreamError, match="camera 9 cannot be opened"):
        predict_source(PredictConfig(source="9", save_dir=tmp_path / "out"), detector, progress=False)
    empty = tmp_path / "empty.streams"
    empty.write_text("")
    with pytest.raises(StreamError, match="no sources in the streams file"):
        predict_source(PredictConfig(source=empty, save_dir=tmp_path / "out"), detector, progress=False)
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(ConfigError, match="--show needs a display, and there is none here"):
        predict_source(PredictConfig(source=write_video(tmp_path / "a.avi", 2), save_dir=tmp_path / "out", show=True),
                       detector)
    assert not (tmp_path / "out").exists()

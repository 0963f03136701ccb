"""What a stream's run leaves behind (ssd.inference.videos, SIGTERM in ssd predict): a writer that cannot write
fails loudly, a stream that changes size is drawn honestly, a killed live run leaves a video that plays, and SIGTERM
ends a stream or folder run as Ctrl-C does. Streams come from servers on 127.0.0.1 made by the tests (or fake
captures); runs that are signalled are processes of their own, waited for with bounded polls."""

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import ssd
from ssd.errors import OutputError
from ssd.inference.sources import predict_source
from ssd.inference.writers import read_jsonl
from ssd.schemas import PredictConfig
from test_stream_failures import FakeCapture, fake_opens
from test_streams import MjpegServer, write_video

cv2 = pytest.importorskip("cv2")


def video_frames(path) -> list[np.ndarray]:
    capture, frames = cv2.VideoCapture(str(path)), []
    while (read := capture.read())[0]:
        frames.append(read[1])
    capture.release()
    return frames


def test_a_video_writer_that_cannot_write_fails_loudly(tiny_checkpoint, tmp_path, monkeypatch):
    class NoCodec:  # what OpenCV gives for a codec it was built without: a writer that never opened
        def __init__(self, *args):
            pass

        def isOpened(self):
            return False

        def release(self):
            pass

    clip = write_video(tmp_path / "clip.avi", 2)
    monkeypatch.setattr(cv2, "VideoWriter", NoCodec)
    with pytest.raises(OutputError, match=r"clip.avi: OpenCV cannot write this video \(its mp4v writer did not open"):
        predict_source(PredictConfig(weights=tiny_checkpoint, source=clip, save_dir=tmp_path / "out"), progress=False)
    # the results so far are written all the same
    assert len(list(read_jsonl(tmp_path / "out" / "predictions.jsonl"))) == 1


def test_a_stream_that_changes_size_is_drawn_at_its_first_size_and_said(tiny_checkpoint, tmp_path, monkeypatch):
    class Growing(FakeCapture):  # a camera switched from 64x48 to 128x96 after its second frame
        def read(self):
            ok, image = super().read()
            return ok, (cv2.resize(image, (128, 96)) if ok and self.read_count > 2 else image)

    url = "rtsp://127.0.0.1:9/cam"
    fake_opens(monkeypatch, {url: [Growing(4, count=4)]})  # a frame count: every frame is read
    summary = predict_source(PredictConfig(weights=tiny_checkpoint, source=url, save_dir=tmp_path / "out", reconnect=0),
                             progress=False)
    records = list(read_jsonl(tmp_path / "out" / "predictions.jsonl"))
    drawn = video_frames(tmp_path / "out" / "127.0.0.1_9_cam.avi")
    assert len(drawn) == len(records) and {f.shape for f in drawn} == {(48, 64, 3)}
    assert [(r["frame"], r["width"], r["height"]) for r in records] == [(0, 64, 48), (1, 64, 48), (2, 128, 96),
                                                                         (3, 128, 96)]
    assert summary.notes[0] == "rtsp://127.0.0.1:9/cam changed size from 64x48 to 128x96 at frame 2: " \
        f"{tmp_path / 'out' / '127.0.0.1_9_cam.avi'} shows its frames scaled to 64x48 (predictions.jsonl keeps each " \
        "frame's own size and boxes)"


def noise(index: int) -> np.ndarray:
    """A 240x320 frame of noise: JPEG cannot shrink it, so a drawn video grows by tens of KB a frame."""
    return np.random.default_rng(index).integers(0, 255, (240, 320, 3), np.uint8)


def start_predict(args: list[str], log) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "ssd", "predict", *args], env=env, stdout=out, stderr=out)


def wait_for(condition, proc, log, what: str) -> None:
    """Poll until ``condition()`` holds; fail with the run's output if the run ends first or after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {DEADLINE_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.is_file() else 0


DEADLINE_S = 120  # a bound for a loaded machine, not a timing expectation


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stream_run_stopped_by_sigterm_or_kill_9_leaves_a_video_that_plays(tiny_checkpoint, tmp_path, sig):
    out, log = tmp_path / "out", tmp_path / "log.txt"
    server = MjpegServer(10**9, seconds=DEADLINE_S, frame=noise)
    server.server.timeout = DEADLINE_S  # the run starts Python and torch before it connects
    with server:
        proc = start_predict(["--weights", str(tiny_checkpoint), "--source", server.url, "--save-dir", str(out),
                              "--format", "json"], log)
        video = out / f"127.0.0.1_{server.url.split(':')[2].split('/')[0]}_feed.avi"
        wait_for(lambda: lines(out / "predictions.jsonl") >= 3 and video.is_file() and video.stat().st_size > 10**5,
                 proc, log, "three results and a drawn video under way")
        proc.send_signal(sig)
        code = proc.wait(DEADLINE_S)
    records = list(read_jsonl(out / "predictions.jsonl"))
    frames = video_frames(video)
    assert 1 <= len(frames) <= len(records)  # a frame is drawn after its result is written
    assert {f.shape for f in frames} == {(240, 320, 3)}
    if sig == signal.SIGTERM:  # what Ctrl-C does: the --format file written, every drawn frame in the video
        assert code == 143 and "stopped by SIGTERM; the results so far are written" in log.read_text()
        assert len(json.loads((out / "predictions.json").read_text())["images"]) == len(records)
        assert len(frames) >= len(records) - 1  # the signal may land between a result and its drawing
    else:
        assert code == -signal.SIGKILL


@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_video_files_drawn_video_plays_after_kill_9(tmp_path):
    """A video file's drawn copy (MPEG-4 Part 2 in AVI, through FFmpeg): the process killed outright after 40 frames,
    the video still plays, up to what FFmpeg had buffered (an MP4 would have no index: nothing would play)."""
    code = f"""
        import os, signal, sys
        import numpy as np, torch
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from test_stream_outputs import noise
        from ssd.inference.videos import VideoOut

        frames = [torch.from_numpy(noise(i)).permute(2, 0, 1).contiguous() for i in range(40)]
        out = VideoOut(__import__("pathlib").Path({str(tmp_path / "clip.avi")!r}), 25.0, frames[0], "clip.mp4")
        for index, frame in enumerate(frames):
            out.write(frame, index)
        os.kill(os.getpid(), signal.SIGKILL)
    """
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()[-2000:]
    frames = video_frames(tmp_path / "clip.avi")
    assert 20 <= len(frames) <= 40 and {f.shape for f in frames} == {(240, 320, 3)}


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="signals")
def test_a_folder_run_stopped_by_sigterm_writes_its_format_file(tiny_checkpoint, tmp_path):
    images, out, log = tmp_path / "images", tmp_path / "out", tmp_path / "log.txt"
    images.mkdir()
    for i in range(300):
        cv2.imwrite(str(images / f"{i:03d}.png"), noise(i)[:64, :64])
    proc = start_predict(["--weights", str(tiny_checkpoint), "--source", str(images), "--save-dir", str(out),
                          "--format", "csv", "--batch-size", "1"], log)
    wait_for(lambda: lines(out / "predictions.jsonl") >= 2, proc, log, "two results")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(DEADLINE_S) == 143, log.read_text()[-3000:]
    assert "stopped by SIGTERM; the results so far are written" in log.read_text()
    records = list(read_jsonl(out / "predictions.jsonl"))
    with open(out / "predictions.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert 2 <= len(records) < 300 and len(rows) == sum(max(len(r["detections"]), 1) for r in records)
    assert len(list(out.glob("*.png"))) in (len(records) - 1, len(records))

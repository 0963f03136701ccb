"""Live-stream prediction on this CPU: does the model keep up with a 30 fps camera, and how late are its results?

A real stream on 127.0.0.1: ffmpeg generates a 640x480 test pattern (``testsrc2``) paced at ``--fps`` (``-re``) and
serves it as MJPEG over HTTP (``-f mpjpeg -listen 1``), the way IP cameras do; the library reads it as ``ssd
predict --source http://...`` does (:class:`ssd.inference.streams.StreamGroup`: a reader thread keeping only the
newest frame) and runs each frame through ``Detector.detect`` as it comes. Per variant, ``--seconds`` of stream:

- processed fps: frames with a result / the time from the first frame read to the last result,
- dropped: frames the reader replaced before the model took them (a model too slow for the camera drops frames,
  it does not fall behind), as a count and a share of the frames read,
- latency p50 / p99: from the moment the reader has a frame decoded to the moment its result exists (waiting for
  the model included; the network and the camera's own encoding are not),
- model per frame: the median time of the detection call (and ByteTrack's update) alone: a stream keeps up when
  it stays under the frame interval (33 ms at 30 fps) with room for the reader's decoding.

Variants: ``ssd_tiny`` (256 px) and ``ssdlite320_mobilenet_v3_large`` (320 px), seeded random weights (speed does
not depend on training; 6 classes as the demo), exported to ONNX Runtime and OpenVINO (FP32), thresholds as ``ssd
predict`` (conf 0.25); ``ssd_tiny`` on ONNX Runtime also with ``--track`` (ByteTrack). Needs ``ffmpeg`` on PATH.
Goal: ``ssd_tiny`` keeps up with 30 fps (nothing dropped but the odd frame), latency p99 < 100 ms.

Usage: ``.venv/bin/python benchmarks/stream.py [--seconds 20] [--fps 30]``
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ssd.errors import StreamError
from ssd.export import export
from ssd.inference.detector import load
from ssd.inference.streams import StreamGroup
from ssd.inference.tracking import Tracker
from ssd.models import build_model
from ssd.weights.checkpoint import save_checkpoint

MODELS = {"ssd_tiny": 256, "ssdlite320_mobilenet_v3_large": 320}
CONF = 0.25


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(seconds: float, fps: int) -> tuple[subprocess.Popen, str]:
    """ffmpeg serving ``seconds`` of a 640x480 test pattern at ``fps`` as MJPEG over HTTP to one client."""
    url = f"http://127.0.0.1:{free_port()}/feed"
    command = ["ffmpeg", "-hide_banner", "-loglevel", "error", "-re", "-f", "lavfi", "-i",
               f"testsrc2=size=640x480:rate={fps}", "-t", str(seconds), "-c:v", "mjpeg", "-q:v", "5", "-f", "mpjpeg",
               "-listen", "1", url]
    return subprocess.Popen(command), url


def connect(url: str) -> StreamGroup:
    """The stream once ffmpeg listens (it takes a moment to start)."""
    for _ in range(50):
        try:
            return StreamGroup([url], reconnect=0)
        except StreamError:
            time.sleep(0.1)
    raise RuntimeError(f"ffmpeg never served {url}")


def measure(detector, seconds: float, fps: int, track: bool) -> dict:
    detector.detect([torch.zeros(3, 480, 640, dtype=torch.uint8)], score_threshold=CONF)  # warm-up, not timed
    server, url = serve(seconds, fps)
    tracker = Tracker() if track else None
    latencies, compute, first = [], [], None
    try:
        with connect(url) as group:
            try:
                for batch in group:
                    first = first or batch[0].time
                    start = time.perf_counter()
                    results = detector.detect([f.image for f in batch], score_threshold=CONF)
                    if tracker is not None:
                        results = [tracker.update(r, f.index) for r, f in zip(results, batch)]
                    done = time.perf_counter()
                    latencies += [done - f.time for f in batch]
                    compute.append(done - start)
            except StreamError:  # the server's end of stream
                pass
            read, dropped = group.frames, group.dropped
    finally:
        server.wait(timeout=seconds + 30)
    return {"fps": len(latencies) / (done - first), "read": read, "dropped": dropped,
            "model": 1000 * float(np.median(compute)),
            "p50": 1000 * float(np.percentile(latencies, 50)), "p99": 1000 * float(np.percentile(latencies, 99))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--fps", type=int, default=30)
    args = parser.parse_args()
    if shutil.which("ffmpeg") is None:
        raise SystemExit("benchmarks/stream.py needs ffmpeg on PATH (apt-get install ffmpeg)")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, size in MODELS.items():
            torch.manual_seed(0)
            model = build_model(name, class_names=[f"c{k}" for k in range(6)], image_size=size).eval()
            weights = save_checkpoint(Path(tmp) / f"{name}.pt", model)
            for runtime, fmt in (("onnxruntime", "onnx"), ("openvino", "openvino")):
                detector = load(export(weights, fmt=fmt, out_path=Path(tmp) / f"{name}_{fmt}"
                                                                  f"{'.onnx' if fmt == 'onnx' else ''}"))
                tracks = (False, True) if (name, runtime) == ("ssd_tiny", "onnxruntime") else (False,)
                for track in tracks:
                    label = f"{name} {runtime}{' --track' if track else ''}"
                    rows.append((label, measure(detector, args.seconds, args.fps, track)))
                    print(label, rows[-1][1], flush=True)
    print(f"\n{args.seconds:g} s of 640x480 MJPEG at {args.fps} fps over HTTP from 127.0.0.1\n")
    print("| model, runtime | processed fps | dropped | latency p50 | latency p99 | model per frame (median) |")
    print("|---|---|---|---|---|---|")
    for label, m in rows:
        print(f"| {label} | {m['fps']:.1f} | {m['dropped']} of {m['read']} ({100 * m['dropped'] / m['read']:.0f}%) "
              f"| {m['p50']:.1f} ms | {m['p99']:.1f} ms | {m['model']:.1f} ms |")
    print(f"\nload average during the run (1 min): {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()

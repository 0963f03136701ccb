"""Throughput and latency of ``ssd serve`` with dynamic batching on and off (issue 26).

Real server processes on 127.0.0.1 serve the same ``ssd_tiny`` (seeded random weights, 256 px, the background logit
raised by ``BACKGROUND_BIAS``, which leaves tens of detections per image instead of the hundred of a random head)
exported to ONNX Runtime with a dynamic batch: batching off (``--max-batch 1``) and on (``--max-batch 8
--max-wait-ms 5``), each with one PyTorch thread (``--threads 1``, the default) and with PyTorch's default of one
per core (``--threads 0``). For N = 1, 4 and 16 concurrent clients (httpx, N connections, each sending the next
image as soon as its answer arrives), every server is driven for ``--seconds`` in ``--rounds`` slices, the servers in
turn, so that load from other processes on this shared machine hits all alike; requests/s and latency p50 / p99 are
printed side by side. The images are BCCD's first 32 (640x480 JPEGs) where the shared data is present, else
synthetic 320 px ones.

Every answer is compared with ``ssd predict`` (the CLI, batch 1) on the same image: the same labels in the same
order, boxes and scores within the float rounding of another batch composition (the largest differences printed).

Usage: ``.venv/bin/python benchmarks/serve.py [--seconds 8] [--rounds 4] [--clients 1,4,16]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch
from torch import nn

from ssd.export.onnx import export_onnx
from ssd.models import build_model

SHARED = Path(os.environ.get("SSD_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data"))
IMAGES = 32
MODES = {"off": ["--max-batch", "1"], "on": ["--max-batch", "8", "--max-wait-ms", "5"]}
THREADS = {"one": ["--threads", "1"], "per core": ["--threads", "0"]}  # the default, and PyTorch's own
SSD = [sys.executable, "-m", "ssd"]
BACKGROUND_BIAS = 0.63


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = build_model("ssd_tiny", class_names=["RBC", "WBC", "Platelets"]).eval()
    with torch.no_grad():
        for head in model.heads:
            conv = [m for m in head.cls.modules() if isinstance(m, nn.Conv2d)][-1]
            conv.bias.view(-1, 4)[:, 0] += BACKGROUND_BIAS  # [A, K+1], index 0 background
    return model


def _images(folder: Path) -> list[Path]:
    bccd = SHARED / "bccd" / "BCCD" / "JPEGImages"
    folder.mkdir()
    if bccd.is_dir():
        sources = sorted(bccd.glob("*.jpg"))[:IMAGES]
        for source in sources:
            (folder / source.name).write_bytes(source.read_bytes())
    else:
        from ssd.data.synthetic import generate_synthetic

        root = generate_synthetic(folder.parent / "synthetic", num_train=IMAGES, num_val=1, image_size=320)
        for source in sorted((root / "JPEGImages").glob("*.jpg"))[:IMAGES]:
            (folder / source.name).write_bytes(source.read_bytes())
    return sorted(folder.iterdir())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def _server(weights: Path, options: list[str]):
    port = _free_port()
    process = subprocess.Popen([*SSD, "serve", "--weights", str(weights), "--port", str(port), *options],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"ssd serve exited: {process.stdout.read()}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("ssd serve did not answer /health within 120 s")
            time.sleep(0.2)
        yield url, process
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ssd_predict(weights: Path, images: Path, out: Path) -> dict[str, dict]:
    """``ssd predict`` (batch 1) on the images: file name -> its record (width, height, detections)."""
    subprocess.run([*SSD, "predict", "--weights", str(weights), "--source", str(images), "--save-dir", str(out),
                    "--batch-size", "1", "--no-save-images"], check=True, capture_output=True)
    records = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    return {Path(record["file"]).name: record for record in records}


async def _drive(url: str, blobs: list[tuple[str, bytes]], clients: int, seconds: float, max_requests: int,
                 warm_up: bool = False) -> tuple[float, list[float], list[tuple[str, dict]]]:
    """Seconds taken and latencies (s) of the requests sent for ``seconds`` by ``clients`` concurrent senders, each
    sending its next image when its answer arrives (at most ``max_requests`` in all), and every answer with its
    image's name; ``warm_up``: first 2 requests per client, not counted."""
    latencies, answers, sent = [], [], 0
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as client:

        async def send(index: int) -> tuple[float, str, dict]:
            name, blob = blobs[index % len(blobs)]
            start = time.perf_counter()
            response = await client.post("/predict", content=blob, headers={"Content-Type": "image/jpeg"})
            response.raise_for_status()
            return time.perf_counter() - start, name, response.json()

        if warm_up:
            await asyncio.gather(*[send(i) for i in range(2 * clients)])
        end = time.perf_counter() + seconds

        async def sender() -> None:
            nonlocal sent
            while time.perf_counter() < end and sent < max_requests:
                sent += 1
                latency, name, answer = await send(sent)
                latencies.append(latency)
                answers.append((name, answer))

        start = time.perf_counter()
        await asyncio.gather(*[sender() for _ in range(clients)])
    return time.perf_counter() - start, latencies, answers


def _compare(answers: list[tuple[str, dict]], expected: dict[str, dict]) -> tuple[int, float, float, int]:
    """(answers whose labels differ from ssd predict's, largest box and score differences, exact answers)."""
    wrong, box_diff, score_diff, exact = 0, 0.0, 0.0, 0
    for name, answer in answers:
        want = expected[name]
        got_d, want_d = answer["detections"], want["detections"]
        if [d["label"] for d in got_d] != [d["label"] for d in want_d] or (
                answer["width"], answer["height"]) != (want["width"], want["height"]):
            wrong += 1
            continue
        if got_d:
            box_diff = max(box_diff, (torch.tensor([d["box"] for d in got_d])
                                      - torch.tensor([d["box"] for d in want_d])).abs().max().item())
            score_diff = max(score_diff, (torch.tensor([d["score"] for d in got_d])
                                          - torch.tensor([d["score"] for d in want_d])).abs().max().item())
        exact += got_d == want_d
    return wrong, box_diff, score_diff, exact


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per server and client count")
    parser.add_argument("--rounds", type=int, default=4, help="slices the seconds are driven in, servers in turn")
    parser.add_argument("--clients", default="1,4,16", help="concurrent client counts")
    parser.add_argument("--max-requests", type=int, default=2000, help="most requests per slice")
    args = parser.parse_args()
    servers = {(threads, mode): [*options, *thread_options] for threads, thread_options in THREADS.items()
               for mode, options in MODES.items()}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        images = _images(tmp / "images")
        blobs = [(path.name, path.read_bytes()) for path in images]
        weights = export_onnx(_model(), tmp / "ssd_tiny.onnx", dynamic_batch=True)
        expected = _ssd_predict(weights, tmp / "images", tmp / "predict")
        found = statistics.mean(len(record["detections"]) for record in expected.values())
        print(f"{len(images)} images ({images[0].parent.name}), ssd_tiny ONNX Runtime, {found:.1f} detections per "
              f"image, {os.cpu_count()} CPUs, {args.seconds:g} s per server and client count in {args.rounds} slices")
        figures: dict[tuple, tuple[float, list[float]]] = {}
        checks = {key: [0, 0.0, 0.0, 0, 0] for key in servers}
        with contextlib.ExitStack() as stack:
            urls = {key: stack.enter_context(_server(weights, options))[0] for key, options in servers.items()}
            for url in urls.values():
                asyncio.run(_drive(url, blobs, 4, 0, 0, warm_up=True))
            for clients in (int(c) for c in args.clients.split(",")):
                for _ in range(args.rounds):
                    for key, url in urls.items():
                        took, latencies, answers = asyncio.run(_drive(url, blobs, clients, args.seconds / args.rounds,
                                                                      args.max_requests))
                        total, all_latencies = figures.get((clients, *key), (0.0, []))
                        figures[(clients, *key)] = (total + took, all_latencies + latencies)
                        wrong, box, score, exact = _compare(answers, expected)
                        check = checks[key]
                        checks[key] = [check[0] + wrong, max(check[1], box), max(check[2], score), check[3] + exact,
                                       check[4] + len(answers)]
    for threads in THREADS:
        print(f"\nssd serve --threads {THREADS[threads][-1]}: batching off ({' '.join(MODES['off'])}) and on "
              f"({' '.join(MODES['on'])})")
        print(f"{'clients':>7} | {'req/s off':>9} {'on':>7} {'on/off':>6} | {'p50 ms off':>10} {'on':>6} | "
              f"{'p99 ms off':>10} {'on':>6}")
        for clients in (int(c) for c in args.clients.split(",")):
            rate, p50, p99 = {}, {}, {}
            for mode in MODES:
                took, latencies = figures[(clients, threads, mode)]
                rate[mode] = len(latencies) / took
                p50[mode], p99[mode] = (1000 * _percentile(latencies, q) for q in (50, 99))
            print(f"{clients:>7} | {rate['off']:>9.1f} {rate['on']:>7.1f} {rate['on'] / rate['off']:>6.2f} | "
                  f"{p50['off']:>10.1f} {p50['on']:>6.1f} | {p99['off']:>10.1f} {p99['on']:>6.1f}")
    print()
    for (threads, mode), (wrong, box, score, exact, total) in checks.items():
        print(f"--threads {THREADS[threads][-1]}, batching {mode}: {total} answers against ssd predict: {wrong} with "
              f"other labels, {exact} identical, largest difference {box:.2g} px (box), {score:.2g} (score)")


if __name__ == "__main__":
    main()

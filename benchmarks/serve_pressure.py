"""``ssd serve`` under pressure (issue 34): many clients, 16 MB uploads mixed in, and memory over many requests.

One ``ssd serve`` process on 127.0.0.1 with its default bounds (``--max-pending 32``, ``--timeout 30``,
``--max-pixels`` 4096², ``--max-batch 8``) serves ``benchmarks/serve.py``'s model (ssd_tiny, ONNX Runtime). Two runs:

1. ``--clients`` concurrent clients (default 64) for ``--seconds``, each sending its next request when its answer
   arrives (after ``Retry-After`` on a 503, as a client should): BCCD's 640x480 JPEGs, and one request in
   ``--big-every`` a 16 MB upload, a noise JPEG or a noise PNG just under ``ssd.limits.MAX_UPLOAD_BYTES`` (the PNG
   decodes at full size, the JPEG in draft mode). Printed: the answers by status (200, 503, 504, other), the p50 and
   p99 latency of the accepted ones (200), and the server's peak RSS (``VmHWM``).
2. ``--requests`` small requests (default 10,000) from 16 clients: the server's RSS (``VmRSS``) before and after
   each quarter of them, and its peak (``--requests 0``: not run).

Usage: ``.venv/bin/python benchmarks/serve_pressure.py [--clients 64] [--seconds 30] [--requests 10000]``
"""

from __future__ import annotations

import argparse
import asyncio
import io
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from serve import _images, _model, _percentile, _server
from ssd.export.onnx import export_onnx
from ssd.limits import MAX_UPLOAD_BYTES


def _noise(fmt: str, side: int) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 256, (side, side, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt, **({"quality": 100} if fmt == "JPEG" else {"compress_level": 1}))
    return buffer.getvalue()


def big_uploads() -> list[tuple[str, bytes]]:
    """A noise JPEG and a noise PNG, each the largest square under the upload limit (found by halving)."""
    uploads = []
    for fmt in ("JPEG", "PNG"):
        low, high = 1024, 4096
        while high - low > 16:
            side = (low + high) // 2
            low, high = (side, high) if len(_noise(fmt, side)) <= MAX_UPLOAD_BYTES else (low, side)
        uploads.append((f"{low}x{low} {fmt}", _noise(fmt, low)))
    return uploads


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in MiB."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {key: int(fields[key].split()[0]) // 1024 for key in ("VmRSS", "VmHWM")}


async def _drive(url: str, blobs: list[bytes], big: list[bytes], clients: int, seconds: float, requests: int,
                 big_every: int) -> tuple[dict[str, int], list[float]]:
    counts: dict[str, int] = {}
    latencies: list[float] = []
    sent = 0
    end = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=clients)) as client:

        async def sender() -> None:
            nonlocal sent
            while time.perf_counter() < end and sent < requests:
                sent += 1
                blob = big[sent // big_every % len(big)] if big and sent % big_every == 0 else blobs[sent % len(blobs)]
                start = time.perf_counter()
                try:
                    response = await client.post("/predict", content=blob,
                                                 headers={"Content-Type": "application/octet-stream"})
                except httpx.TransportError as e:
                    counts[type(e).__name__] = counts.get(type(e).__name__, 0) + 1
                    continue
                status = str(response.status_code)
                counts[status] = counts.get(status, 0) + 1
                if response.status_code == 200:
                    latencies.append(time.perf_counter() - start)
                elif response.status_code == 503:
                    await asyncio.sleep(float(response.headers.get("retry-after", 1)))

        await asyncio.gather(*[sender() for _ in range(clients)])
    return counts, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--big-every", type=int, default=16, help="one request in N is a 16 MB upload")
    parser.add_argument("--requests", type=int, default=10_000, help="small requests of the memory run (0: none)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        blobs = [path.read_bytes() for path in _images(tmp / "images")]
        big = big_uploads()
        weights = export_onnx(_model(), tmp / "ssd_tiny.onnx", dynamic_batch=True)
        print(f"big uploads: {', '.join(f'{name} ({len(data):,} bytes)' for name, data in big)}")
        with _server(weights, []) as (url, process):
            asyncio.run(_drive(url, blobs, [], 4, 60, 16, args.big_every))  # warm up
            counts, latencies = asyncio.run(_drive(url, blobs, [data for _, data in big], args.clients, args.seconds,
                                                   10**9, args.big_every))
            rss = _status(process.pid)
            print(f"\n{args.clients} clients, {args.seconds:g} s, one request in {args.big_every} a 16 MB upload: "
                  f"answers by status {dict(sorted(counts.items()))}; accepted p50 "
                  f"{1000 * _percentile(latencies, 50):.0f} ms, p99 {1000 * _percentile(latencies, 99):.0f} ms; "
                  f"server peak RSS {rss['VmHWM']} MiB (now {rss['VmRSS']} MiB)")
        if args.requests == 0:
            return
        with _server(weights, []) as (url, process):
            asyncio.run(_drive(url, blobs, [], 16, 600, 256, args.big_every))  # warm up: allocator and runtime arenas
            readings, start, counts = [_status(process.pid)["VmRSS"]], time.perf_counter(), {}
            for _ in range(4):  # RSS after each quarter: growth that goes on, or a plateau
                quarter, _ = asyncio.run(_drive(url, blobs, [], 16, 3600, args.requests // 4, args.big_every))
                counts = {k: counts.get(k, 0) + quarter.get(k, 0) for k in {*counts, *quarter}}
                readings.append(_status(process.pid)["VmRSS"])
            print(f"\n{args.requests:,} requests from 16 clients in {time.perf_counter() - start:.0f} s "
                  f"({dict(sorted(counts.items()))}): server RSS before and after each quarter "
                  f"{' / '.join(map(str, readings))} MiB, peak {_status(process.pid)['VmHWM']} MiB")


if __name__ == "__main__":
    main()

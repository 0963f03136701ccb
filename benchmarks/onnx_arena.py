"""What the bounded ONNX Runtime arena costs: the library's session (:class:`ssd.inference.backends.onnx.OnnxBackend`,
CPU tensors from the one arena of ``limits.MAX_ONNX_RUNTIME_BYTES``) against the same graph in a session with ONNX
Runtime's own per-session arena, run in turn call by call in one process (same load on both, each first in turn),
batch 1 and 8, an ``ssd_tiny`` export at 256 px (random weights: the network's cost does not depend on them).
Prints a Markdown table for ``benchmarks/README.md``. Run: ``.venv/bin/python benchmarks/onnx_arena.py [--runs 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ssd.export.onnx import export_onnx
from ssd.inference.backends.onnx import OnnxBackend
from ssd.models import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=200, help="timed calls per session at batch 1 (a fifth at 8)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        path = export_onnx(build_model("ssd_tiny", num_classes=3), Path(work) / "tiny.onnx", dynamic_batch=True,
                           check=False)
        bounded = OnnxBackend(path).session
        options = ort.SessionOptions()
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.add_session_config_entry("session.use_env_allocators", "0")
        sessions = {"bounded arena (ours)": bounded,
                    "per-session arena": ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])}
        print("| batch | " + " | ".join(f"{name} ms p50" for name in sessions) + " | ratio |")
        print("|---|---|---|---|")
        for batch, runs in ((1, args.runs), (8, max(1, args.runs // 5))):
            feed = {"images": np.random.default_rng(0).random((batch, 3, 256, 256), dtype=np.float32)}
            times: dict[str, list[float]] = {name: [] for name in sessions}
            for session in sessions.values():  # warm-up
                for _ in range(5):
                    session.run(None, feed)
            for run in range(runs):
                for name, session in list(sessions.items())[::1 if run % 2 else -1]:  # each goes first in turn
                    start = time.perf_counter()
                    session.run(None, feed)
                    times[name].append(time.perf_counter() - start)
            medians = [statistics.median(t) * 1000 for t in times.values()]
            print(f"| {batch} | " + " | ".join(f"{m:.2f}" for m in medians) + f" | {medians[0] / medians[1]:.3f} |")


if __name__ == "__main__":
    main()

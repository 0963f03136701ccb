"""The runtime without PyTorch against the PyTorch path: peak RSS and time to the first result of a fresh process
that predicts 10 images (``ssd.load(p).predict``, one image at a time) with an ``ssd_tiny`` ONNX export that has
the pipeline in its graph (``--nms``), and the peak RSS of ``ssd predict`` on the same 10 images.

The PyTorch path runs with this interpreter; the runtime path runs with ``--runtime-python`` (an environment where
``pip install ./runtime`` installed ssd-detect-runtime: no torch at all), or, without it, with this interpreter and
an import hook that makes importing torch fail. Each pair runs in turn ``--repeats`` times (same load on both) and
the medians are printed as a Markdown table for ``benchmarks/README.md``.
Run: ``.venv/bin/python benchmarks/runtime.py [--runtime-python /path/to/venv/bin/python]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from ssd.export.onnx import export_onnx
from ssd.models import build_model

NO_TORCH = """
import sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "torchvision"):
            raise ModuleNotFoundError(name, name=name)
sys.meta_path.insert(0, NoTorch())
"""

API = """
import glob, json, sys, time
import ssd
paths = sorted(glob.glob(sys.argv[1] + "/*.jpg"))
detector = ssd.load(sys.argv[2])
first = detector.predict(paths[0])
stamp = time.time()
rest = detector.predict(paths[1:])
print(json.dumps({"first": stamp, "torch": "torch" in sys.modules, "n": 1 + len(rest)}))
"""

CLI = """
import sys
from ssd.cli import main
sys.exit(main(["predict", "--weights", sys.argv[2], "--source", sys.argv[1], "--project", sys.argv[3], "--quiet",
               "--no-save-images"]))
"""


def run(python: str, hook: bool, env: dict, code: str, *args: str) -> tuple[float, float, dict | None]:
    """(seconds from the start to the child's first result, or to its end; its peak RSS in MiB, measured by
    ``/usr/bin/time``; what it printed last, as JSON, or None) of a fresh child process."""
    start = time.time()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", python, "-c", (NO_TORCH if hook else "") + code, *args],
                          capture_output=True, text=True, check=True, env=env)
    end = time.time()
    peak = int(done.stderr.strip().splitlines()[-1]) / 1024
    report = json.loads(done.stdout.strip().splitlines()[-1]) if code is API else None
    return (report["first"] if report else end) - start, peak, report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runtime-python", help="an interpreter of an environment without torch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    src = str(Path(__file__).resolve().parents[1] / "src")
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        model = build_model("ssd_tiny", num_classes=3)
        onnx = export_onnx(model, work / "tiny.onnx", nms=True, dynamic_batch=True, check=False)
        (work / "images").mkdir()
        rng = np.random.default_rng(0)
        for i in range(10):
            Image.fromarray(rng.integers(0, 256, (480, 640, 3), dtype=np.uint8)).save(work / "images" / f"{i}.jpg")
        paths = {"runtime": (args.runtime_python or sys.executable, args.runtime_python is None),
                 "torch": (sys.executable, False)}
        env = {**os.environ, "PYTHONPATH": src}
        rows: dict[str, dict[str, list[float]]] = {name: {"first": [], "api": [], "cli": []} for name in paths}
        for repeat in range(args.repeats):
            for name, (python, hook) in paths.items():
                seconds, peak, report = run(python, hook, env, API, str(work / "images"), str(onnx))
                if report["torch"] is not (name == "torch"):
                    raise RuntimeError(f"the {name} path imported torch: {report['torch']}")
                rows[name]["first"].append(seconds)
                rows[name]["api"].append(peak)
                out = str(work / f"runs-{name}-{repeat}")
                rows[name]["cli"].append(run(python, hook, env, CLI, str(work / "images"), str(onnx), out)[1])
        print("| path | time to first result (s) | peak RSS, ssd.load().predict (MiB) | peak RSS, ssd predict (MiB) |")
        print("|---|---|---|---|")
        for name, row in rows.items():
            print(f"| {name} | {statistics.median(row['first']):.2f} | {statistics.median(row['api']):.0f} | "
                  f"{statistics.median(row['cli']):.0f} |")


if __name__ == "__main__":
    main()

"""What deployment gives: ``ssd benchmark``'s table on a checkpoint trained here, plus the INT8 remedies.

Trains ``--model`` (default ``ssd_tiny`` at 256 px; ``ssdlite320_mobilenet_v3_large`` measures depthwise
convolutions) on a shared real dataset (default: BCCD, 205 training / 87 val images) for
``--epochs``, then runs :func:`ssd.export.benchmark.run_benchmark` on its ``best.pt`` (every format: size, COCO
mAP50 / mAP50-95 on val, p50 / p90 ms per image at batch 1, images/s at batch 8), then the standard INT8 remedies
for ONNX Runtime, each scored and timed the same way: the convolutions alone quantized, the first convolution and
the heads kept in float, fewer calibration images, the QOperator format, and (where the network has them) the
depthwise convolutions kept in float. Prints Markdown tables for ``benchmarks/README.md``. Run:
``.venv/bin/python benchmarks/deploy.py [--model NAME] [--epochs 30] [--data PATH] [--out DIR] [--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import onnx
import torch

from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.evaluation.evaluator import evaluate
from ssd.export.benchmark import format_benchmark, run_benchmark
from ssd.export.quantize import calibration_paths, quantize_onnx
from ssd.export.timing import time_backends
from ssd.inference.backends.onnx import OnnxBackend
from ssd.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))


def markdown(rows) -> str:
    head = ("| format | status | size MB | mAP50 | mAP50-95 | change vs eager | ms/img p50 | p90 | img/s | pre ms "
            "| network ms | post ms |")
    lines = [head, "|" + "---|" * 12]
    for r in rows:
        cells = [r.format, r.status, r.size_mb, r.map50, r.map,
                 None if r.change_vs_eager is None else f"{r.change_vs_eager:+.2f}", r.p50_ms, r.p90_ms,
                 r.images_per_s, r.pre_ms, r.network_ms, r.post_ms]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def remedies(fp32: Path, data: Path, out: Path, calib: int) -> list[str]:
    """ONNX Runtime INT8 variants of ``fp32``, and ``fp32`` itself timed in the same session (on a loaded machine
    only side-by-side timings compare): file size, mAP50 (points), p50 ms per image at batch 1."""
    convs = [n for n in onnx.load(str(fp32)).graph.node if n.op_type == "Conv"]
    heads = [n.name for n in convs if ".heads." in n.input[1]]  # named by their weights, model.heads.L.loc/cls
    depthwise = [n.name for n in convs if any(a.name == "group" and a.i > 1 for a in n.attribute)]
    variants = {"the network (what `--int8` writes)": dict(), "convolutions only": dict(op_types=["Conv"]),
                "first conv in float": dict(exclude=[convs[0].name]),
                "first conv + heads in float": dict(exclude=[convs[0].name, *heads]),
                f"{min(32, calib)} calibration images": dict(count=min(32, calib)),
                "QOperator format (QLinearConv)": dict(operator_format=True)}
    if depthwise:
        variants[f"{len(depthwise)} depthwise convs in float"] = dict(exclude=depthwise)
    decoded = [read_image(r.path) for r in load_dataset(data).records("val")[:16]]
    lines = ["| ONNX Runtime variant | size MB | mAP50 | ms/img p50 | network ms |", "|---|---|---|---|---|"]
    rows = [("FP32 (reference)", fp32)]
    for index, (name, options) in enumerate(variants.items()):
        path = out / f"remedy_{index}.int8.onnx"
        count = options.pop("count", calib)
        rows.append((name, quantize_onnx(fp32, path, calibration_paths(data, count), **options)))
    variants = {name: OnnxBackend(path) for name, path in rows}
    timings = time_backends(variants, decoded, 1, 60, 5)  # side by side, call by call
    for name, path in rows:
        score = evaluate(variants[name], data, metric="coco", device="cpu", skip_invalid=True)["AP50"] * 100
        timing = timings[name]
        lines.append(f"| {name} | {path.stat().st_size / 1e6:.3f} | {score:.2f} | {timing.p50_ms:.2f} "
                     f"| {timing.network_ms:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SHARED / "bccd" / "BCCD")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--model", default="ssd_tiny")
    parser.add_argument("--image-size", type=int, help="network input side (default: the model's)")
    parser.add_argument("--weights", type=Path, help="skip training: benchmark this checkpoint")
    parser.add_argument("--out", type=Path, help="where the run and the benchmark go (default: a temporary folder)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    parser.add_argument("--remedies-on", type=Path, help="only the INT8 remedies, on this FP32 ssd export .onnx")
    args = parser.parse_args()
    calib = min(300, len(load_dataset(args.data).records("train")))
    if args.remedies_on:
        print("\n".join(remedies(args.remedies_on, args.data, args.remedies_on.parent, calib)))
        return
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="ssd-deploy-"))
    weights = args.weights
    if weights is None:
        result = train(model=args.model, data=str(args.data), epochs=args.epochs, image_size=args.image_size,
                       augment="light", workers=1, skip_invalid=True, project=str(out), name="train", quiet=True,
                       metric="voc", device="cpu")
        weights = result.run_dir / "weights" / "best.pt"
    rows = run_benchmark(weights, args.data, out / "benchmark", runs=40, skip_invalid=True)
    print(format_benchmark(rows), "\n")
    print(markdown(rows), "\n")
    print("\n".join(remedies(out / "benchmark" / "model.onnx", args.data, out / "benchmark", calib)))
    print(f"\nfiles: {out}")


if __name__ == "__main__":
    main()

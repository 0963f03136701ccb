"""What deployment gives: ``ssd benchmark``'s table on a checkpoint trained here, plus the INT8 remedies.

Trains ``ssd_tiny`` (default 256 px) on a shared real dataset (default: BCCD, 205 training / 87 val images) for
``--epochs``, then runs :func:`ssd.export.benchmark.run_benchmark` on its ``best.pt`` (every format: size, COCO
mAP50 / mAP50-95 on val, p50 / p90 ms per image at batch 1, images/s at batch 8), then the standard INT8 remedies
for ONNX Runtime, each scored and timed the same way: the first convolution and the heads kept in float, and fewer
calibration images. Prints Markdown tables for ``benchmarks/README.md``. Run:
``.venv/bin/python benchmarks/deploy.py [--epochs 30] [--data PATH] [--out DIR] [--threads N]``.
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
from ssd.export.benchmark import format_benchmark, run_benchmark, time_backend
from ssd.export.quantize import calibration_inputs, calibration_paths, quantize_onnx
from ssd.inference.backends import OnnxBackend
from ssd.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))


def markdown(rows) -> str:
    head = "| format | status | size MB | mAP50 | mAP50-95 | change vs eager | ms/img p50 | p90 | img/s |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        cells = [r.format, r.status, r.size_mb, r.map50, r.map,
                 None if r.change_vs_eager is None else f"{r.change_vs_eager:+.2f}", r.p50_ms, r.p90_ms,
                 r.images_per_s]
        lines.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return "\n".join(lines)


def remedies(fp32: Path, data: Path, out: Path, calib: int) -> list[str]:
    """ONNX Runtime INT8 variants of ``fp32``: mAP50 (points), file size, p50 ms at batch 1."""
    graph = onnx.load(str(fp32)).graph
    convs = [n.name for n in graph.node if n.op_type == "Conv"]
    heads = [n for n in convs if "heads" in n]
    variants = {"all convolutions": ([], calib), "first conv in float": (convs[:1], calib),
                "first conv + heads in float": (convs[:1] + heads, calib),
                f"{min(32, calib)} calibration images": ([], min(32, calib))}
    backend = OnnxBackend(fp32)
    decoded = [read_image(r.path) for r in load_dataset(data).records("val")[:16]]
    lines = ["| INT8 variant | size MB | mAP50 | ms/img p50 |", "|---|---|---|---|"]
    for name, (exclude, count) in variants.items():
        path = out / f"remedy_{len(lines)}.int8.onnx"
        inputs = calibration_inputs(calibration_paths(data, count), backend.image_size, backend.mean, backend.std)
        quantize_onnx(fp32, path, inputs, exclude=exclude)
        quantized = OnnxBackend(path)
        score = evaluate(quantized, data, metric="coco", device="cpu", skip_invalid=True)["AP50"] * 100
        p50 = time_backend(quantized, decoded, 1, 30, 3)[0]
        lines.append(f"| {name} | {path.stat().st_size / 1e6:.3f} | {score:.2f} | {p50:.2f} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=SHARED / "bccd" / "BCCD")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--weights", type=Path, help="skip training: benchmark this checkpoint")
    parser.add_argument("--out", type=Path, help="where the run and the benchmark go (default: a temporary folder)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or Path(tempfile.mkdtemp(prefix="ssd-deploy-"))
    weights = args.weights
    if weights is None:
        result = train(model="ssd_tiny", data=str(args.data), epochs=args.epochs, image_size=args.image_size,
                       augment="light", workers=1, skip_invalid=True, project=str(out), name="train", quiet=True,
                       metric="voc", device="cpu")
        weights = result.run_dir / "weights" / "best.pt"
    rows = run_benchmark(weights, args.data, out / "benchmark", runs=40, skip_invalid=True)
    print(format_benchmark(rows), "\n")
    print(markdown(rows), "\n")
    calib = min(300, len(load_dataset(args.data).records("train")))
    print("\n".join(remedies(out / "benchmark" / "model.onnx", args.data, out / "benchmark", calib)))
    print(f"\nfiles: {out}")


if __name__ == "__main__":
    main()

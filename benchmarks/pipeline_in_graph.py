"""The pipeline inside the graph (issue 33): the ms per image of pre-processing, network and post-processing for
``ssd_tiny`` (256 px, random weights biased to detect) on 640x480 images at batch 1, ONNX Runtime and LiteRT on the CPU:

- ``today``: the raw graph; PyTorch resizes and normalizes, and decodes and runs NMS after the graph;
- ``nms``: decoding and NMS in the graph (``--nms``); Pillow + numpy resize and normalize (the runtime path);
- ``uint8 nms``: the uint8 NHWC input at the network size, normalization, decoding and NMS in the graph
  (``--uint8-input --nms``); Pillow resizes, nothing else;
- ``int8 nms``: ``nms`` quantized to INT8 (``--int8``, calibrated on 32 synthetic images);
- ``TFLite fp32`` and ``int8`` (XNNPACK): the uint8 NHWC input and normalization in the graph, decoding and NMS in
  numpy after it (:func:`ssd.arrays.postprocess_arrays`), as the runtime without PyTorch runs them.

Each variant is timed in turn, image by image, in one process (same load on each). Prints a Markdown table for
``benchmarks/README.md``. Run: ``.venv/bin/python benchmarks/pipeline_in_graph.py [--images 40]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ssd.arrays import postprocess_arrays, preprocess_arrays
from ssd.export.int8_runtime import cpu_flags
from ssd.inference.backends import open_backend
from ssd.preprocess import preprocess
from ssd.settings import PREDICT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from builders import biased_model, make_dataset  # the tests' seeded builders


def _today(backend, image, options) -> tuple[float, float, float]:
    tensor = torch.from_numpy(image)
    start = time.perf_counter()
    batch, sizes = preprocess([tensor], backend.card.image_size, backend.card.mean, backend.card.std)
    pre = time.perf_counter()
    loc, logits = backend(batch)
    network = time.perf_counter()
    from ssd.postprocess import postprocess_detections
    from ssd.preprocess import to_pixels

    to_pixels(postprocess_detections(loc, logits, backend.priors, variances=backend.card.variances, **options), sizes)
    end = time.perf_counter()
    return pre - start, network - pre, end - network


def _arrays(backend, image, options) -> tuple[float, float, float]:
    """The runtime without PyTorch (what :func:`ssd.arrays.detect_arrays` does), timed in its three parts: the graph's
    own NMS where it has one, else its head outputs post-processed in numpy."""
    card = backend.card
    start = time.perf_counter()
    batch, sizes = preprocess_arrays([image], card.image_size, card.mean, card.std, backend.uint8_input)
    pre = time.perf_counter()
    if card.nms is not None:
        detections = backend.nms_arrays(batch, **options)
        network = time.perf_counter()
    else:
        loc, scores, priors = backend.head_arrays(batch)
        network = time.perf_counter()
        detections = postprocess_arrays(loc, scores, priors, variances=card.variances, **options)
    for detection, (height, width) in zip(detections, sizes):
        detection["boxes"] = detection["boxes"] * np.array([width, height, width, height], dtype=np.float32)
    end = time.perf_counter()
    return pre - start, network - pre, end - network


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=40)
    args = parser.parse_args()
    from ssd.export import export
    from ssd.weights.checkpoint import save_checkpoint

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (3, 480, 640), dtype=np.uint8) for _ in range(args.images)]
    options = PREDICT.as_kwargs()
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        weights = save_checkpoint(work / "best.pt", biased_model("ssd_tiny", image_size=256))
        data = make_dataset("voc", work / "data", train=32, val=4, size=256, classes=3)
        nms = dict(nms=True, score_threshold=options["score_threshold"], iou_threshold=options["iou_threshold"],
                   max_detections=options["max_detections"], check=False)
        variants = {
            "today (raw graph, PyTorch pre/post)": (export(weights, "onnx", work / "raw.onnx", check=False), _today),
            "nms in graph, numpy pre": (export(weights, "onnx", work / "nms.onnx", **nms), _arrays),
            "uint8 + nms in graph": (export(weights, "onnx", work / "u8.onnx", uint8_input=True, **nms), _arrays),
            "int8 + nms in graph, numpy pre": (export(weights, "onnx", work / "i8.onnx", int8=True, data=data,
                                                      calib_images=32, **nms), _arrays),
            "TFLite fp32, uint8 in graph, numpy post": (export(weights, "tflite", work / "m.tflite", check=False),
                                                        _arrays),
            "TFLite int8, uint8 in graph, numpy post": (export(weights, "tflite", work / "m.int8.tflite", int8=True,
                                                               data=data, calib_images=32), _arrays),
        }
        backends = {name: (open_backend(path), run) for name, (path, run) in variants.items()}
        times: dict[str, list[tuple[float, float, float]]] = {name: [] for name in backends}
        for image in images[:3]:  # warm up every session
            for backend, run in backends.values():
                run(backend, image, options)
        for image in images:
            for name, (backend, run) in backends.items():
                times[name].append(run(backend, image, options))
        flags = cpu_flags()
        print("CPU flags:", " ".join(f for f in ("avx2", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags))
        print("| variant | pre ms | network ms | post ms | pre + post ms | total ms |")
        print("|---|---|---|---|---|---|")
        for name, rows in times.items():
            pre, net, post = (statistics.median(r[i] for r in rows) * 1000 for i in range(3))
            print(f"| {name} | {pre:.2f} | {net:.2f} | {post:.2f} | {pre + post:.2f} | {pre + net + post:.2f} |")


if __name__ == "__main__":
    main()

"""Inference speed of ``ssdlite320_mobilenet_v3_large`` on this CPU: images/s at batch 1 and batch 8.

Variants, on the same images (640x480 uint8, seeded) with the same thresholds (conf 0.25, NMS IoU 0.45, 100 per
image, 400 candidates per class), each the full pipeline from decoded images to pixel boxes (resize, normalize,
network, postprocess):

- ``ssd eager``: ``ssd.Detector`` (PyTorch eager, our model),
- ``ssd onnxruntime``: ``ssd.load(model.onnx)`` (ONNX Runtime graph, ``ssd.postprocess`` in PyTorch),
- ``ssd onnxruntime --nms``: the graph with NMS inside,
- ``torchvision eager``: ``torchvision.models.detection.ssdlite320_mobilenet_v3_large`` (its own transform and
  postprocess; given float images, converted before timing as its API requires).

Random weights on both sides (no downloads; 91 classes as COCO in torchvision). Calls alternate between variants
round by round (batch 1: 4 images per round, batch 8: one batch) so that load from other processes on this shared
machine hits all alike; medians are printed.

Usage: ``.venv/bin/python benchmarks/predict.py [--rounds N]``
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torchvision

from ssd.export.onnx import export_onnx
from ssd.inference.pipeline import Detector, load
from ssd.models import build_model

CONF, IOU, MAX_DET, CANDIDATES = 0.25, 0.45, 100, 400
NUM_CLASSES = 90  # torchvision's COCO head has 91 outputs including background


def _variants(tmp: Path) -> dict:
    torch.manual_seed(0)
    model = build_model("ssdlite320_mobilenet_v3_large", num_classes=NUM_CLASSES).eval()
    raw = export_onnx(model, tmp / "raw.onnx", dynamic_batch=True, opset=18)
    nms = export_onnx(model, tmp / "nms.onnx", dynamic_batch=True, opset=18, nms=True, score_threshold=CONF,
                      iou_threshold=IOU, max_detections=MAX_DET)
    reference = torchvision.models.detection.ssdlite320_mobilenet_v3_large(
        weights=None, weights_backbone=None, num_classes=NUM_CLASSES + 1, score_thresh=CONF, nms_thresh=IOU,
        detections_per_img=MAX_DET, topk_candidates=CANDIDATES).eval()
    ours = {"ssd eager": Detector(model), "ssd onnxruntime": load(raw), "ssd onnxruntime --nms": load(nms)}

    def run_ours(detector):
        return lambda images: detector.predict(images, score_threshold=CONF, iou_threshold=IOU,
                                               max_detections=MAX_DET, batch_size=len(images))

    def run_torchvision(images):
        with torch.no_grad():
            return reference([image.float() / 255 for image in images])

    variants = {name: run_ours(detector) for name, detector in ours.items()}
    variants["torchvision eager"] = run_torchvision
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per variant and batch size")
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 480, 640), dtype=torch.uint8, generator=generator) for _ in range(8)]
    with tempfile.TemporaryDirectory() as tmp:
        variants = _variants(Path(tmp))
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; images 640x480; "
              f"conf {CONF}, iou {IOU}, max_det {MAX_DET}")
        for batch in (1, 8):
            chunks = [images[i:i + batch] for i in range(0, 4 if batch == 1 else len(images), batch)]
            times: dict[str, list[float]] = {name: [] for name in variants}
            for round_index in range(args.rounds + 1):  # round 0 warms up
                for name, run in variants.items():
                    for chunk in chunks:
                        start = time.perf_counter()
                        run(chunk)
                        if round_index:
                            times[name].append(time.perf_counter() - start)
            reference = batch / statistics.median(times["torchvision eager"])
            print(f"\nbatch {batch}: {'variant':<24}{'images/s':>10}{'vs torchvision':>16}")
            for name, values in times.items():
                speed = batch / statistics.median(values)
                print(f"         {name:<24}{speed:>10.1f}{speed / reference:>15.2f}x")


if __name__ == "__main__":
    main()

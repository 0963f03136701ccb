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

``--folder``: ``ssd predict`` over a folder of BCCD-sized JPEGs (BCCD's 640x480 images from ``$SSD_SHARED_DATA``
linked in turn, else generated ones), an ``ssd_tiny`` of seeded random weights (conf 0.05, at most 20 detections per
image: about as many as BCCD has cells), no drawn copies: images/s with files decoded ahead by 2 threads
(``--workers 2``, the default) against one at a time in the main thread (``--workers 0``, the decoding before
streamed outputs), runs alternating; then the peak RSS of the whole ``ssd predict`` process (its ``ssd_tiny`` at
128 px, as memory does not depend on the network's input) on 1,000 and on 10,000 images (``os.wait4``).

``--parts outputs``: the same folder with every per-image output (drawn copies, ``--save-txt``, ``--save-crop``)
written without an fsync each (as shipped) against with one (each output's ``sync=True`` forced), runs
alternating, in ``--out`` (default: a temporary folder; give one on the disk you care about, /tmp may be memory).

Usage: ``.venv/bin/python benchmarks/predict.py [--rounds N]`` or
``... predict.py --folder [--images 2000] [--rounds N] [--parts speed|rss|both|outputs] [--out DIR]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch
import torchvision

from ssd.inference.detector import Detector, load
from ssd.inference.sources import predict_source
from ssd.models import build_model
from ssd.schemas import PredictConfig
from ssd.weights.checkpoint import save_checkpoint

CONF, IOU, MAX_DET, CANDIDATES = 0.25, 0.45, 100, 400
NUM_CLASSES = 90  # torchvision's COCO head has 91 outputs including background


def _variants(tmp: Path) -> dict:
    from ssd.export.onnx import export_onnx  # the [export] extra, which --folder does not need

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


def _sources(folder: Path) -> list[Path]:
    """BCCD's JPEGs, else 64 generated 640x480 ones in ``folder``."""
    shared = Path(os.environ.get("SSD_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
    sources = sorted((shared / "bccd").rglob("*.jpg"))
    if not sources:
        from PIL import Image

        generator = torch.Generator().manual_seed(0)
        (folder / "generated").mkdir()
        for i in range(64):
            smooth = torch.nn.functional.interpolate(torch.rand(1, 3, 30, 40, generator=generator), size=(480, 640),
                                                     mode="bilinear")
            image = (smooth[0] * 255).byte().permute(1, 2, 0).numpy()
            sources.append(folder / "generated" / f"{i}.jpg")
            Image.fromarray(image).save(sources[-1], quality=90)
    return sources


def _jpegs(folder: Path, sources: list[Path], count: int) -> Path:
    """A folder of ``count`` links to ``sources`` in turn."""
    images = folder / f"images{count}"
    images.mkdir()
    for i in range(count):
        (images / f"{i:05d}.jpg").symlink_to(sources[i % len(sources)].resolve())
    return images


def _peak_rss_mib(weights: Path, images: Path, save_dir: Path) -> float:
    """Peak RSS of one ``ssd predict`` process over ``images``, in MiB."""
    process = subprocess.Popen([sys.executable, "-m", "ssd", "predict", "--weights", str(weights), "--source",
                                str(images), "--save-dir", str(save_dir), "--conf", "0.05", "--max-det", "20",
                                "--no-save-images"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"ssd predict failed on {images}"
    return usage.ru_maxrss / 1024


def folder_benchmark(count: int, rounds: int, parts: str, out: str | None) -> None:
    torch.manual_seed(0)
    names = ["Platelets", "RBC", "WBC"]
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        tmp = Path(tmp)
        sources = _sources(tmp)
        print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; JPEGs of {sources[0].parent}, ssd_tiny, "
              "batch 8, conf 0.05, max-det 20, " + ("every per-image output" if parts == "outputs"
                                                    else "no drawn copies"))
        if parts in ("speed", "both"):
            _folder_speed(Detector(build_model("ssd_tiny", class_names=names).eval()), _jpegs(tmp, sources, count),
                          count, rounds, tmp)
        if parts == "outputs":
            _outputs_speed(Detector(build_model("ssd_tiny", class_names=names).eval()), _jpegs(tmp, sources, count),
                           count, rounds, tmp)
        if parts in ("rss", "both"):  # a 128 px input: the memory of a run does not depend on the network's
            weights = save_checkpoint(tmp / "best.pt", build_model("ssd_tiny", class_names=names, image_size=128))
            for n in (1000, 10000):
                print(f"peak RSS of ssd predict (128 px input) on {n:,} images: "
                      f"{_peak_rss_mib(weights, _jpegs(tmp, sources, n), tmp / 'rss'):.0f} MiB")


def _folder_speed(detector: Detector, images: Path, count: int, rounds: int, tmp: Path) -> None:
    speeds: dict[int, list[float]] = {0: [], 2: []}
    for _ in range(rounds):
        for workers in speeds:
            start = time.perf_counter()
            summary = predict_source(PredictConfig(source=images, save_dir=tmp / "out", score_threshold=0.05,
                                                   max_detections=20, save_images=False, workers=workers),
                                     detector, progress=False)
            speeds[workers].append(count / (time.perf_counter() - start))
    print(f"{summary.detections / count:.1f} detections per image")
    serial = statistics.median(speeds[0])
    for workers, values in speeds.items():
        speed = statistics.median(values)
        print(f"--workers {workers}: {speed:7.1f} images/s ({speed / serial:.2f}x)  runs: "
              + ", ".join(f"{v:.1f}" for v in values))


def _outputs_speed(detector: Detector, images: Path, count: int, rounds: int, tmp: Path) -> None:
    """images/s with every per-image output, without and with an fsync per output file."""
    import ssd.inference.crop_files as crop_files
    import ssd.inference.yolo_labels as yolo_labels
    import ssd.plots as plots

    def synced(function):
        return lambda *args, **kwargs: function(*args, **{**kwargs, "sync": True})

    forced = [(plots, "save_image"), (crop_files, "save_image"), (yolo_labels, "save_image"),
              (yolo_labels, "write_text")]
    speeds: dict[str, list[float]] = {"no fsync per output": [], "fsync per output": []}
    for index in range(rounds):
        for variant, values in speeds.items():
            with ExitStack() as stack:
                for module, name in forced if variant == "fsync per output" else []:
                    stack.enter_context(mock.patch.object(module, name, synced(getattr(module, name))))
                start = time.perf_counter()
                summary = predict_source(PredictConfig(source=images, save_dir=tmp / f"out{index}{variant[0]}",
                                                       score_threshold=0.05, max_detections=20, save_txt=True,
                                                       save_crop=True), detector, progress=False)
                values.append(count / (time.perf_counter() - start))
    files = sum(1 for p in summary.save_dir.rglob("*") if p.is_file())
    print(f"{summary.detections / count:.1f} detections per image; {files:,} files per run (drawn copies, labels, "
          "crops)")
    for variant, values in speeds.items():
        print(f"{variant:<22}{statistics.median(values):7.1f} images/s  runs: " + ", ".join(f"{v:.1f}" for v in values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per variant and batch size")
    parser.add_argument("--folder", action="store_true", help="ssd predict over a folder of JPEGs instead")
    parser.add_argument("--images", type=int, default=2000, help="--folder: the number of JPEGs timed")
    parser.add_argument("--parts", choices=["speed", "rss", "both", "outputs"], default="both",
                        help="--folder: what to measure")
    parser.add_argument("--out", default=None, help="--folder: where the runs write (default: a temporary folder)")
    args = parser.parse_args()
    if args.folder:
        return folder_benchmark(args.images, args.rounds, args.parts, args.out)
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

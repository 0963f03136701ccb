"""Tracking accuracy of ``--track`` (ByteTrack on the detector's boxes) on a synthetic video with known ids.

The video: the demo's shapes (:mod:`ssd.data.synthetic`: its classes, colours and textured background) at 256 px,
``--objects`` shapes of distinct classes, each moving in a straight line at its own speed and bouncing off the
borders, so that paths cross and shapes pass over each other; written as an MJPG ``.avi`` and read back as ``ssd
predict`` reads videos. The ground truth is each shape's visible box and its id. The model: ``--weights`` (e.g. the
``ssd demo`` run's ``best.pt``), else a short demo training (6 epochs of 1500 images, cached in
``~/.cache/ssd/benchmarks``). :meth:`ssd.inference.pipeline.Detector.track` runs the same detection and tracking as
``ssd predict --track``, with the settings of a ``--tracker`` YAML file, each row its own file.

Scored with ``motmetrics`` (CLEAR MOT and identity metrics; a benchmark dependency, not the library's:
``pip install motmetrics``): a track matches a ground truth at IoU >= 0.5; detections ByteTrack has not confirmed
yet (``track_id`` -1) are not hypotheses. Targets: IDF1 >= 0.9 and MOTA >= 0.85.

Usage: ``.venv/bin/python benchmarks/tracking.py [--weights best.pt] [--frames 300] [--objects 5]``
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import ImageDraw
from torchvision.ops import box_iou

from ssd.data.synthetic import _COLOURS, SHAPE_NAMES, _background, _draw
from ssd.inference.pipeline import load

SIZE = 256
CONF = 0.3
TRACKERS = {  # row -> the --tracker YAML
    "trackers defaults": "tracker_type: bytetrack\n",
    "activation 0.5": "tracker_type: bytetrack\ntrack_activation_threshold: 0.5\nhigh_conf_det_threshold: 0.5\n",
    "per_class": "tracker_type: bytetrack\nper_class: true\n",
    "per_class, act. 0.5": "tracker_type: bytetrack\nper_class: true\ntrack_activation_threshold: 0.5\n"
                           "high_conf_det_threshold: 0.5\n",
}


def make_video(path: Path, frames: int, objects: int, seed: int = 0) -> list[dict[int, list[float]]]:
    """Write the video; returns each frame's ground truth: id -> visible box ``[x1, y1, x2, y2]`` in pixels."""
    rng = np.random.default_rng(seed)
    background = _background(rng, SIZE)
    shapes = []
    for i in range(objects):
        w, h = (int(v) for v in rng.integers(36, 64, size=2))
        angle = rng.uniform(0, 2 * math.pi)
        speed = rng.uniform(1.0, 3.0)
        shapes.append({"label": i % len(_COLOURS), "size": (w, h),
                       "pos": [rng.uniform(0, SIZE - w), rng.uniform(0, SIZE - h)],
                       "vel": [speed * math.cos(angle), speed * math.sin(angle)]})
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 30, (SIZE, SIZE))
    truth = []
    for _ in range(frames):
        image = background.copy()
        pen = ImageDraw.Draw(image)
        boxes = {}
        for track_id, shape in enumerate(shapes):
            (x, y), (w, h) = shape["pos"], shape["size"]
            box = (round(x), round(y), round(x) + w, round(y) + h)
            _draw(pen, SHAPE_NAMES[shape["label"]], box, _COLOURS[shape["label"]])
            boxes[track_id] = [float(v) for v in box]
            for axis, limit in ((0, SIZE - w), (1, SIZE - h)):  # move, bouncing off the borders
                shape["pos"][axis] += shape["vel"][axis]
                if not 0 <= shape["pos"][axis] <= limit:
                    shape["vel"][axis] *= -1
                    shape["pos"][axis] = min(max(shape["pos"][axis], 0), limit)
        writer.write(cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR))
        truth.append(boxes)
    writer.release()
    return truth


def score(truth: list[dict[int, list[float]]], results) -> dict[str, float]:
    import motmetrics as mm

    accumulator = mm.MOTAccumulator(auto_id=True)
    for boxes, result in zip(truth, results, strict=True):
        tracked = result.track_ids >= 0
        ids = list(boxes)
        # 1 - IoU, no match below IoU 0.5: motmetrics' iou_matrix rule (not called: it uses np.asfarray, which
        # NumPy 2 removed)
        distances = 1 - box_iou(torch.tensor([boxes[i] for i in ids]).reshape(-1, 4), result.boxes[tracked]).numpy()
        distances[distances > 0.5] = np.nan
        accumulator.update(ids, result.track_ids[tracked].tolist(), distances)
    metrics = ["idf1", "mota", "num_switches", "num_false_positives", "num_misses", "num_unique_objects",
               "num_detections"]
    summary = mm.metrics.create().compute(accumulator, metrics=metrics)
    return {name: float(summary[name].iloc[0]) for name in metrics}


def demo_weights() -> Path:
    """The cached short demo training (trained once, a few minutes)."""
    from ssd.training.demo import run_demo

    cache = Path.home() / ".cache" / "ssd" / "benchmarks" / "tracking_demo"
    best = cache / "demo" / "weights" / "best.pt"
    if not best.is_file():
        run_demo(cache, device="cpu", quiet=True, epochs=6, data={"num_train": 1500}, exist_ok=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path, help="a detector of the demo's shapes (default: a short demo run)")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--objects", type=int, default=5)
    args = parser.parse_args()
    weights = args.weights or demo_weights()
    detector = load(weights)
    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "shapes.avi"
        truth = make_video(video, args.frames, args.objects)
        print(f"{args.frames} frames of {SIZE} px, {args.objects} shapes, conf {CONF}, model {weights}")
        print(f"{'tracker settings':<20} {'IDF1':>6} {'MOTA':>6} {'id sw.':>7} {'FP':>5} {'misses':>7} "
              f"{'tracks':>7}")
        for name, text in TRACKERS.items():
            settings = Path(tmp) / "tracker.yaml"
            settings.write_text(text)
            results = detector.track(video, tracker=settings, score_threshold=CONF, batch_size=8)
            m = score(truth, results)
            tracks = len({t for r in results for t in r.track_ids.tolist() if t >= 0})
            print(f"{name:<20} {m['idf1']:6.3f} {m['mota']:6.3f} {m['num_switches']:7.0f} "
                  f"{m['num_false_positives']:5.0f} {m['num_misses']:7.0f} {tracks:7d}")


if __name__ == "__main__":
    main()

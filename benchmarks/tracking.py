"""Tracking accuracy of ``--track`` (ByteTrack on the detector's boxes) on a synthetic video with known ids.

The video: the demo's shapes (:mod:`ssd.data.synthetic`: its classes, colours and textured background) at 256 px,
``--objects`` shapes of distinct classes, each moving in a straight line at its own speed and bouncing off the
borders, so that paths cross and shapes pass over each other; written as an MJPG ``.avi`` and read back as ``ssd
predict`` reads videos. The ground truth is each shape's visible box and its id. The model: ``--weights`` (e.g. the
``ssd demo`` run's ``best.pt``), else the demo recipe's model (trained once, cached in ``benchmarks/results``).
:meth:`ssd.inference.detector.Detector.track` runs the same detection and tracking as ``ssd predict --track``, with
the settings of a ``--tracker`` YAML file, each row its own file. The last rows track a perfect detector's boxes
(the true boxes of the objects at least 50% / 30% visible) with the default settings: what the tracker alone loses.

Scored with ``motmetrics`` (CLEAR MOT and identity metrics; a benchmark dependency, not the library's:
``pip install motmetrics``): a track matches a ground truth at IoU >= 0.5; detections ByteTrack has not confirmed
yet (``track_id`` -1) are not hypotheses. Twice: every object, and only the objects at least half visible (a shape
mostly under another cannot be seen: it counts as neither a miss nor, when a box finds it, a false positive).
Targets: IDF1 >= 0.9 and MOTA >= 0.85.

Then the same video as MOT ground truth (its frames as read back, PNG, and a ``gt.txt`` whose objects less than half
visible have flag 0, not scored), and every row scored as ``ssd val --track`` scores (TrackEval: HOTA, DetA, AssA,
IDF1, MOTA); the default row is also run through the command itself on that folder.

Usage: ``.venv/bin/python benchmarks/tracking.py [--weights best.pt] [--frames 300] [--objects 5]``
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch
from PIL import Image, ImageDraw
from torchvision.ops import box_iou

from ssd.data.mot import read_mot
from ssd.data.synthetic import _COLOURS, SHAPE_NAMES, _background, _draw
from ssd.evaluation.tracking import score_tracks
from ssd.inference.detector import load
from ssd.inference.results import Result
from ssd.inference.tracking import Tracker

SIZE = 256
CONF = 0.3
VISIBLE = 0.5
TRACKERS = {  # row -> the --tracker YAML (low_conf_det_threshold = CONF: the detector stops at CONF, as it did)
    "class-agnostic, detector at conf (the old default)": f"per_class: false\nlow_conf_det_threshold: {CONF}\n",
    "per_class, detector at conf": f"low_conf_det_threshold: {CONF}\n",
    "class-agnostic, detector down to 0.1": "per_class: false\n",
    "defaults: per_class, detector down to 0.1": "tracker_type: bytetrack\n",
}
ORACLE = (VISIBLE, 0.3)
"""Rows with a perfect detector: the true boxes of the objects at least this visible (score 0.9, the defaults)."""


def make_video(path: Path, frames: int, objects: int, seed: int = 0) -> list[dict[int, tuple[list[float], float]]]:
    """Write the video; returns each frame's ground truth: id -> (box ``[x1, y1, x2, y2]`` in pixels, the share of
    the shape's pixels not hidden by shapes drawn over it)."""
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
        image, owner = background.copy(), Image.new("L", (SIZE, SIZE))  # owner: which shape each pixel shows
        pen, owner_pen = ImageDraw.Draw(image), ImageDraw.Draw(owner)
        boxes, areas = {}, {}
        for track_id, shape in enumerate(shapes):
            (x, y), (w, h) = shape["pos"], shape["size"]
            box = (round(x), round(y), round(x) + w, round(y) + h)
            _draw(pen, SHAPE_NAMES[shape["label"]], box, _COLOURS[shape["label"]])
            own = Image.new("L", (SIZE, SIZE))
            _draw(ImageDraw.Draw(own), SHAPE_NAMES[shape["label"]], box, 1)
            _draw(owner_pen, SHAPE_NAMES[shape["label"]], box, track_id + 1)
            boxes[track_id], areas[track_id] = [float(v) for v in box], int(np.asarray(own).sum())
            for axis, limit in ((0, SIZE - w), (1, SIZE - h)):  # move, bouncing off the borders
                shape["pos"][axis] += shape["vel"][axis]
                if not 0 <= shape["pos"][axis] <= limit:
                    shape["vel"][axis] *= -1
                    shape["pos"][axis] = min(max(shape["pos"][axis], 0), limit)
        writer.write(cv2.cvtColor(np.asarray(image), cv2.COLOR_RGB2BGR))
        shown = np.bincount(np.asarray(owner).ravel(), minlength=objects + 1)
        truth.append({i: (box, shown[i + 1] / areas[i]) for i, box in boxes.items()})
    writer.release()
    return truth


def score(truth: list[dict[int, tuple[list[float], float]]], results, visible: float = 0.0) -> dict[str, float]:
    """motmetrics' summary. Objects less than ``visible`` in view are not counted, and neither is a tracked box
    whose best match (IoU >= 0.5) is one of them: a hidden shape is neither a miss nor a false positive."""
    import motmetrics as mm

    accumulator = mm.MOTAccumulator(auto_id=True)
    for objects, result in zip(truth, results, strict=True):
        tracked = result.track_ids >= 0
        ids = list(objects)
        iou = box_iou(torch.tensor([objects[i][0] for i in ids]).reshape(-1, 4), result.boxes[tracked]).numpy()
        counted = np.array([objects[i][1] >= visible for i in ids], dtype=bool)
        best = iou.argmax(0) if len(ids) else np.zeros(iou.shape[1], dtype=int)
        kept = ~((iou.max(0, initial=0) >= 0.5) & ~counted[best]) if len(ids) else np.ones(iou.shape[1], bool)
        # 1 - IoU, no match below IoU 0.5: motmetrics' iou_matrix rule (not called: it uses np.asfarray, which
        # NumPy 2 removed)
        distances = 1 - iou[counted][:, kept]
        distances[distances > 0.5] = np.nan
        accumulator.update([i for i, c in zip(ids, counted) if c], result.track_ids[tracked][kept].tolist(),
                           distances)
    metrics = ["idf1", "mota", "num_switches", "num_false_positives", "num_misses", "num_unique_objects",
               "num_detections"]
    summary = mm.metrics.create().compute(accumulator, metrics=metrics)
    return {name: float(summary[name].iloc[0]) for name in metrics}


def write_mot(video: Path, truth: list[dict[int, tuple[list[float], float]]], folder: Path) -> Path:
    """The video as a MOTChallenge sequence folder: ``img1/`` its frames as OpenCV reads them (PNG, lossless),
    ``gt/gt.txt`` its boxes with ids from 1, flag 0 for the objects less than :data:`VISIBLE` in view."""
    (folder / "img1").mkdir(parents=True)
    capture = cv2.VideoCapture(str(video))
    for index in range(len(truth)):
        ok, frame = capture.read()
        assert ok, f"{video}: frame {index} does not read"
        cv2.imwrite(str(folder / "img1" / f"{index + 1:06d}.png"), frame)
    capture.release()
    lines = [f"{frame},{i + 1},{x1:g},{y1:g},{x2 - x1:g},{y2 - y1:g},{int(shown >= VISIBLE)},1,{shown:.3f}\n"
             for frame, objects in enumerate(truth, 1) for i, ((x1, y1, x2, y2), shown) in objects.items()]
    (folder / "gt").mkdir()
    (folder / "gt" / "gt.txt").write_text("".join(lines))
    return folder


def true_results(truth: list[dict[int, tuple[list[float], float]]], visible: float) -> list[Result]:
    """Each frame's true boxes of the objects at least ``visible`` in view, scored 0.9, labelled with their class."""
    results = []
    for objects in truth:
        ids = [i for i, (_, shown) in objects.items() if shown >= visible]
        labels = [i % len(_COLOURS) for i in ids]
        results.append(Result(torch.tensor([objects[i][0] for i in ids]).reshape(-1, 4), torch.full((len(ids),), 0.9),
                              torch.tensor(labels, dtype=torch.int64), [SHAPE_NAMES[k] for k in labels], SIZE, SIZE))
    return results


def demo_weights() -> Path:
    """The ``ssd demo`` recipe's model, trained once (a few minutes) and cached in ``benchmarks/results``."""
    from ssd.training.demo import run_demo

    cache = Path(__file__).parent / "results" / "tracking_demo"
    best = cache / "exp" / "weights" / "best.pt"
    if not best.is_file():
        run_demo(cache, device="cpu", quiet=True, name="exp", exist_ok=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", type=Path,
                        help="a detector of the demo's shapes (default: the demo recipe's model)")
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--objects", type=int, default=5)
    args = parser.parse_args()
    weights = args.weights or demo_weights()
    detector = load(weights)
    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "shapes.avi"
        truth = make_video(video, args.frames, args.objects)
        shown = [v for objects in truth for _, v in objects.values() if v >= VISIBLE]
        print(f"{args.frames} frames of {SIZE} px, {args.objects} shapes ({args.frames * args.objects} boxes, "
              f"{len(shown)} at least {VISIBLE:.0%} visible, {sum(v < 0.65 for v in shown)} of them less than 65%: "
              f"more hidden than the demo's training images allow), conf {CONF}, model {weights}\n")
        print(f"| --tracker | tracks | all objects: IDF1 / MOTA / id switches / FP / misses | objects >= {VISIBLE:.0%} "
              f"visible: IDF1 / MOTA / id switches / FP / misses |")
        print("|---|---|---|---|")
        rows = {}
        for name, text in TRACKERS.items():
            settings = Path(tmp) / "tracker.yaml"
            settings.write_text(text)
            rows[name] = detector.track(video, tracker=settings, score_threshold=CONF, batch_size=8)
        for visible in ORACLE:
            tracker = Tracker(CONF)
            rows[f"perfect detector: true boxes of objects >= {visible:.0%} visible, defaults"] = [
                tracker.update(result, index) for index, result in enumerate(true_results(truth, visible))]
        for name, results in rows.items():
            tracks = len({t for r in results for t in r.track_ids.tolist() if t >= 0})
            cells = [" / ".join([f"{m['idf1']:.3f}", f"{m['mota']:.3f}"] + [f"{m[k]:.0f}" for k in (
                "num_switches", "num_false_positives", "num_misses")]) for m in (score(truth, results),
                                                                                 score(truth, results, VISIBLE))]
            print(f"| {name} | {tracks} | {cells[0]} | {cells[1]} |")
        (sequence,) = read_mot(write_mot(video, truth, Path(tmp) / "shapes"))
        print(f"\nScored as ssd val --track scores (TrackEval; objects < {VISIBLE:.0%} visible not scored)\n")
        print("| --tracker | HOTA | DetA | AssA | IDF1 | MOTA | id switches | FP | misses |")
        print("|---|---|---|---|---|---|---|---|---|")
        for name, results in rows.items():
            m = score_tracks({"shapes": (sequence.truth, results)})["overall"]
            print(f"| {name} | " + " | ".join(f"{m[k]:.3f}" for k in ("HOTA", "DetA", "AssA", "IDF1", "MOTA"))
                  + f" | {m['IDSW']} | {m['CLR_FP']} | {m['CLR_FN']} |")
        (Path(tmp) / "tracker.yaml").write_text(TRACKERS["defaults: per_class, detector down to 0.1"])
        command = [sys.executable, "-m", "ssd", "val", "--weights", str(weights), "--data", str(Path(tmp) / "shapes"),
                   "--track", "--tracker", str(Path(tmp) / "tracker.yaml"), "--conf", str(CONF), "--batch-size", "8",
                   "--device", "cpu", "--no-save"]
        print(f"\n{' '.join(command[2:])}:\n")
        print(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()

"""COCO statistics speed: ``faster-coco-eval`` against ``pycocotools`` on a few thousand images (issue 17).

The ground truths are Aquarium's train + val images (575), repeated ``--repeat`` times (default 6: 3450 images,
about 25 000 objects); the detections are synthetic (each object found once with a jittered box, some relabelled,
one false positive per image; the same helper as the tests). Both backends run :func:`ssd.evaluation.coco.evaluate_coco`
(the twelve statistics, per class and per size bucket) alternately, ``--runs`` times each; prints the median wall
time of each, the ratio, and the largest difference between their statistics.

Run: ``.venv/bin/python benchmarks/coco.py [--repeat 6] [--runs 3]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from builders import jittered_detections  # noqa: E402
from ssd.data import load_dataset  # noqa: E402
from ssd.evaluation.coco import COCO_STATS, evaluate_coco  # noqa: E402
from ssd.evaluation.results import ground_truths_from_records  # noqa: E402

DATA = Path(os.environ.get("SSD_SHARED_DATA", ROOT.parent / "shared" / "data")) / "aquarium"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=6)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    spec = load_dataset(DATA)
    truths = ground_truths_from_records([r for split in spec.splits.values() for r in split]) * args.repeat
    detections = jittered_detections(truths, len(spec.class_names), seed=0)
    print(f"{len(truths)} images, {sum(len(t['labels']) for t in truths)} objects, "
          f"{sum(len(d['labels']) for d in detections)} detections")
    times: dict[str, list[float]] = {"faster-coco-eval": [], "pycocotools": []}
    results = {}
    for _ in range(args.runs):
        for backend, spent in times.items():
            start = time.perf_counter()
            results[backend] = evaluate_coco(detections, truths, len(spec.class_names), spec.class_names,
                                             backend=backend)
            spent.append(time.perf_counter() - start)
    fast, reference = (statistics.median(times[b]) for b in times)
    gap = max(abs(results["faster-coco-eval"][k] - results["pycocotools"][k]) for k in COCO_STATS)
    print(f"faster-coco-eval {fast:.2f} s, pycocotools {reference:.2f} s: {reference / fast:.2f}x; "
          f"largest statistic difference {gap:.1e}")


if __name__ == "__main__":
    main()

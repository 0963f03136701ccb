"""Post-processing in numpy (:func:`ssd.arrays.postprocess_arrays`, the runtime without PyTorch) against PyTorch's
(:func:`ssd.postprocess.postprocess_detections`): ms per image on the head outputs of ``ssd_tiny`` (128 px, 3
classes, random weights biased to detect: every prior scores above 0.25), at the prediction and the evaluation
thresholds, batch 1 and 8, one thread each. The two are timed in turn, ``--repeats`` times (same load on each); the
median and the least of the repeats' medians are printed as a Markdown table for ``benchmarks/README.md``.
Run: ``.venv/bin/python benchmarks/postprocess_numpy.py [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from pathlib import Path

import torch

from ssd.arrays import object_scores, postprocess_arrays
from ssd.postprocess import postprocess_detections
from ssd.settings import EVALUATE, PREDICT

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from builders import biased_model  # the tests' seeded builders


def _ms(run, batch: int, calls: int = 20) -> float:
    """Median ms per image of ``calls`` calls of ``run`` (after one warm-up call)."""
    run()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000 / batch


def _numpy(loc, logits, priors, **options) -> list[dict]:
    """The runtime's path from the raw graph's outputs: softmax, then post-processing."""
    return postprocess_arrays(loc, object_scores(logits), priors, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = biased_model("ssd_tiny", class_names=["circle", "square", "triangle"], image_size=128).eval()
    print("| batch | thresholds | PyTorch ms/image (least) | numpy ms/image (least) |\n|---|---|---|---|")
    for batch in (1, 8):
        images = torch.rand(batch, 3, 128, 128, generator=torch.Generator().manual_seed(0)) * 2 - 1
        with torch.no_grad():
            loc, logits = model(images)
        arrays = loc.numpy(), logits.numpy(), model.priors.numpy()
        for name, thresholds in (("predict", PREDICT), ("evaluate", EVALUATE)):
            options = dict(score_threshold=thresholds.score_threshold, iou_threshold=thresholds.iou_threshold,
                           max_detections=thresholds.max_detections)
            runs = {"torch": functools.partial(postprocess_detections, loc, logits, model.priors, **options),
                    "numpy": functools.partial(_numpy, *arrays, variances=model.config.variances, **options)}
            times = {key: [] for key in runs}
            for _ in range(args.repeats):
                for key, run in runs.items():
                    times[key].append(_ms(run, batch))
            cells = [f"{statistics.median(times[key]):.2f} ({min(times[key]):.2f})" for key in runs]
            print(f"| {batch} | {name} ({thresholds.score_threshold}, {thresholds.max_detections} per image) | "
                  f"{cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()

"""Test-time augmentation (``--tta``) against plain prediction: VOC mAP@0.5 on a split, milliseconds per image.

Each checkpoint (``--runs NAME=WEIGHTS=DATA ...``; ``DATA`` any layout ``ssd val`` reads) is opened once and its
val split read once into one loader; plain and TTA passes of :func:`ssd.evaluation.evaluator.evaluate_split` (the
code behind ``ssd val``) alternate ``--repeats`` times, each pass timed whole (the loader's decoding and resize
included, as ``ssd val`` spends it), the mAP50 of the first pass of each kind reported (the passes are
deterministic) with the median time per image.

Usage: ``.venv/bin/python benchmarks/tta.py --runs demo=runs/demo/exp/weights/best.pt=runs/demo/data``
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from ssd.data.gate import load_training_data
from ssd.evaluation.evaluator import evaluate_split, split_loader
from ssd.inference.backends import open_backend


def measure(weights: str, data: str, repeats: int, split: str) -> dict[str, tuple[float, float]]:
    backend = open_backend(weights, "cpu")
    names = list(backend.card.class_names)
    spec = load_training_data(data, skip_invalid=True, class_names=names, splits=(split,))
    records = spec.records(split)
    loader = split_loader(records, names, backend.card, batch_size=8, workers=0)
    maps: dict[bool, float] = {}
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for tta in (False, True):
            tic = time.perf_counter()
            result = evaluate_split(backend, loader, class_names=names, metric="voc", tta=tta)
            times[tta].append((time.perf_counter() - tic) * 1000 / len(records))
            maps.setdefault(tta, result["map"])
    return {("tta" if tta else "plain"): (maps[tta], statistics.median(times[tta])) for tta in (False, True)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", required=True, metavar="NAME=WEIGHTS=DATA")
    parser.add_argument("--split", default="val")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print("| dataset | images | plain mAP50 | TTA mAP50 | change (points) | plain ms/img | TTA ms/img | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for run in args.runs:
        name, weights, data = run.split("=", 2)
        images = len(load_training_data(data, skip_invalid=True, splits=(args.split,)).records(args.split))
        got = measure(weights, data, args.repeats, args.split)
        (plain, plain_ms), (tta, tta_ms) = got["plain"], got["tta"]
        print(f"| {name} | {images} | {plain:.4f} | {tta:.4f} | {100 * (tta - plain):+.2f} | {plain_ms:.1f} | "
              f"{tta_ms:.1f} | {tta_ms / plain_ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()

"""`ssd data split` class balance: each class's share of objects in val and test against the share asked, for the
iterative stratification and for a plain seeded shuffle of the same images, over several seeds.

    SSD_SHARED_DATA=/work/shared/data .venv/bin/python benchmarks/data_split.py
"""

from __future__ import annotations

import os
import random
from pathlib import Path

from ssd.data.commands.split import stratified_split
from ssd.data.load import load_dataset

SHARES = {"train": 0.7, "val": 0.2, "test": 0.1}
DATASETS = {"bccd": "bccd/BCCD", "aquarium": "aquarium/data.yaml"}


def shuffled(count: int, seed: int) -> dict[str, list[int]]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    val, test = round(SHARES["val"] * count), round(SHARES["test"] * count)
    return {"val": order[:val], "test": order[val:val + test], "train": order[val + test:]}


def deviations(counts: list[list[int]], parts: dict[str, list[int]]) -> dict[str, list[float]]:
    """Per split, each class's share of its objects there minus the split's share (points)."""
    totals = [sum(c[k] for c in counts) for k in range(len(counts[0]))]
    return {s: [100 * (sum(counts[i][k] for i in parts[s]) / max(totals[k], 1) - SHARES[s])
                for k in range(len(totals))] for s in ("val", "test")}


def main() -> None:
    root = Path(os.environ.get("SSD_SHARED_DATA", "../shared/data"))
    for name, rel in DATASETS.items():
        spec = load_dataset(root / rel)
        every = list({r.path: r for records in spec.splits.values() for r in records}.values())  # trainval once
        counts = [[sum(o.label == k for o in r.objects) for k in range(spec.num_classes)] for r in every]
        labels = [{o.label for o in r.objects} for r in every]
        print(f"{name}: {len(every)} images, classes {spec.class_names}")
        for method in ("stratified", "shuffled"):
            worst = []
            for seed in range(5):
                parts = stratified_split(labels, SHARES, seed) if method == "stratified" else \
                    shuffled(len(every), seed)
                dev = deviations(counts, parts)
                worst.append(max(abs(v) for values in dev.values() for v in values))
                if seed == 0:
                    for split, values in dev.items():
                        cells = ", ".join(f"{n} {v:+.1f}" for n, v in zip(spec.class_names, values))
                        print(f"  {method:<10} seed 0 {split:<4} (target {100 * SHARES[split]:.0f}%): {cells}")
            print(f"  {method:<10} largest |deviation| over seeds 0-4: " + ", ".join(f"{w:.1f}" for w in worst))


if __name__ == "__main__":
    main()

"""Default-box coverage before and after fitting (``ssd check --fit-priors``) on the shared real datasets.

For BCCD and Aquarium and each model (``ssd300_vgg16``, ``ssdlite320_mobilenet_v3_large``, ``ssd_tiny``) at its own
input size: fit on the train split, keeping the boxes per location (``keep``) and with free aspect-ratio sets
(``free``); then the coverage (share of boxes whose best default box has IoU >= 0.5) of the train boxes it was fitted
on and of the val boxes (held out), overall and for small objects (``sqrt(w h)`` under 10% of the image), the
ceiling (the share default boxes of any shapes at the same centres could cover, on train), the boxes per location of
each level, and the fit time (including the before/after coverage). Issue 11's target: Aquarium, ``ssd300_vgg16``,
boxes per location kept: overall >= 85% and small >= 65%.

Run: ``.venv/bin/python benchmarks/priors.py [--datasets aquarium bccd] [--models NAME ...] [--image-size N]
[--threads N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))
DATASETS = {"aquarium": SHARED / "aquarium" / "data.yaml", "bccd": SHARED / "bccd"}
MODELS = ("ssd300_vgg16", "ssdlite320_mobilenet_v3_large", "ssd_tiny")

from ssd.data import load_dataset  # noqa: E402
from ssd.data.coverage import fit_for_model, spec_boxes, training_boxes  # noqa: E402
from ssd.priors.coverage import coverage  # noqa: E402


def _small(cov: dict) -> float:
    return next(b["covered"] for b in cov["by_size"] if b["name"] == "small")


def _pair(before: float, after: float) -> str:
    return f"{before:.1%} -> {after:.1%}"


def rows_for(dataset: str, model: str, image_size: int | None) -> list[list[str]]:
    spec = load_dataset(DATASETS[dataset])
    train, val = training_boxes(spec), spec_boxes(spec, ["val"])
    rows = []
    for mode in ("keep", "free"):
        fit = fit_for_model(train, model, image_size, free=mode == "free")
        val_before = coverage(val, fit.base.boxes(fit.image_size))
        val_after = coverage(val, fit.priors.boxes(fit.image_size))
        per_location = "/".join(str(2 + 2 * len(r)) for r in fit.priors.aspect_ratios)
        rows.append([dataset, model, str(fit.image_size), mode + ("" if fit.changed else " (unchanged)"),
                     _pair(fit.before["covered"], fit.after["covered"]), _pair(_small(fit.before), _small(fit.after)),
                     _pair(val_before["covered"], val_after["covered"]), _pair(_small(val_before), _small(val_after)),
                     f"{fit.ceiling:.1%}", per_location, f"{fit.seconds:.1f}"])
        if dataset == "aquarium" and model == "ssd300_vgg16" and mode == "keep" and image_size in (None, 300):
            met = fit.after["covered"] >= 0.85 and _small(fit.after) >= 0.65
            print(f"issue 11 target (aquarium, ssd300_vgg16, boxes per location kept: overall >= 85%, small >= 65%)"
                  f": {'met' if met else 'NOT met'} (train {fit.after['covered']:.1%} / {_small(fit.after):.1%}, "
                  f"val {val_after['covered']:.1%} / {_small(val_after):.1%})", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=list(DATASETS), choices=list(DATASETS))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--image-size", type=int, help="input size of every model (default: each model's own)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the fit runs many small "
                        "tensor operations; see benchmarks/README.md)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    header = ["data", "model", "px", "fit", "train all", "train small", "val all", "val small", "ceiling",
              "boxes/location", "fit s"]
    rows = []
    for dataset in args.datasets:
        for model in args.models:
            rows += rows_for(dataset, model, args.image_size)
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"(torch {torch.__version__}, {torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()

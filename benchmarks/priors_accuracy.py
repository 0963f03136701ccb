"""Accuracy of ``ssd_tiny`` trained on Aquarium with its default boxes, with fitted ones (``--priors auto``) and
with fitted ones at the non-square input size ``ssd check`` suggests (issue 11).

Each variant trains from scratch on the ``train`` split for the same fixed number of epochs, once per seed, and is
scored by ``ssd.evaluate(last.pt, data, metric="voc")`` (VOC mAP@0.5, area under the interpolated PR curve) on the
``val`` split. Variants:

- ``default 256``: the model's own default boxes at its 256 px input;
- ``auto 256``: ``--priors auto`` (fitted to the training boxes, boxes per location kept) at 256 px;
- ``auto HxW``: ``--priors auto`` at the size ``ssd check --model ssd_tiny`` suggests for the dataset (Aquarium:
  288x224, about the pixels of 256x256).

The budget is a number of epochs, not a time, so that load from other processes on the shared machine changes the
wall time and not the result. Without ``--epochs`` the script calibrates it first: a 2-epoch run of ``default 256``
times one training epoch and ``--budget-min`` (minutes per run, setup and evaluation included) is divided by it;
the epochs found and each run's wall time are printed, and ``--epochs N`` repeats exactly that budget.

Training settings (every variant alike): ``--amp`` (bf16 autocast on CPUs with native bf16 kernels), 2 loader
workers, batch 16, the ``ssd_tiny`` optimizer defaults (AdamW, cosine), images decoded once into RAM at the input
size (``cache_images``: decoding the ~1024 px photos costs more than the training step of this small model), and:

- ``--augment light`` (flip, mild jitter): it trains best in these budgets. With the same 4 minutes (``default
  256``, seed 0, under load: ``ssd`` 7 epochs, ``light`` 8) VOC mAP 0.0007 with ``ssd`` against 0.0211 with
  ``light`` (batch 8 instead of 16: 0.0245); the full SSD augmentation (zoom out, IoU crop) pays off only over far
  longer training.
- one torch thread in the training process (``--threads``): on the shared 2-core machine other processes keep the
  cores busy and two OpenMP threads then wait for each other; measured there under a load of 7, a batch-16
  training step took 3.5 s with 2 threads and 0.46 s with 1.

Prints one row per variant: the mAP of each seed, mean +- half the range, the default-box coverage (share of boxes
whose best default box reaches IoU 0.5) of the train and val boxes with the model's default boxes at that size and
with the boxes the run used, the epochs and the mean wall time of a run.

Run: ``.venv/bin/python benchmarks/priors_accuracy.py [--seeds 0 1 2] [--epochs N | --budget-min 4 [--calibrate]]
[--augment light] [--variants default-256 auto-256 auto-suggested] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))
DATA = SHARED / "aquarium" / "data.yaml"
MODEL = "ssd_tiny"
VARIANTS = ("default-256", "auto-256", "auto-suggested")

from ssd.data import load_dataset  # noqa: E402
from ssd.data.coverage import spec_boxes, suggest_image_size, training_boxes  # noqa: E402
from ssd.evaluation.evaluator import evaluate  # noqa: E402
from ssd.models.build import default_priors  # noqa: E402
from ssd.models.load import model_from_checkpoint  # noqa: E402
from ssd.priors.coverage import coverage  # noqa: E402
from ssd.sizes import size_text  # noqa: E402
from ssd.text import render_table  # noqa: E402
from ssd.training.trainer import train  # noqa: E402


def variant_settings(name: str, suggested: str) -> dict:
    """``train`` overrides of a variant: its input size and priors."""
    size = suggested if name == "auto-suggested" else 256
    return {"image_size": size, "priors": None if name.startswith("default") else "auto"}


def run_once(settings: dict, seed: int, epochs: int, args: argparse.Namespace, project: str) -> dict:
    """Train one variant with one seed and score ``last.pt`` on val; the training log goes to the run directory."""
    start = time.perf_counter()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        result = train(data=str(args.data), model=MODEL, epochs=epochs, seed=seed, batch_size=args.batch_size,
                       workers=args.workers, amp=True, augment=args.augment, cache_images=True, device="cpu",
                       quiet=True, metric="voc", val_interval=epochs, num_plot_images=0, project=project,
                       name=f"{settings['priors'] or 'default'}-{size_text(settings['image_size'])}-s{seed}",
                       **settings)
    weights = result.run_dir / "weights" / "last.pt"
    trained = time.perf_counter() - start
    scored = evaluate(weights, args.data, metric="voc", split="val", workers=args.workers, device="cpu")
    (result.run_dir / "train.log").write_text(log.getvalue())
    return {"map": scored["map"], "priors": model_from_checkpoint(weights).config.priors, "train_s": trained,
            "wall_s": time.perf_counter() - start, "history": result.history}


def calibrate(args: argparse.Namespace, project: str) -> int:
    """Epochs that fit ``--budget-min`` per run: a 2-epoch run times one epoch (the first, without validation)."""
    probe = run_once(variant_settings("default-256", ""), args.seeds[0], 2, args, project)
    epoch_s = probe["history"][0]["time"]
    overhead = max(0.0, probe["wall_s"] - 2 * epoch_s)  # setup, image cache, validation, evaluation
    epochs = max(1, math.floor((args.budget_min * 60 - overhead) / epoch_s))
    print(f"calibration: one epoch {epoch_s:.1f} s, setup + evaluation {overhead:.1f} s -> {epochs} epochs for "
          f"{args.budget_min:g} min per run (machine load now: {os.getloadavg()[0]:.1f})", flush=True)
    return epochs


def covered(boxes: torch.Tensor, priors, size) -> float:
    return coverage(boxes, priors.boxes(size))["covered"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, help="epochs per run (default: calibrated to --budget-min)")
    parser.add_argument("--budget-min", type=float, default=4.0, help="minutes per run when calibrating")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--image-size", help="the non-square size of auto-suggested (default: ssd check's)")
    parser.add_argument("--augment", default="light", choices=["ssd", "light", "none"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads of the training process (default 1: see the module docstring)")
    parser.add_argument("--calibrate", action="store_true", help="only find the epochs for --budget-min")
    parser.add_argument("--project", help="keep the runs here (default: a temporary folder)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = load_dataset(args.data)
    suggested = args.image_size or suggest_image_size(spec, MODEL)["text"]
    train_boxes, val_boxes = training_boxes(spec), spec_boxes(spec, ["val"])
    print(f"{MODEL} on {args.data}: {len(spec.records('train'))} train / {len(spec.records('val'))} val images, "
          f"seeds {args.seeds}, augment {args.augment}, amp, {args.workers} workers, batch {args.batch_size}; "
          f"suggested non-square size {suggested}; torch {torch.__version__}, {torch.get_num_threads()} threads",
          flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        project = args.project or scratch
        epochs = args.epochs or calibrate(args, project)
        if args.calibrate:
            return
        rows = []
        for name in args.variants:
            settings = variant_settings(name, suggested)
            size = settings["image_size"]
            runs = []
            for seed in args.seeds:
                runs.append(run_once(settings, seed, epochs, args, project))
                print(f"  {name} seed {seed}: mAP {runs[-1]['map']:.4f} ({runs[-1]['wall_s']:.0f} s)", flush=True)
            rows.append(table_row(name, size, runs, train_boxes, val_boxes, epochs))
    header = ["variant", "px", "mAP per seed", "mean +- half range", "train cov default -> used",
              "val cov default -> used", "epochs", "wall s / run"]
    print("\n".join(render_table(header, rows)))


def table_row(name: str, size, runs: list[dict], train_boxes, val_boxes, epochs: int) -> list[str]:
    maps = [r["map"] for r in runs]
    default = default_priors(MODEL, size)
    used = dict.fromkeys(r["priors"] for r in runs)  # the fit is seeded by the run's seed: usually one configuration
    cov = [f"{covered(boxes, default, size):.1%} -> "
           + "/".join(f"{covered(boxes, p, size):.1%}" for p in used) for boxes in (train_boxes, val_boxes)]
    return [name, size_text(size), " ".join(f"{m:.4f}" for m in maps),
            f"{statistics.mean(maps):.4f} +- {(max(maps) - min(maps)) / 2:.4f}", *cov, str(epochs),
            f"{statistics.mean(r['wall_s'] for r in runs):.0f}"]


if __name__ == "__main__":
    main()

"""Tiled vs plain evaluation of one checkpoint: VOC mAP@0.5 (and COCO APs/APm/APl) on a split, time per image.

The checkpoint is given (``--weights``) or trained first: ``ssd_tiny`` on the dataset (default: aquarium) for
``--epochs`` epochs on the CPU (bf16 autocast where the CPU has it, images decoded once and cached, no loader
workers: the fastest setting on a shared 2-core machine; validated once at the end).
The split is read once; each variant predicts it through :func:`ssd.evaluation.evaluator.evaluate_split` (the code
behind ``ssd val``): plain, ``--tile auto`` and each fixed ``--tile N``. The detections of a variant are scored
with every metric (same detections, same scoring code). Time per image is the wall time of the variant's pass over
the split (decoding and the loader's resize included) divided by its images.

Usage: ``.venv/bin/python benchmarks/tiling.py [--weights CKPT | --epochs 5 --project DIR] [--tiles 512]
[--overlap 0.2]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch

from ssd.data.gate import load_training_data
from ssd.device import prepare_model, resolve_device
from ssd.evaluation.evaluator import evaluate_split, score_detections, split_loader
from ssd.inference.tiling import tile_shape, tile_windows
from ssd.models.load import model_from_checkpoint
from ssd.training.trainer import train

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))


def train_checkpoint(data: Path, epochs: int, project: Path) -> Path:
    tic = time.perf_counter()
    result = train(data=str(data), model="ssd_tiny", epochs=epochs, amp=True, workers=0, cache_images=True,
                   device="cpu", quiet=True, val_interval=epochs, project=str(project), seed=0)
    print(f"trained ssd_tiny for {epochs} epochs in {time.perf_counter() - tic:.0f} s: "
          f"val mAP {result.best_map:.4f} ({result.run_dir})")
    return result.run_dir / "weights" / "last.pt"


def crops_per_image(records, tile, overlap: float, input_size) -> float:
    """Network passes per image: the whole image plus its tiles."""
    from ssd.sizes import as_hw

    counts = [1 + (0 if (shape := tile_shape(tile, (r.height, r.width), as_hw(input_size))) is None
                   else len(tile_windows((r.height, r.width), shape, overlap))) for r in records]
    return sum(counts) / len(counts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--weights", type=Path, help="checkpoint to evaluate (default: train one)")
    parser.add_argument("--data", type=Path, default=SHARED / "aquarium" / "data.yaml")
    parser.add_argument("--split", default="val")
    parser.add_argument("--epochs", type=int, default=5, help="training epochs when no --weights")
    parser.add_argument("--tiles", type=int, nargs="*", default=[512], help="fixed tile sides besides auto")
    parser.add_argument("--overlap", type=float, default=0.2)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--project", type=Path, help="keep the trained run here (default: a temporary folder)")
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        weights = args.weights or train_checkpoint(args.data, args.epochs, args.project or Path(tmp))
        evaluate_variants(weights, args)


def evaluate_variants(weights: Path, args: argparse.Namespace) -> None:
    device = resolve_device("cpu")
    model = model_from_checkpoint(weights)
    names = list(model.class_names)
    spec = load_training_data(args.data, class_names=names, splits=(args.split,))
    records = spec.records(args.split)
    model, channels_last = prepare_model(model, device, None)
    loader = split_loader(records, names, model.config, batch_size=args.batch_size)
    print(f"{weights}: {len(records)} {args.split} images, input {model.config.image_size}, overlap {args.overlap}")
    print(f"{'variant':<10} {'crops/img':>9} {'mAP voc':>8} {'voc07':>7} {'APs':>7} {'APm':>7} {'APl':>7} "
          f"{'s/img':>7}")
    for tile in [None, "auto", *args.tiles]:
        tic = time.perf_counter()
        result = evaluate_split(model, loader, class_names=names, metric="voc", device=device,
                                channels_last=channels_last, tile=tile, tile_overlap=args.overlap)
        seconds = (time.perf_counter() - tic) / len(records)
        dets, gts = result["detections"], result["ground_truths"]
        voc07 = score_detections(dets, gts, names, "voc07")["map"]
        coco = score_detections(dets, gts, names, "coco")
        crops = crops_per_image(records, None if tile is None else ("auto" if tile == "auto" else (tile, tile)),
                                args.overlap, model.config.image_size)
        print(f"{tile or 'plain'!s:<10} {crops:>9.1f} {result['map']:>8.4f} {voc07:>7.4f} {coco['APs']:>7.4f} "
              f"{coco['APm']:>7.4f} {coco['APl']:>7.4f} {seconds:>7.3f}", flush=True)


if __name__ == "__main__":
    main()

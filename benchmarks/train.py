"""End-to-end training throughput (data loading included) of an SSD model, ssd vs torchvision.

Both variants read the same images of a shared real dataset (default: aquarium's train split) through the same
``torchvision.transforms.v2`` SSD augmentation (``ssd.data.transforms.build_transform``) with the same number of
loader workers, batch 16, SGD with momentum; ``--model`` ssdlite320_mobilenet_v3_large (default) or ssd300_vgg16,
``--device`` cpu (default) or cuda, ``--amp`` mixed precision (the library's ``--amp``; torchvision under the same
``torch.autocast`` dtype, ``ssd.device.amp_dtype``):

- ``ssd``: the library's training step (``ssd.training.trainer.Trainer.train_step``: forward, MultiBoxLoss,
  backward, gradient clipping, optimizer, lr schedule) on ``build_dataloader`` batches;
- ``torchvision``: ``torchvision.models.detection.<model>(weights=None, weights_backbone=None)`` in train mode (its
  own transform and loss) in a plain loop.

Each variant runs in a fresh subprocess; the figure is the median time per iteration (loader wait included) after
warm-up (CUDA synchronized), as images/s, and the process's peak RSS. Run: ``.venv/bin/python benchmarks/train.py
[--iters N] [--model ssd300_vgg16] [--device cuda] [--amp]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))
MODELS = {"ssdlite320_mobilenet_v3_large": 320, "ssd300_vgg16": 300}  # model -> input size


def _time_loop(loader, step, warmup: int, iters: int, device: str = "cpu") -> list[float]:
    """Seconds per iteration (waiting for the batch included) of the ``iters`` iterations after ``warmup``."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times, it = [], iter(loader)
    for i in range(warmup + iters):
        tic = time.perf_counter()
        step(next(it))
        sync()
        if i >= warmup:
            times.append(time.perf_counter() - tic)
    return times


def run_ssd(data: str, batch_size: int, workers: int, warmup: int, iters: int, model: str, device: str,
            amp: bool) -> list[float]:
    import ssd.distributed as ddp
    from ssd.training.config import TrainConfig
    from ssd.training.trainer import Trainer

    with tempfile.TemporaryDirectory() as project:
        config = TrainConfig(data=data, model=model, batch_size=batch_size, workers=workers, device=device,
                             quiet=True, epochs=1, optimizer="sgd", skip_invalid=True, project=project, amp=amp)
        trainer = Trainer(config, ddp.DistInfo(), ddp.resolve_device(device))
        trainer.net.train()
        return _time_loop(trainer.train_loader, trainer.train_step, warmup, iters, device)


def run_torchvision(data: str, batch_size: int, workers: int, warmup: int, iters: int, model: str, device: str,
                    amp: bool) -> list[float]:
    import torch
    import torchvision.models.detection as detection
    from torch.utils.data import DataLoader

    from ssd.data import DetectionDataset, load_training_data
    from ssd.data.transforms import build_transform
    from ssd.device import amp_dtype, resolve_device

    spec = load_training_data(data, skip_invalid=True)  # the same images and boxes as the trainer
    # the same augmentation; torchvision's model normalizes itself, so the pipeline ends with [0, 1] images
    size = MODELS[model]
    transform = build_transform(size, [0.0, 0.0, 0.0], [1.0, 1.0, 1.0], train=True, augment="ssd")
    dataset = DetectionDataset(spec.records("train"), spec.class_names, transform, image_size=size,
                               keep_difficult=False)

    def collate(batch):
        images = [image.as_subclass(torch.Tensor) for image, _ in batch]
        targets = [{"boxes": t["boxes"].as_subclass(torch.Tensor), "labels": t["labels"] + 1} for _, t in batch]
        return images, targets

    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers, collate_fn=collate,
                        drop_last=True, persistent_workers=workers > 0)
    target = resolve_device(device)
    dtype = amp_dtype(target) if amp else None
    network = getattr(detection, model)(weights=None, weights_backbone=None, num_classes=spec.num_classes + 1)
    network.to(target).train()
    optimizer = torch.optim.SGD(network.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)

    def step(batch):
        images, targets = batch
        images = [image.to(target, non_blocking=True) for image in images]
        targets = [{k: v.to(target, non_blocking=True) for k, v in t.items()} for t in targets]
        with torch.autocast(target.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            losses = network(images, targets)
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return _time_loop(loader, step, warmup, iters, device)


def child(args: argparse.Namespace) -> None:
    run = run_ssd if args.variant == "ssd" else run_torchvision
    times = run(args.data, args.batch_size, args.workers, args.warmup, args.iters, args.model, args.device, args.amp)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux reports KiB)
    print(json.dumps({"median_s": statistics.median(times), "peak_rss_mib": peak}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(SHARED / "aquarium" / "data.yaml"))
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=6)
    parser.add_argument("--model", choices=list(MODELS), default="ssdlite320_mobilenet_v3_large")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--amp", action="store_true", help="mixed precision in both variants")
    parser.add_argument("--variant", choices=["ssd", "torchvision"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        return child(args)
    if not Path(args.data).exists():
        sys.exit(f"dataset not found: {args.data} (set SSD_SHARED_DATA)")

    print(f"training throughput, {args.model} on {args.device}{' with amp' if args.amp else ''}, batch "
          f"{args.batch_size}, {args.workers} loader workers, "
          f"{args.iters} timed iterations after {args.warmup} warm-up, data {args.data}")
    results = {}
    for variant in ("ssd", "torchvision"):
        cmd = [sys.executable, __file__, "--variant", variant, "--data", args.data, "--batch-size",
               str(args.batch_size), "--workers", str(args.workers), "--warmup", str(args.warmup),
               "--iters", str(args.iters), "--model", args.model, "--device", args.device,
               *(["--amp"] if args.amp else [])]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(f"{'variant':<12} {'s/iter (median)':>16} {'images/s':>10} {'peak RSS MiB':>13}")
    for variant, r in results.items():
        print(f"{variant:<12} {r['median_s']:>16.3f} {args.batch_size / r['median_s']:>10.1f} "
              f"{r['peak_rss_mib']:>13.0f}")
    ratio = results["torchvision"]["median_s"] / results["ssd"]["median_s"]
    print(f"speed-up ssd / torchvision: {ratio:.2f}x (target >= 1.2x)")


if __name__ == "__main__":
    main()

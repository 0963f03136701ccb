"""Model speed against torchvision 0.29's SSDs at the same class count (20 classes + background), in one run.

Rows: ``ssdlite320_mobilenet_v3_large`` and ``ssd300_vgg16`` (ours versus torchvision's, built with
``weights=None, weights_backbone=None``), plus ``ssd_tiny`` (ours only; with ``--layouts`` also without
channels_last, with ``--compile`` also under ``torch.compile``). Tasks, on the same inputs for both sides:

- ``train b16``: forward + loss + backward + SGD step (momentum 0.9) at batch 16, native input size, 3 objects per
  image. Ours: ``model(images)`` + ``ssd.MultiBoxLoss``; torchvision: ``model(images, targets)`` in train mode.
- ``infer b1`` / ``infer b16``: 480x640 images in [0, 1] to detections in image pixels, each side with
  torchvision's thresholds for that model. Ours: ``model.predict``; torchvision: ``model(images)`` in eval mode.

Each (model, implementation) runs in its own fresh subprocess, in the memory format its configuration recommends
(``config.channels_last`` for ours, torchvision as it comes). Figures are medians of images/s over the timed
iterations (default 1, ``--iters``: an SSD300 training step at batch 16 takes tens of seconds on 2 cores), after one
warm-up. Peak memory is the rise of the process's peak RSS during a task (warm-up included)
over the RSS before it (``/proc/self/clear_refs`` resets the high-water mark), with ``MALLOC_MMAP_THRESHOLD_`` low
so that freed tensors go back to the system. The machine is shared: expect noise.

Usage: ``.venv/bin/python benchmarks/models.py [--iters N] [--layouts] [--compile] [--only NAME]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

NUM_CLASSES = 20
TV_NAMES = {"ssdlite320_mobilenet_v3_large", "ssd300_vgg16"}
TV_THRESHOLDS = {  # torchvision's defaults for each model, used by both sides
    "ssdlite320_mobilenet_v3_large": dict(score_threshold=0.001, iou_threshold=0.55, max_detections=300),
    "ssd300_vgg16": dict(score_threshold=0.01, iou_threshold=0.45, max_detections=200),
    "ssd_tiny": dict(score_threshold=0.01, iou_threshold=0.45, max_detections=200),
}
TASKS = ("train b16", "infer b1", "infer b16")


def _rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _targets(batch: int, size: int):
    import torch

    g = torch.Generator().manual_seed(0)
    centres = torch.rand(batch, 3, 2, generator=g) * 0.6 + 0.2
    sizes = torch.rand(batch, 3, 2, generator=g) * 0.35 + 0.05
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), dim=-1)  # normalized xyxy
    labels = torch.randint(0, NUM_CLASSES, (batch, 3), generator=g)
    images01 = torch.rand(batch, 3, size, size, generator=g)
    return images01, boxes, labels


def _ours(name: str, variant: str):
    """Callables per task for our model."""
    import torch

    from ssd import MultiBoxLoss, build_model

    torch.manual_seed(0)
    model = build_model(name, NUM_CLASSES)
    channels_last = model.config.channels_last and variant != "nchw"
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(memory_format=memory_format)
    model.config = model.config.replace(channels_last=channels_last)  # predict follows it
    net = torch.compile(model) if variant == "compile" else model
    size = model.image_size
    images01, boxes, labels = _targets(16, size)
    mean, std = torch.tensor(model.config.mean).view(3, 1, 1), torch.tensor(model.config.std).view(3, 1, 1)
    images = ((images01 - mean) / std).contiguous(memory_format=memory_format)
    loss_fn = MultiBoxLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)

    def train():
        model.train()
        loc, logits = net(images)
        loc_loss, cls_loss = loss_fn(loc, logits, model.priors, boxes, labels)
        optimizer.zero_grad(set_to_none=True)
        (loc_loss + cls_loss).backward()
        optimizer.step()

    def infer(batch):
        return model.predict(batch, **TV_THRESHOLDS[name])

    return train, infer


def _torchvision(name: str):
    import torch
    from torchvision.models import detection

    torch.manual_seed(0)
    model = getattr(detection, name)(weights=None, weights_backbone=None, num_classes=NUM_CLASSES + 1)
    size = model.transform.fixed_size[0] if model.transform.fixed_size else 300
    images01, boxes, labels = _targets(16, size)
    images = list(images01)
    targets = [{"boxes": b * size, "labels": lab + 1} for b, lab in zip(boxes, labels)]
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=5e-4)

    def train():
        model.train()
        losses = model(images, targets)
        optimizer.zero_grad(set_to_none=True)
        sum(losses.values()).backward()
        optimizer.step()

    @torch.no_grad()
    def infer(batch):
        model.eval()
        return model(list(batch))

    return train, infer


def _worker(name: str, impl: str, iters: int) -> dict:
    """Run in a fresh process: time each task, measure its peak RSS rise; returns a JSON-able dict."""
    import torch

    train, infer = _torchvision(name) if impl == "torchvision" else _ours(name, impl)
    frames = torch.rand(16, 3, 480, 640, generator=torch.Generator().manual_seed(1))
    tasks = {"infer b1": (lambda: infer(frames[:1]), 1, 2 * iters + 1),
             "infer b16": (lambda: infer(frames), 16, iters),
             "train b16": (train, 16, iters)}
    result = {}
    for task in ("infer b1", "infer b16", "train b16"):  # training last: its gradients stay allocated
        fn, batch, repeats = tasks[task]
        before = _rss_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
        fn()  # warm-up
        times = []
        for _ in range(repeats):
            tic = time.perf_counter()
            fn()
            times.append(time.perf_counter() - tic)
        result[task] = {"img_s": batch / statistics.median(times), "peak_mib": (_rss_kib("VmHWM") - before) / 1024}
    return result


def _run(name: str, impl: str, iters: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, __file__, "--worker", name, impl, "--iters", str(iters)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(f"{name} {impl} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=1, help="timed iterations per task (infer b1: 2N+1)")
    parser.add_argument("--layouts", action="store_true", help="also time ssd_tiny without channels_last")
    parser.add_argument("--compile", action="store_true", help="also time ssd_tiny under torch.compile")
    parser.add_argument("--only", help="run only this model name")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(_worker(*args.worker, args.iters)))
        return

    import torch
    import torchvision

    runs = [("ssdlite320_mobilenet_v3_large", "ssd"), ("ssdlite320_mobilenet_v3_large", "torchvision"),
            ("ssd300_vgg16", "ssd"), ("ssd300_vgg16", "torchvision"), ("ssd_tiny", "ssd")]
    if args.layouts:
        runs.append(("ssd_tiny", "nchw"))
    if args.compile:
        runs.append(("ssd_tiny", "compile"))
    if args.only:
        runs = [r for r in runs if r[0] == args.only]
    print(f"torch {torch.__version__}, torchvision {torchvision.__version__}, {torch.get_num_threads()} threads, "
          f"{NUM_CLASSES} classes + background, {args.iters} timed iterations (infer b1: {2 * args.iters + 1}), "
          "medians in images/s; peak = RSS rise in MiB")
    results = {}
    for name, impl in runs:
        tic = time.perf_counter()
        results[name, impl] = _run(name, impl, args.iters)
        print(f"  ran {name} [{impl}] in {time.perf_counter() - tic:.0f} s", flush=True)

    header = f"{'model':<31} {'task':<10} {'ssd img/s':>10} {'tv img/s':>9} {'ratio':>6} {'ssd peak':>9} {'tv peak':>8}"
    print(header)
    print("-" * len(header))
    for name in dict.fromkeys(n for n, _ in runs):
        for impl in [i for n, i in runs if n == name and i != "torchvision"]:
            label = name if impl == "ssd" else f"{name} ({'no channels_last' if impl == 'nchw' else impl})"
            for task in TASKS:
                ours = results[name, impl][task]
                theirs = results.get((name, "torchvision"), {}).get(task)
                ratio = f"{theirs['img_s']:9.2f} {ours['img_s'] / theirs['img_s']:5.2f}x" if theirs else None
                tv = ratio or f"{'-':>9} {'-':>6}"
                tv_peak = f"{theirs['peak_mib']:8.0f}" if theirs else f"{'-':>8}"
                print(f"{label:<31} {task:<10} {ours['img_s']:10.2f} {tv} {ours['peak_mib']:9.0f} {tv_peak}")


if __name__ == "__main__":
    main()

"""Training data pipeline throughput (decode + SSD augmentation + collate), next to the ssd_tiny training step rate.

For each shared real dataset (BCCD trainval, Aquarium train) at 300x300, batch 32, ``build_dataloader`` with 0 and 2
workers: images/s over the batches after one warm-up batch. Also the synthetic demo path (256 px, RAM
cache). Side by side, the per-image cost of the SSD transform with ``ssd.data.transforms.IoUCropWithBoxes``
(vectorized trials) against the same pipeline with torchvision's stock ``RandomIoUCrop``, on the same decoded images.
Last row: training steps/s of ``ssd_tiny`` (when ``ssd.build_model`` provides it) as images/s, to see whether data
loading is the bottleneck. ``--decode`` measures only ``read_image``: median ms per image at full size (predict,
validation) and with ``min_size=300`` (the training loader's reduced JPEG decode), for each dataset's first images
and for PNGs. Run: ``.venv/bin/python benchmarks/data.py [--batches N] [--decode]``.
"""

from __future__ import annotations

import argparse
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
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

from ssd.data import build_dataloader, load_dataset  # noqa: E402
from ssd.data.images import read_image  # noqa: E402
from ssd.data.loader import DetectionDataset  # noqa: E402
from ssd.data.transforms import IoUCropWithBoxes, build_transform  # noqa: E402


def loader_rate(records, names, size, workers, batches, batch_size=32, cache=False) -> float:
    """Images/s over ``batches`` batches after one warm-up batch, from their total time: a per-batch median would
    time batches the workers prefetched during the warm-up (2 per worker). With 0 workers the main process runs on
    one torch thread, as each loader worker does (two threads on a loaded 2-core machine thrash)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1 if workers == 0 else threads)
    loader = build_dataloader(records, names, size, MEAN, STD, train=True, batch_size=batch_size, workers=workers,
                              seed=0, cache_images=cache, drop_last=True)
    it = iter(loader)
    next(it)
    tic = time.perf_counter()
    for _ in range(batches):
        next(it)
    elapsed = time.perf_counter() - tic
    del it, loader
    torch.set_num_threads(threads)
    return batches * batch_size / elapsed


def transform_ms(records, names, size, stock: bool, n=24) -> float:
    """Median ms per image of the SSD train transform on pre-decoded images (same images and seeds for both), on one
    thread as in a loader worker."""
    transform = build_transform(size, MEAN, STD, train=True, augment="ssd")
    if stock:
        transform.transforms[2] = _StockIoUCrop()
    ds = DetectionDataset(records[:n], names, transform, image_size=size, cache_images=True, keep_difficult=False)
    times, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    for i in range(len(ds)):
        tic = time.perf_counter()
        ds[(i, i)]
        times.append(time.perf_counter() - tic)
    torch.set_num_threads(threads)
    return 1000 * statistics.median(times)


class _StockIoUCrop(IoUCropWithBoxes):
    """torchvision's per-trial ``RandomIoUCrop.make_params`` (only the empty-image guard of ours kept)."""

    make_params = IoUCropWithBoxes.__mro__[1].make_params


def decode_ms(paths, min_size=None, repeats=3) -> float:
    """Median ms per ``read_image`` call over ``paths`` (each decoded ``repeats`` times, files cached), one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    times = []
    for path in paths:
        for _ in range(repeats):
            tic = time.perf_counter()
            read_image(path, min_size=min_size)
            times.append(time.perf_counter() - tic)
    torch.set_num_threads(threads)
    return 1000 * statistics.median(times)


def print_decode(datasets, folder: Path, n=40) -> None:
    """The first ``n`` images of each dataset, then the first dataset's saved as PNG in ``folder``."""
    from PIL import Image

    rows = [(name, [r.path for r in records[:n]]) for name, records, _, _ in datasets]
    if rows:
        pngs = [folder / f"{i}.png" for i in range(len(rows[0][1]))]
        for source, png in zip(rows[0][1], pngs):
            Image.open(source).save(png)
        rows.append((rows[0][0].split()[0] + " as PNG", pngs))
    print(f"{'read_image per image (median ms)':<48} {'full':>7} {'@300':>9}")
    for name, paths in rows:
        print(f"{name:<48} {decode_ms(paths):>7.2f} {decode_ms(paths, min_size=300):>9.2f}")


def tiny_step_rate(num_classes: int, steps: int, batch_size=32):
    try:
        from ssd import MultiBoxLoss
        from ssd.models import build_model

        model = build_model("ssd_tiny", num_classes=num_classes)
    except Exception as e:
        return None, f"skipped ({type(e).__name__}: {e})"
    size = model.image_size
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = MultiBoxLoss()
    images = torch.randn(batch_size, 3, size, size)
    boxes = torch.tensor([[0.1, 0.1, 0.5, 0.6], [0.4, 0.3, 0.9, 0.8]]).expand(batch_size, 2, 4).contiguous()
    labels = torch.zeros(batch_size, 2, dtype=torch.int64)
    times = []
    model.train()
    for i in range(steps + 1):
        tic = time.perf_counter()
        loc, logits = model(images)
        loc_loss, cls_loss = loss_fn(loc, logits, model.priors, boxes, labels)
        opt.zero_grad()
        (loc_loss + cls_loss).backward()
        opt.step()
        if i:
            times.append(time.perf_counter() - tic)
    return batch_size / statistics.median(times), f"{size}x{size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=8,
                        help="timed batches per configuration (more than the 4 that 2 workers prefetch)")
    parser.add_argument("--decode", action="store_true", help="measure only image decoding (read_image)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}; "
          "shared machine: figures are noisy")
    datasets = []
    if (SHARED / "bccd").is_dir():
        spec = load_dataset(SHARED / "bccd")
        datasets.append(("bccd trainval 640x480 @300", spec.splits["trainval"], spec.class_names, 300))
    if (SHARED / "aquarium").is_dir():
        spec = load_dataset(SHARED / "aquarium")
        datasets.append(("aquarium train ~1024 px @300", spec.splits["train"], spec.class_names, 300))
    tmp = tempfile.TemporaryDirectory()
    if args.decode:
        print_decode(datasets, Path(tmp.name))
        return
    from ssd.data.synthetic import generate_synthetic

    synth = load_dataset(generate_synthetic(tmp.name, num_train=320, num_val=0, image_size=256, num_classes=6))
    print(f"{'pipeline (train, ssd augment, batch 32)':<48} {'workers':>7} {'images/s':>9}")
    for name, records, names, size in datasets:
        for workers in (0, 2):
            print(f"{name:<48} {workers:>7} {loader_rate(records, names, size, workers, args.batches):>9.1f}")
    for workers in (0, 2):
        rate = loader_rate(synth.splits["train"], synth.class_names, 256, workers, args.batches, cache=True)
        print(f"{'synthetic 256 px @256, cache_images':<48} {workers:>7} {rate:>9.1f}")

    print(f"\n{'SSD train transform per image (median ms)':<48} {'ours':>7} {'stock':>9} {'stock/ours':>10}")
    for name, records, names, size in datasets + [("synthetic @256", synth.splits["train"], synth.class_names, 256)]:
        ours, stock = transform_ms(records, names, size, False), transform_ms(records, names, size, True)
        print(f"{name:<48} {ours:>7.2f} {stock:>9.2f} {stock / ours:>10.2f}")

    rate, note = tiny_step_rate(len(synth.class_names), steps=3)
    print(f"\nssd_tiny training step (batch 32, {note}): "
          + (f"{rate:.1f} images/s" if rate is not None else "not measured"))


if __name__ == "__main__":
    main()

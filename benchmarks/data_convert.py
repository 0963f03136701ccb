"""`ssd data convert` at scale: a synthetic COCO of N images (every image a hard link to one small JPEG, so only
annotation files and image headers are read, nothing decoded) converted to YOLO and back, each direction in a fresh
process: wall time, peak RSS and the machine's load average. Run at 10k and 100k images to see how memory grows
with the dataset.

    .venv/bin/python benchmarks/data_convert.py --images 10000 100000 --root /tmp/convert-bench
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from PIL import Image

_CONVERT = ("import sys; from ssd.data.commands.convert import convert_dataset; "
            "convert_dataset(sys.argv[1], sys.argv[2], sys.argv[3]); "
            "print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")
"""The conversion, printing its own peak RSS in KiB: ``VmHWM``, not ``ru_maxrss``, which Linux carries over a fork
and exec, so that it would report at least this script's own RSS (the synthetic dataset it built)."""


def make_coco(root: Path, count: int, classes: int = 20, seed: int = 0) -> Path:
    """``root/annotations/train.json`` + ``root/images/train/<i>.jpg`` (links to a few files), 1-8 boxes an image."""
    rng = random.Random(seed)
    (root / "images" / "train").mkdir(parents=True)
    (root / "annotations").mkdir()
    images, annotations = [], []
    for i in range(count):
        model = root / f"model{i // 50_000}.jpg"  # a file takes at most 65,000 links on ext4
        if i % 50_000 == 0:
            Image.new("RGB", (640, 480), (90, 120, 30)).save(model)
        os.link(model, root / "images" / "train" / f"{i:07d}.jpg")
        images.append({"id": i + 1, "file_name": f"train/{i:07d}.jpg", "width": 640, "height": 480})
        for _ in range(rng.randint(1, 8)):
            w, h = rng.uniform(8, 300), rng.uniform(8, 200)
            x, y = rng.uniform(0, 640 - w), rng.uniform(0, 480 - h)
            annotations.append({"id": len(annotations) + 1, "image_id": i + 1, "category_id": rng.randint(1, classes),
                                "bbox": [x, y, w, h], "area": w * h, "iscrowd": 0})
    categories = [{"id": k + 1, "name": f"class{k}"} for k in range(classes)]
    (root / "annotations" / "train.json").write_text(json.dumps(
        {"images": images, "annotations": annotations, "categories": categories}))
    for model in root.glob("model*.jpg"):
        model.unlink()
    return root


def timed(args: list[str]) -> tuple[float, float]:
    """Seconds and peak RSS (MiB) of the conversion ``args`` runs in a new process (the process reports its own)."""
    start = time.perf_counter()
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.strip()
    return time.perf_counter() - start, int(out.splitlines()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--root", type=Path, default=Path("/tmp/convert-bench"))
    args = parser.parse_args()
    print(f"{'images':>8} {'step':>14} {'seconds':>8} {'peak RSS MiB':>13} {'load 1 min':>10}")
    for count in args.images:
        root = args.root / str(count)
        shutil.rmtree(root, ignore_errors=True)
        make_coco(root / "coco", count)
        for step, src, out, to in (("coco -> yolo", "coco", "yolo", "yolo"), ("yolo -> coco", "yolo", "back", "coco")):
            seconds, rss = timed([sys.executable, "-c", _CONVERT, str(root / src), str(root / out), to])
            print(f"{count:>8} {step:>14} {seconds:>8.1f} {rss:>13.0f} {os.getloadavg()[0]:>10.1f}", flush=True)
        shutil.rmtree(root)


if __name__ == "__main__":
    main()

"""The image caches of ``--cache-images`` (issue 28): one training epoch of the data pipeline with the cache off, in
RAM and on disk (cold: the file is built; warm: a later run maps it), and the memory of the trainer and its workers.

Makes ``--images`` distinct synthetic VOC JPEGs of ``--size`` px (:func:`ssd.data.synthetic.generate_synthetic`)
under ``--root`` (default ``/tmp/ssd-image-cache``, never the repository; kept between runs) and runs each mode in a
fresh process: ``build_dataloader`` (train, ``--augment``, 300 px input, batch 32, ``--workers`` forked workers), the
time to build it (the RAM cache decodes every image then, the disk cache builds or maps its file), one epoch, and
at the end of the epoch (workers alive) the summed RSS, PSS, RssAnon and RssFile of the trainer and its workers.
``disk-cold`` runs once first (the file built); then ``--rounds`` rounds of off, ram and disk-warm, medians.

Run: ``.venv/bin/python benchmarks/image_cache.py`` (a few minutes on 2 cores at 2,000 images).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, sys, time
    import psutil
    from ssd.data.load import load_dataset
    from ssd.data.loader import build_dataloader

    mode, data, workers, augment = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    spec = load_dataset(data)
    start = time.monotonic()
    loader = build_dataloader(spec.records("train"), spec.class_names, 300, (0.5,) * 3, (0.25,) * 3, train=True,
                              batch_size=32, workers=workers, augment=augment, drop_last=True,
                              cache_images=None if mode == "off" else mode.split("-")[0])
    built = time.monotonic()
    batches = sum(1 for _ in loader)
    done = time.monotonic()
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    info = [p.memory_full_info() for p in procs]

    def status(p, key):  # kB in /proc/PID/status: RssAnon (private and copy-on-write pages), RssFile (mapped files)
        line = next(l for l in open(f"/proc/{p.pid}/status") if l.startswith(key + ":"))
        return int(line.split()[1]) / 1024

    print(json.dumps({"build_s": built - start, "epoch_s": done - built, "batches": batches,
                      "rss_mb": sum(i.rss for i in info) / 2**20, "pss_mb": sum(i.pss for i in info) / 2**20,
                      "anon_mb": sum(status(p, "RssAnon") for p in procs),
                      "file_mb": sum(status(p, "RssFile") for p in procs)}))
""")


def run(mode: str, data: Path, cache: Path, workers: int, augment: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SSD_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(data), str(workers), augment], env=env,
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("/tmp/ssd-image-cache"))
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--size", type=int, default=320)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--augment", default="light")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from ssd.data.synthetic import generate_synthetic

    data = args.root / f"voc-{args.images}-{args.size}"
    if not (data / "ImageSets").is_dir():
        generate_synthetic(data, num_train=args.images, num_val=0, image_size=args.size)
    cache = args.root / "cache"
    shutil.rmtree(cache / "images", ignore_errors=True)  # disk-cold builds the file
    runs = {"disk-cold": [run("disk-cold", data, cache, args.workers, args.augment)]}
    for _ in range(args.rounds):  # the modes in turn, so that a busy moment of a shared machine hits each alike
        for mode in ("off", "ram", "disk-warm"):
            runs.setdefault(mode, []).append(run(mode, data, cache, args.workers, args.augment))
    results = {mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]} for mode, rs in runs.items()}
    off = results["off"]["epoch_s"]
    print(f"{args.images} images of {args.size} px, 300 px input, batch 32, {args.workers} workers, "
          f"--augment {args.augment}; medians of {args.rounds} runs (disk-cold: 1)")
    print("| cache | build (s) | epoch (s) | epoch vs off | RSS trainer+workers (MB) | PSS (MB) | RssAnon (MB) "
          "| RssFile (MB) |")
    print("|---|---|---|---|---|---|---|---|")
    for mode in ("off", "ram", "disk-cold", "disk-warm"):
        r = results[mode]
        print(f"| {mode} | {r['build_s']:.1f} | {r['epoch_s']:.1f} | {off / r['epoch_s']:.2f}x | {r['rss_mb']:,.0f} "
              f"| {r['pss_mb']:,.0f} | {r['anon_mb']:,.0f} | {r['file_mb']:,.0f} |")


if __name__ == "__main__":
    main()

"""Datasets of many images (issue 28): start-up, annotation memory and ``ssd check`` before and after the dataset index.

Makes synthetic VOC, YOLO and COCO sets of ``--images`` small JPEGs (copies of 256 distinct 96 px pictures, each
file its own inode; 8 boxes each) and a COCO JSON of ``--annotations`` boxes, under ``--root`` (default
``/tmp/ssd-scale``, never the repository), then runs each measurement in a fresh process, for today's code (this
checkout) and for ``--before`` (a checkout of the code before the index, e.g. ``git worktree add /tmp/before
<commit>``), side by side:

- ``ssd.train`` start to the end of the first training step (ssd_tiny at 64 px, batch 16, 2 workers): before,
  after with no index (cold) and with the index present (warm), and the PSS of the trainer and its 2 workers then;
- annotation memory: the growth of the trainer (USS) and of 2 workers that read every item, from a tenth of the
  images to all of them, per image;
- the gate alone (``load_training_data``: read, check, decode) and ``ssd check`` on the VOC set: the call's time
  (imports apart) and the process's peak RSS;
- the COCO JSON: ``load_dataset`` (before / after) and the index warm, against ``pycocotools.COCO`` on the same file.

Run: ``.venv/bin/python benchmarks/scale.py --before /tmp/before`` (about 10 minutes on 2 cores at 10k images;
each process start costs a few seconds of imports, part of the train figures). ``--warm`` (no ``--before``): the
index built once, then the warm gate and the warm ``ssd.train`` start alone, split into its parts (e.g. at
``--images 100000``: the sets are written in about a minute, the index built in several).
``--check`` (no ``--before``): ``ssd check`` on the VOC set as a user runs it, a fresh process each time: cold
(an empty cache folder: the index built) once, then warm (index present) 3 times; the whole command's time (imports
included) and its peak RSS (``os.wait4``), each run bounded by ``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
NAMES = ["a", "b", "c"]
BOXES = 8

CHILD = textwrap.dedent("""
    import json, os, resource, sys, time
    start = time.monotonic()
    mode, data = sys.argv[1], sys.argv[2]

    def pss():
        import psutil
        me = psutil.Process()
        return sum(p.memory_full_info().pss for p in [me, *me.children(recursive=True)]) / 2**20

    out = {}
    if mode == "train":
        import ssd
        from ssd.training.callbacks import Callback

        class Stop(Exception):
            pass

        class FirstStep(Callback):
            def on_train_start(self, trainer):  # the gate, the model and the loaders made; no worker started yet
                out.update(train_start=time.monotonic() - start)

            def on_train_batch_end(self, trainer, step, losses):
                out.update(first_step=time.monotonic() - start, pss_mb=pss())
                raise Stop

        out["imports"] = time.monotonic() - start
        try:
            ssd.train(data=data, model="ssd_tiny", image_size=64, epochs=1, batch_size=16, workers=2, device="cpu",
                      quiet=True, project=sys.argv[3], num_plot_images=0, callbacks=[FirstStep()])
        except Stop:
            pass
    elif mode == "memory":  # the annotations' own memory: the trainer's growth, and what 2 workers copy of it
        import gc, psutil, torch
        from ssd.data.gate import load_training_data
        from ssd.data.loader import DetectionDataset
        me = psutil.Process()
        gc.collect()
        base = me.memory_full_info().uss
        records = load_training_data(data).records("train")
        gc.collect()
        out["trainer_mb"] = (me.memory_full_info().uss - base) / 2**20
        loader = torch.utils.data.DataLoader(DetectionDataset(records, ["a", "b", "c"], image_size=32),
                                             batch_size=64, num_workers=2, collate_fn=len, persistent_workers=True)
        out["items"] = sum(loader)  # every item read once: the workers touch every record
        out["workers_mb"] = sum(p.memory_full_info().uss for p in me.children()) / 2**20
    else:  # one call on the data, timed; its modules are imported first (the before-tree has no ssd.data.index)
        import contextlib
        if mode == "gate":
            from ssd.data.gate import load_training_data as run
        elif mode == "load":
            from ssd.data.load import load_dataset as run
        elif mode == "index":
            from ssd.data.index import index_dataset as run
        elif mode == "check":
            from ssd.cli import main
            import ssd.data.check, ssd.data.load
            run = lambda path: main(["check", path])
        else:
            from pycocotools.coco import COCO as run
        t = time.monotonic()
        with contextlib.redirect_stdout(sys.stderr):  # pycocotools prints; stdout carries the JSON answer
            result = run(data)
        out["seconds"] = time.monotonic() - t
        if mode == "check":
            out["code"] = result
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))
""")


def jpeg(seed: int, size: int = 96) -> bytes:
    image = Image.effect_noise((size, size), 40 + seed % 40).convert("RGB").rotate(seed % 360)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def make_pictures(folder: Path, count: int = 256) -> list[Path]:
    """``count`` distinct small JPEGs, written once: the sets copy them."""
    folder.mkdir(parents=True, exist_ok=True)
    pictures = [folder / f"{i}.jpg" for i in range(count)]
    for i, path in enumerate(pictures):
        path.write_bytes(jpeg(i))
    return pictures


def all_boxes(n: int) -> np.ndarray:
    """int64 ``[n, 8, 4]``: 8 boxes (x1, y1, x2, y2) in a 96 px image per image, varied by the image index."""
    i, j = np.arange(n)[:, None], np.arange(BOXES)[None, :]
    return np.stack([2 + (i + 7 * j) % 40, 3 + (3 * i + 11 * j) % 40, 50 + (i + j) % 40, 52 + (5 * i + j) % 40], -1)


def make_images(folder: Path, n: int, pictures: list[Path], stem: str = "img") -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"{stem}{i:07d}" for i in range(n)]
    for i, name in enumerate(names):
        shutil.copyfile(pictures[i % len(pictures)], folder / f"{name}.jpg")
    return names


def make_voc(root: Path, n: int, pictures: list[Path]) -> Path:
    names = make_images(root / "JPEGImages", n, pictures)
    (root / "Annotations").mkdir()
    for name, image_boxes in zip(names, all_boxes(n).tolist()):
        objects = "".join(f"<object><name>{NAMES[j % 3]}</name><difficult>0</difficult><bndbox><xmin>{x1}</xmin>"
                          f"<ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
                          for j, (x1, y1, x2, y2) in enumerate(image_boxes))
        (root / "Annotations" / f"{name}.xml").write_text(f"<annotation><filename>{name}.jpg</filename>{objects}"
                                                          "</annotation>")
    (root / "ImageSets" / "Main").mkdir(parents=True)
    val = max(1, n // 20)
    (root / "ImageSets" / "Main" / "train.txt").write_text("\n".join(names[val:]) + "\n")
    (root / "ImageSets" / "Main" / "val.txt").write_text("\n".join(names[:val]) + "\n")
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    return root


def make_yolo(root: Path, n: int, pictures: list[Path]) -> Path:
    val = max(1, n // 20)
    for split, count in (("train", n - val), ("val", val)):
        names = make_images(root / "images" / split, count, pictures)
        (root / "labels" / split).mkdir(parents=True)
        b = all_boxes(count) / 96
        rows = np.concatenate([np.arange(BOXES)[None, :, None].repeat(count, 0) % 3, (b[..., :2] + b[..., 2:]) / 2,
                               b[..., 2:] - b[..., :2]], -1)  # [count, 8, 5]: class cx cy w h
        for name, image_rows in zip(names, rows.tolist()):
            lines = [f"{int(c)} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}" for c, cx, cy, w, h in image_rows]
            (root / "labels" / split / f"{name}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: {NAMES}\n")
    return root / "data.yaml"


def scattered(i: int, count: int) -> list[tuple[int, int, int, int]]:
    """``count`` small boxes (x, y, w, h) spread over a 96 px image (rarely near-duplicates, as in real data)."""
    return [((7 * i + 13 * j) % 84, (3 * i + 29 * j) % 84, 4 + 5 * j % 9, 4 + 7 * j % 9) for j in range(count)]


def coco_json(names: list[str], per_image: int) -> dict:
    annotations = [{"id": len(names) * j + i, "image_id": i, "category_id": 1 + j % 3, "iscrowd": 0,
                    "bbox": list(box), "area": box[2] * box[3]}
                   for i in range(len(names)) for j, box in enumerate(scattered(i, per_image))]
    return {"images": [{"id": i, "file_name": f"{n}.jpg", "width": 96, "height": 96} for i, n in enumerate(names)],
            "annotations": annotations, "categories": [{"id": 1 + k, "name": n} for k, n in enumerate(NAMES)]}


def make_coco(root: Path, n: int, pictures: list[Path]) -> Path:
    names = make_images(root / "images", n, pictures)
    (root / "annotations").mkdir()
    val = max(1, n // 20)
    for split, part in (("train", names[val:]), ("val", names[:val])):
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(coco_json(part, BOXES)))
    return root


def run(mode: str, data: Path, src: Path, cache: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "SSD_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, str(data), *extra], env=env, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} {data} ({src}) failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def row(name: str, before: dict, cold: dict, warm: dict, key: str) -> str:
    b, c, w = before[key], cold[key], warm[key]
    return f"| {name} | {b:.2f} | {c:.2f} ({b / c:.2f}x) | {w:.2f} ({b / w:.1f}x) |"


def command_run(data: Path, cache: Path, log: Path, timeout: float) -> dict:
    """``ssd check data`` in a fresh process (its report to ``log``): wall seconds, peak RSS MB (``os.wait4``),
    exit code; killed after ``timeout`` seconds (code -9)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SSD_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    with open(log, "w") as out:
        start = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "ssd", "check", str(data)], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.monotonic() - start
        timer.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return {"seconds": seconds, "peak_rss_mb": usage.ru_maxrss / 1024, "code": proc.returncode}


def check_runs(root: Path, data: Path, images: int, timeout: float) -> None:
    """``ssd check`` cold (the index built) once, then warm 3 times (medians)."""
    cache = root / "cache-check"
    cold = command_run(data, cache, root / "check-cold.txt", timeout)
    warm = [command_run(data, cache, root / f"check-warm{i}.txt", timeout) for i in range(3)]
    print(f"`ssd check` on {images:,} VOC images of 96 px, {BOXES} boxes each (whole command, imports included)\n\n"
          "| | seconds | peak RSS MB | exit code |\n|---|---|---|---|")
    print(f"| cold (no index) | {cold['seconds']:.1f} | {cold['peak_rss_mb']:.0f} | {cold['code']} |")
    print(f"| warm (index present, median of 3) | {statistics.median(w['seconds'] for w in warm):.2f} | "
          f"{statistics.median(w['peak_rss_mb'] for w in warm):.0f} | {warm[-1]['code']} |")


def warm_starts(root: Path, sets: dict[str, Path], images: int) -> None:
    """The index built once per set (the cold gate, timed), then 3 warm gates and 3 warm ``ssd.train`` starts
    (medians), the train start split into imports, the time to the training loop (the gate, the model, the
    loaders) and the rest (starting 2 workers, the first step)."""
    print(f"{images:,} images of 96 px, {BOXES} boxes each: seconds (median of 3 warm runs)\n")
    print("| set | index built (cold gate) | warm gate | its peak RSS MB | warm ssd.train to the first step | imports |"
          " to the training loop | workers and first step |\n|---|---|---|---|---|---|---|---|")
    for name, data in sets.items():
        cache, project = root / f"cache-warm-{name}", str(root / "runs")
        cold = run("gate", data, REPO / "src", cache)
        gates = [run("gate", data, REPO / "src", cache) for _ in range(3)]
        trains = [run("train", data, REPO / "src", cache, project) for _ in range(3)]

        def median(results: list[dict], key: str) -> float:
            return statistics.median(r[key] for r in results)
        print(f"| {name} | {cold['seconds']:.1f} | {median(gates, 'seconds'):.2f} | {median(gates, 'peak_rss_mb'):.0f} "
              f"| {median(trains, 'first_step'):.1f} | {median(trains, 'imports'):.1f} | "
              f"{median(trains, 'train_start'):.1f} | "
              f"{median(trains, 'first_step') - median(trains, 'train_start'):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout of the code before the index (not with --warm)")
    parser.add_argument("--warm", action="store_true", help="only today's code: the index built, then warm starts")
    parser.add_argument("--check", action="store_true", help="only today's code: `ssd check` cold, then warm")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds each `ssd check` may run (--check)")
    parser.add_argument("--root", type=Path, default=Path(tempfile.gettempdir()) / "ssd-scale")
    parser.add_argument("--images", type=int, default=10_000)
    parser.add_argument("--annotations", type=int, default=1_000_000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["train", "memory", "gate", "check", "coco"])
    parser.add_argument("--sets", nargs="*", default=["voc", "yolo", "coco"], choices=["voc", "yolo", "coco"],
                        help="the formats timed from the start of ssd.train (default: all three)")
    args = parser.parse_args()
    if (args.before is not None) + args.warm + args.check != 1:
        parser.error("give one of --before DIR, --warm or --check")
    shutil.rmtree(args.root, ignore_errors=True)
    args.root.mkdir(parents=True)
    pictures = make_pictures(args.root / "pictures")
    makers = {"voc": make_voc, "yolo": make_yolo, "coco": make_coco}  # VOC: the gate and check; COCO's images: the JSON
    wanted = dict.fromkeys(["voc"] if args.check else ["voc", *args.sets] if args.warm else
                           ["voc", "coco", *args.sets])
    made = {name: makers[name](args.root / name, args.images, pictures) for name in wanted}
    sets = {name: made[name] for name in dict.fromkeys(["voc", *args.sets]) if name in made}
    if not args.warm and not args.check:
        sets["voc-tenth"] = make_voc(args.root / "voc-tenth", args.images // 10, pictures)
    past = 10**9 * (int(os.stat(pictures[0]).st_mtime) - 3600)  # the index never trusts files changed seconds ago
    for folder, _, files in os.walk(args.root):
        for name in files:
            os.utime(os.path.join(folder, name), ns=(past, past))
    if args.warm:
        return warm_starts(args.root, sets, args.images)
    if args.check:
        return check_runs(args.root, sets["voc"], args.images, args.timeout)
    after, before = REPO / "src", args.before / "src"
    print(f"{args.images:,} images of 96 px, {BOXES} boxes each; seconds (after: ratio before / after)\n")
    results: dict = {}
    for mode in ("train", "gate", "check"):
        if mode in args.skip:
            continue
        print(f"| {mode} | before | after, no index | after, index present |\n|---|---|---|---|")
        for name, data in sets.items():
            if mode != "train" and name != "voc":  # the gate and the check: VOC only, to bound the run
                continue
            cache = args.root / f"cache-{mode}-{name}"
            project = [str(args.root / "runs")] if mode == "train" else []
            b = run(mode, data, before, cache, *project)
            cold, warm = (run(mode, data, after, cache, *project) for _ in range(2))
            results[mode, name] = b, cold, warm
            print(row(f"{name} {'to first step' if mode == 'train' else ''}", b, cold, warm,
                      "first_step" if mode == "train" else "seconds"))
            print(row(f"{name} peak RSS MB", b, cold, warm, "peak_rss_mb"))
            if mode == "train":
                print(row(f"{name} PSS MB, trainer + 2 workers", b, cold, warm, "pss_mb"))
        print()
    if "memory" not in args.skip:  # the growth from a tenth of the images to all: per image, fixed costs apart
        print(f"| annotation memory per training image ({BOXES} boxes), bytes | trainer | 2 workers (unique) |"
              "\n|---|---|---|")
        for label, src in (("before", before), ("after, index present", after)):
            cache = args.root / f"cache-memory-{label[:5]}"
            small, large = (run("memory", sets[name], src, cache) for name in ("voc-tenth", "voc"))
            if label.startswith("after"):  # built, then measured from the index
                small, large = (run("memory", sets[name], src, cache) for name in ("voc-tenth", "voc"))
            images = large["items"] - small["items"]
            print(f"| {label} | {(large['trainer_mb'] - small['trainer_mb']) * 2**20 / images:,.0f} | "
                  f"{(large['workers_mb'] - small['workers_mb']) * 2**20 / images:,.0f} |")
    if "coco" not in args.skip:
        big = args.root / "coco" / "annotations" / "big_train.json"
        names = [f"img{i:07d}" for i in range(args.images - max(1, args.images // 20))]
        big.write_text(json.dumps(coco_json(names, args.annotations // len(names))))
        os.utime(big, ns=(past, past))
        cache = args.root / "cache-coco-big"
        print(f"\nCOCO JSON of {args.annotations:,} boxes ({big.stat().st_size / 2**20:.0f} MB): seconds, peak RSS MB")
        for label, mode, src in (("pycocotools.COCO", "pycocotools", after), ("load_dataset before", "load", before),
                                 ("load_dataset after", "load", after), ("index, no index", "index", after),
                                 ("index present", "index", after)):
            result = run(mode, big, src, cache)
            print(f"| {label} | {result['seconds']:.2f} | {result['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()

"""Aquarium from scratch at equal training time: this library's recipes against Ultralytics YOLOv8n (issue 18).

Every row trains from scratch for ``--minutes`` on ``$SSD_SHARED_DATA/aquarium`` (448 train images) and is scored on
its val split (127 images) by the same code: the ground truth is written once as a COCO json (image ids 1..N in
file-name order, category ids = the class ids 0..6 of data.yaml), each system's detections at confidence 0.001
(at most 100 per image, boxes in original pixels) as a COCO results json, and ``pycocotools``' ``COCOeval`` gives
mAP50 and mAP50-95 for both.

- ``ssd``: ``python -m ssd train --time MINUTES`` with the row's flags, then ``python -m ssd val --save-json`` on
  the val split (with the row's val flags, e.g. ``--tile auto``). Rows with the same training flags and seed share
  one training.
- ``yolov8n``: Ultralytics in its own virtualenv (``benchmarks/.venv-ultralytics``, made on first use:
  ``python -m venv``, then ``pip install -c constraints torch==2.14.1 torchvision==0.29.1 ultralytics``; never a
  project dependency), ``YOLO("yolov8n.yaml")`` (no pretrained weights), imgsz 320, ``time=`` the same budget,
  device cpu, ``amp=False``, ``plots=False``, ``YOLO_OFFLINE=1``; it reads a copy of the dataset made of links to
  the files in the output folder (its label caches go there; the script stops if the shared folder gained a file).

Each row: system, recipe, seed, budget, epochs done, train img/s (train images x epochs / the run's wall time,
validation included, the same rule for both), mAP50, mAP50-95, tiled. Printed as a markdown table and written to
``benchmarks/results/aquarium.csv`` (gitignored). The recipes are the data of :data:`ROWS`: add one there.

Run: ``.venv/bin/python benchmarks/aquarium.py [--minutes 8] [--rows ssd_tiny,yolov8n] [--seeds 0,1]
[--skip-peer] [--workers 2] [--out benchmarks/results]``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))
PEER_VENV = REPO / "benchmarks" / ".venv-ultralytics"
PEER_PACKAGES = ["torch==2.14.1", "torchvision==0.29.1", "ultralytics"]
CONF, IOU, MAX_DET = 0.001, 0.6, 100

# name -> system, the flags of training (ssd train) and of scoring (ssd val). Rows with the same training flags and
# seed share one training; each ablation is a row.
_TINY = ["--model", "ssd_tiny", "--amp", "--cache-images"]
_CROPS = [*_TINY, "--crop-scale", "native", "--augment", "light"]
ROWS: dict[str, dict[str, object]] = {
    "ssd_tiny": {"system": "ssd", "train": _TINY, "val": []},
    "ssd_tiny-tiled": {"system": "ssd", "train": _TINY, "val": ["--tile", "auto"]},
    "ssd_tiny-ema": {"system": "ssd", "train": [*_TINY, "--ema"], "val": []},
    "ssd_tiny-light": {"system": "ssd", "train": [*_TINY, "--augment", "light"], "val": []},
    "ssd_tiny-mosaic": {"system": "ssd", "train": [*_TINY, "--mosaic", "0.5"], "val": []},
    "ssd_tiny_fpn": {"system": "ssd", "train": ["--model", "ssd_tiny_fpn", *_TINY[2:]], "val": []},
    "crops": {"system": "ssd", "train": _CROPS, "val": []},
    "crops-tiled": {"system": "ssd", "train": _CROPS, "val": ["--tile", "auto"]},
    "crops-ema": {"system": "ssd", "train": [*_CROPS, "--ema"], "val": []},
    "crops-ema-tiled": {"system": "ssd", "train": [*_CROPS, "--ema"], "val": ["--tile", "auto"]},
    "yolov8n": {"system": "yolov8n", "train": [], "val": []},
}
COLUMNS = ["row", "system", "recipe", "seed", "minutes", "epochs", "train_img_s", "mAP50", "mAP50-95", "tiled"]

PEER_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from ultralytics import YOLO

    data, project, name, minutes, seed, workers, val_dir, out = sys.argv[1:]
    model = YOLO("yolov8n.yaml")
    model.train(data=data, imgsz=320, time=float(minutes) / 60, epochs=1000, device="cpu", workers=int(workers),
                seed=int(seed), amp=False, plots=False, pretrained=False, project=project, name=name,
                exist_ok=True, verbose=False)
    results = []
    images = sorted(p for p in Path(val_dir).iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
    for path in images:
        for r in model.predict(str(path), imgsz=320, conf=%(conf)r, iou=%(iou)r, max_det=%(max_det)d,
                               device="cpu", verbose=False):
            for (x1, y1, x2, y2), score, cls in zip(r.boxes.xyxy.tolist(), r.boxes.conf.tolist(),
                                                      r.boxes.cls.tolist()):
                results.append({"image_id": path.stem, "category_id": int(cls), "bbox": [x1, y1, x2 - x1, y2 - y1],
                                "score": score})
    Path(out).write_text(json.dumps(results))
""") % {"conf": CONF, "iou": IOU, "max_det": MAX_DET}


def ground_truth(data: Path, out: Path) -> tuple[Path, dict[str, int], int]:
    """The val split as a COCO json (written once): ``(path, image id of each file stem, train images)``."""
    from ssd.data import load_dataset

    spec = load_dataset(data)
    records = sorted(spec.records("val"), key=lambda r: r.path.name)
    ids = {r.path.stem: i + 1 for i, r in enumerate(records)}
    images, annotations = [], []
    for record in records:
        images.append({"id": ids[record.path.stem], "file_name": record.path.name, "width": record.width,
                       "height": record.height})
        for o in record.objects:
            x1, y1, x2, y2 = (float(v) for v in o.box)
            annotations.append({"id": len(annotations) + 1, "image_id": ids[record.path.stem], "category_id": o.label,
                                "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
    categories = [{"id": k, "name": name} for k, name in enumerate(spec.class_names)]
    path = out / "val_gt.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path, ids, len(spec.records("train"))


def score(gt_path: Path, ids: dict[str, int], results_path: Path) -> tuple[float, float]:
    """``(mAP50, mAP50-95)`` of a COCO results json whose image ids are file stems, by pycocotools' COCOeval."""
    import contextlib
    import io

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    detections = json.loads(results_path.read_text())
    for d in detections:
        d["image_id"] = ids[str(d["image_id"])]
    with contextlib.redirect_stdout(io.StringIO()):
        truth = COCO(str(gt_path))
        if not detections:
            return 0.0, 0.0
        evaluation = COCOeval(truth, truth.loadRes(detections), "bbox")
        evaluation.evaluate()
        evaluation.accumulate()
        evaluation.summarize()
    return float(evaluation.stats[1]), float(evaluation.stats[0])


def epochs_and_rate(results_csv: Path, train_images: int, time_key: str) -> tuple[int, float]:
    """Epochs in a results.csv and train images x epochs / its last cumulative ``time_key`` (seconds)."""
    with results_csv.open() as f:
        rows = [{k.strip(): v for k, v in row.items()} for row in csv.DictReader(f)]
    seconds = float(rows[-1][time_key])
    return len(rows), train_images * len(rows) / seconds


def run(cmd: list[str], **kwargs) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kwargs)


def ssd_row(name: str, row: dict, seed: int, args, gt: tuple, trained: dict) -> dict:
    data, out = SHARED / "aquarium" / "data.yaml", args.out
    key = (tuple(row["train"]), seed)
    if key not in trained:
        run_name = f"{name}-s{seed}"
        run([sys.executable, "-m", "ssd", "train", "--data", str(data), "--time", str(args.minutes), "--seed",
             str(seed), "--device", "cpu", "--workers", str(args.workers), "--quiet", "--project", str(out / "runs"),
             "--name", run_name, "--exist-ok", *row["train"]])
        trained[key] = out / "runs" / run_name
    run_dir = trained[key]
    results = out / f"{name}-s{seed}.json"
    run([sys.executable, "-m", "ssd", "val", "--weights", str(run_dir), "--data", str(data), "--split", "val",
         "--metric", "coco", "--device", "cpu", "--conf", str(CONF), "--max-det", str(MAX_DET), "--save-json",
         str(results), "--no-save", *row["val"]])
    epochs, rate = epochs_and_rate(run_dir / "results.csv", gt[2], "time")
    return {"epochs": epochs, "train_img_s": rate, "results": results, "tiled": "--tile" in row["val"]}


def peer_python() -> Path:
    """The Ultralytics virtualenv's interpreter, made on first use."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        run([sys.executable, "-m", "venv", str(PEER_VENV)])
    constraints = PEER_VENV / "constraints.txt"
    constraints.write_text("\n".join(PEER_PACKAGES[:2]) + "\n")
    probe = subprocess.run([str(python), "-c", "import ultralytics"], capture_output=True)
    if probe.returncode != 0:
        run([str(python), "-m", "pip", "install", "-q", "-c", str(constraints), *PEER_PACKAGES])
    return python


def peer_data(out: Path) -> Path:
    """A data.yaml over a copy of the dataset made of links to each shared image and label file: Ultralytics
    resolves the split folders (a linked folder would lead it back to the shared data) and writes its label caches
    next to them, here in ``out``."""
    root = out / "yolo-data"
    for split in ("train", "valid"):
        for part in ("images", "labels"):
            folder = root / split / part
            folder.mkdir(parents=True, exist_ok=True)
            for source in (SHARED / "aquarium" / split / part).iterdir():
                if not (folder / source.name).is_symlink():
                    (folder / source.name).symlink_to(source)
    names = json.dumps(["fish", "jellyfish", "penguin", "puffin", "shark", "starfish", "stingray"])
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: train/images\nval: valid/images\nnc: 7\nnames: {names}\n")
    return yaml


def shared_files() -> set[Path]:
    return set((SHARED / "aquarium").rglob("*"))


def yolo_row(name: str, row: dict, seed: int, args, gt: tuple, trained: dict) -> dict:
    out = args.out
    script = out / "peer_yolo.py"
    script.write_text(PEER_SCRIPT)
    results = out / f"{name}-s{seed}.json"
    run_name = f"{name}-s{seed}"
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(out / "yolo-config"), "OMP_NUM_THREADS":
           os.environ.get("OMP_NUM_THREADS", str(os.cpu_count()))}
    before = shared_files()
    run([str(peer_python()), str(script), str(peer_data(out)), str(out / "yolo-runs"), run_name, str(args.minutes),
         str(seed), str(args.workers), str(out / "yolo-data" / "valid" / "images"), str(results)], env=env)
    added = shared_files() - before
    if added:
        sys.exit(f"Ultralytics wrote into the shared dataset: {', '.join(map(str, sorted(added)))}; remove them")
    epochs, rate = epochs_and_rate(out / "yolo-runs" / run_name / "results.csv", gt[2], "time")
    return {"epochs": epochs, "train_img_s": rate, "results": results, "tiled": False}


SYSTEMS = {"ssd": ssd_row, "yolov8n": yolo_row}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=8.0, help="training budget of every row (default 8)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated rows of ROWS (default all: "
                        f"{', '.join(ROWS)})")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    parser.add_argument("--skip-peer", action="store_true", help="leave out the yolov8n rows")
    parser.add_argument("--workers", type=int, default=2, help="data loading workers of both systems (default 2)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results", help="output folder")
    args = parser.parse_args()
    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        parser.error(f"unknown rows {', '.join(unknown)}; the rows are {', '.join(ROWS)}")
    if args.skip_peer:
        names = [n for n in names if ROWS[n]["system"] != "yolov8n"]
    args.out.mkdir(parents=True, exist_ok=True)
    gt = ground_truth(SHARED / "aquarium" / "data.yaml", args.out)
    table, trained = [], {}
    for seed in (int(s) for s in args.seeds.split(",")):
        for name in names:
            row = ROWS[name]
            got = SYSTEMS[row["system"]](name, row, seed, args, gt, trained)
            map50, map5095 = score(gt[0], gt[1], got["results"])
            table.append({"row": name, "system": row["system"], "recipe": " ".join(row["train"] + row["val"]) or "-",
                          "seed": seed, "minutes": args.minutes, "epochs": got["epochs"],
                          "train_img_s": f"{got['train_img_s']:.1f}", "mAP50": f"{map50:.4f}",
                          "mAP50-95": f"{map5095:.4f}", "tiled": "yes" if got["tiled"] else "no"})
    with (args.out / "aquarium.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(table)
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    for line in table:
        print("| " + " | ".join(str(line[c]) for c in COLUMNS) + " |")
    print(f"written: {args.out / 'aquarium.csv'}")


if __name__ == "__main__":
    main()

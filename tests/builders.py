"""What the tests build: small datasets in each format (``make_dataset``), the tiny training preset
(``TINY_TRAIN``), random-init models that detect something, random images and synthetic detections. tests/ is on
the path as for conftest: ``from builders import make_dataset, TINY_TRAIN``."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw
from torch import nn

from ssd.data.synthetic import generate_synthetic
from ssd.models import build_model

# ssd_tiny at 64 px, no augmentation, no figures, one process on the CPU: seconds per epoch of a 16-image dataset
TINY_TRAIN = dict(model="ssd_tiny", image_size=64, batch_size=8, workers=0, device="cpu", quiet=True, augment="none",
                  num_plot_images=0, seed=0)


def make_dataset(fmt: str, root: Path, *, train: int = 12, val: int = 4, size: int = 96, classes: int = 6,
                 boxes: int | None = None, seed: int = 0, bad_label: bool = False) -> Path:
    """A dataset of square ``size`` px images under ``root``: ``train`` / ``val`` images, ``classes`` classes.

    ``voc``: the synthetic shapes of ``ssd.data.synthetic`` (seeded by ``seed``, 1..``boxes`` objects an image,
    default 6); returns ``root``.
    ``yolo`` and ``coco``: ``boxes`` (default 2) coloured squares an image on grey, label ``(i + 3 j) % classes``
    for box j of image i, classes named a, b, c...; ``bad_label`` gives the sixth train image one more object of
    label ``classes`` (out of range; COCO: category id K + 1, not listed). Returns the YOLO data.yaml, or the COCO
    ``root`` (annotations/instances_<split>.json, category ids 1..K, image ids from 1 in each split).
    """
    if fmt == "voc" and bad_label:
        raise ValueError("bad_label is for yolo and coco")
    if fmt == "voc":
        return generate_synthetic(root, num_train=train, num_val=val, image_size=size, num_classes=classes,
                                  seed=seed, max_objects=6 if boxes is None else boxes)
    names = [chr(ord("a") + k) for k in range(classes)]
    splits = {split: [_squares(i, size, classes, 2 if boxes is None else boxes) for i in range(count)]
              for split, count in (("train", train), ("val", val))}
    if fmt == "yolo":
        return _write_yolo(root, splits, names, bad_label)
    if fmt == "coco":
        return _write_coco(root, splits, names, bad_label)
    raise ValueError(f"unknown dataset format {fmt!r}: voc, yolo or coco")


def _squares(i: int, size: int, classes: int, boxes: int) -> tuple[Image.Image, list[tuple[int, tuple]]]:
    """Image ``i`` of the square scenes and its ``(label, (x1, y1, x2, y2))`` objects in pixels (x2, y2 exclusive)."""
    image = Image.new("RGB", (size, size), (90, 90, 90))
    draw = ImageDraw.Draw(image)
    objects = []
    for j in range(boxes):
        label = (i + 3 * j) % classes
        x, y, s = round((10 + 40 * j) * size / 96), round((15 + 3 * i) * size / 96), round(30 * size / 96)
        draw.rectangle([x, y, x + s - 1, y + s - 1], fill=(40 * label, 255 - 40 * label, 120))
        objects.append((label, (x, y, x + s, y + s)))
    return image, objects


def _write_yolo(root: Path, splits: dict, names: list[str], bad_label: bool) -> Path:
    for split, scenes in splits.items():
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for i, (image, objects) in enumerate(scenes):
            w, h = image.size
            lines = [f"{label} {(x1 + x2) / 2 / w:.5f} {(y1 + y2) / 2 / h:.5f} {(x2 - x1) / w:.5f} {(y2 - y1) / h:.5f}"
                     for label, (x1, y1, x2, y2) in objects]
            if bad_label and split == "train" and i == 5:
                lines.append(f"{len(names)} 0.5 0.5 0.2 0.2")
            image.save(root / "images" / split / f"img{i}.jpg")
            (root / "labels" / split / f"img{i}.txt").write_text("\n".join(lines) + "\n")
    (root / "data.yaml").write_text(
        f"path: {root}\ntrain: images/train\nval: images/val\nnames: [{', '.join(names)}]\n")
    return root / "data.yaml"


def _write_coco(root: Path, splits: dict, names: list[str], bad_label: bool) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    categories = [{"id": k + 1, "name": name} for k, name in enumerate(names)]
    for split, scenes in splits.items():
        images, annotations = [], []
        for i, (image, objects) in enumerate(scenes, start=1):
            image.save(root / "images" / f"{split}{i}.jpg")
            images.append({"id": i, "file_name": f"{split}{i}.jpg", "width": image.width, "height": image.height})
            for label, (x1, y1, x2, y2) in objects:
                annotations.append({"id": len(annotations) + 1, "image_id": i, "category_id": label + 1,
                                    "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1), "iscrowd": 0})
            if bad_label and split == "train" and i == 6:  # the sixth image, as in YOLO: image ids start at 1
                annotations.append({**annotations[-1], "id": len(annotations) + 1, "category_id": len(names) + 1})
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    return root


def biased_model(name: str, num_classes: int = 3, seed: int = 0, **options) -> nn.Module:
    """A random-init model whose class logits are biased towards objects, so that it detects something."""
    torch.manual_seed(seed)
    model = build_model(name, num_classes=num_classes, **options).eval()
    with torch.no_grad():
        for head in model.heads:
            conv = [m for m in head.cls.modules() if isinstance(m, nn.Conv2d)][-1]
            bias = conv.bias.view(-1, num_classes + 1)  # [A, K+1], index 0 background
            bias[:, 1:] += torch.linspace(1.5, 0.5, num_classes)
    return model


def random_images(count: int, seed: int = 1) -> list[torch.Tensor]:
    """``count`` seeded random ``uint8 [3, H, W]`` images of four sizes in turn."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [(120, 160), (90, 70), (64, 64), (100, 130)]
    return [torch.randint(0, 256, (3, *sizes[i % 4]), dtype=torch.uint8, generator=generator) for i in range(count)]


def jittered_detections(ground_truths: list[dict], num_classes: int, seed: int = 0) -> list[dict]:
    """Synthetic detections of per-image ground truths (no model needed): each object found once with its box
    jittered by up to 20% of its size, some with a wrong label, plus one random false positive per image; scores
    uniform in [0, 1] so every threshold and IoU level of a metric is exercised."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for truth in ground_truths:
        boxes = truth["boxes"].float()
        n = boxes.shape[0]
        size = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
        jittered = boxes + (torch.rand(n, 4, generator=g) - 0.5) * 0.4 * size
        relabel = torch.rand(n, generator=g) < 0.1
        labels = torch.where(relabel, torch.randint(0, num_classes, (n,), generator=g), truth["labels"])
        h, w = truth.get("image_size", (512, 512))
        corner = torch.rand(1, 2, generator=g) * torch.tensor([w, h]) * 0.8
        false_positive = torch.cat([corner, corner + torch.tensor([w, h]) * 0.1], dim=1)
        out.append({"boxes": torch.cat([jittered, false_positive]),
                    "labels": torch.cat([labels, torch.randint(0, num_classes, (1,), generator=g)]),
                    "scores": torch.rand(n + 1, generator=g)})
    return out


def write_image(path: Path, width: int, height: int) -> Path:
    """A plain ``width x height`` RGB image at ``path`` (its folder made), in the format of its suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (width, height), (120, 30, 200)).save(path)
    return path


def make_yolo_folder(root: Path, count: int, splits=("train",)) -> Path:
    """A YOLO folder of ``count`` 64 px images per split (``<split>/images/<split><i>.png``, one box each) and
    ``classes.txt`` (``circle``): the plain layout whose file names tests assert."""
    for split in splits:
        images, labels = root / split / "images", root / split / "labels"
        images.mkdir(parents=True)
        labels.mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (64, 64), (i, 20, 30)).save(images / f"{split}{i}.png")
            (labels / f"{split}{i}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    (root / "classes.txt").write_text("circle\n")
    return root


# Installed first in the subprocess: any import of torch or torchvision fails, as on a machine without them.
NO_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchvision"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def run_without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess:
    """``code`` run by Python in ``cwd`` on this tree's sources, where importing torch fails (:data:`NO_TORCH`)."""
    src = Path(__file__).resolve().parents[1] / "src"
    return subprocess.run([sys.executable, "-c", NO_TORCH + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})


def write_png_images(folder: Path) -> Path:
    """Three seeded random RGB images of three sizes, ``folder/images/im{0,1,2}.png``; returns ``folder/images``."""
    images = folder / "images"
    images.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for index, (h, w) in enumerate([(96, 160), (128, 128), (200, 150)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / f"im{index}.png")
    return images


def predicts_as_pytorch_without_it(weights: Path, folder: Path, conf: float) -> str:
    """Assert that `ssd predict` and `ssd.load(weights).predict` on ``folder/images/*.png``, in a process where torch
    cannot be imported (it must stay out), agree with each other and with the PyTorch path here (:func:`assert_twins`).
    Returns the process's stderr."""
    import ssd

    project = f"runs-{Path(weights).name}"
    code = f"""
        import glob, json
        import ssd
        from ssd.cli import main

        code = main(["predict", "--weights", {str(weights)!r}, "--source", "images", "--project", {project!r},
                     "--conf", "{conf}", "--quiet"])
        results = ssd.load({str(weights)!r}).predict(sorted(glob.glob("images/*.png")), score_threshold={conf})
        print(json.dumps({{"code": code, "torch": "torch" in sys.modules, "api": [r.to_dict() for r in results]}}))
    """
    done = run_without_torch(code, folder)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["torch"] is False
    lines = (folder / project / "exp" / "predictions.jsonl").read_text().splitlines()
    cli = sorted((json.loads(line) for line in lines), key=lambda r: r["file"])
    expected = ssd.load(weights).predict(sorted((folder / "images").glob("*.png")), score_threshold=conf)
    assert [r["file"] for r in cli] == [f"images/im{i}.png" for i in range(3)]
    for from_cli, from_api, torch_result in zip(cli, report["api"], expected):
        assert from_cli["detections"] == from_api["detections"]  # one path, two front ends
        assert (from_api["width"], from_api["height"]) == (torch_result.width, torch_result.height)
        assert_twins(from_api["detections"], torch_result)
    return done.stderr


def assert_twins(got: list[dict], expected) -> None:
    """Detections ``got`` (``Result.to_dict()["detections"]``) are those of the :class:`Result` ``expected`` (the
    PyTorch path) to within 0.01 in score and a pixel in box: near-equal scores may swap places, so each box has its
    twin (same label) on the other side, but for those that compete with a score 0.01 away for the last of the 100
    places (``max_det``)."""
    assert len(got) == len(expected.scores) > 0
    scores = np.array([d["score"] for d in got])
    assert np.abs(scores - expected.scores.numpy()).max() < 0.01
    boxes, labels = np.array([d["box"] for d in got]), np.array([d["label"] for d in got])
    twins = np.abs(boxes[:, None] - expected.boxes.numpy()[None]).max(-1) < 1.0
    twins &= labels[:, None] == expected.labels.numpy()[None]
    sure = scores > scores[-1] + 0.01 if len(scores) == 100 else np.ones(len(scores), bool)
    assert sure.sum() >= 5 and twins.any(1)[sure].all() and twins.any(0)[sure].all()

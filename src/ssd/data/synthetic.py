"""A deterministic synthetic detection dataset in Pascal VOC format: coloured shapes on textured backgrounds.

``generate_synthetic(root, num_train=..., num_val=..., image_size=..., num_classes=..., seed=...)`` writes
``root/{JPEGImages,Annotations,ImageSets/Main/{train,val}.txt,classes.txt}`` and returns ``root``; ``load_dataset``
reads it back through the real VOC reader. Class ``k`` is the shape ``SHAPE_NAMES[k]``, drawn in a colour close to
its own hue. Each image holds 1..``max_objects`` shapes with sides from about 6% to 60% of the image and aspect
ratios from 1:2.5 to 2.5:1; shapes may overlap a little and may be cut by the image border. The same arguments give
byte-identical files (each image draws from its own ``numpy`` generator seeded by ``(seed, index)``).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ssd.errors import ConfigError

__all__ = ["SHAPE_NAMES", "generate_synthetic"]

SHAPE_NAMES = ("circle", "square", "triangle", "star", "diamond", "cross", "hexagon", "ring", "arrow", "trapezoid")

# Fully saturated class colours (RGB); objects jitter around them. Backgrounds are kept muted for contrast.
_COLOURS = ((230, 40, 40), (40, 90, 235), (250, 210, 30), (40, 200, 60), (200, 60, 220), (250, 130, 20),
            (30, 210, 220), (245, 245, 245), (120, 60, 20), (20, 20, 20))


def _unit_polygon(name: str) -> list[tuple[float, float]] | None:
    """Vertices of ``name`` scaled so they touch all four sides of the unit box (None for ellipses)."""
    if name == "square":
        pts = [(0, 0), (1, 0), (1, 1), (0, 1)]
    elif name == "triangle":
        pts = [(0.5, 0), (1, 1), (0, 1)]
    elif name == "diamond":
        pts = [(0.5, 0), (1, 0.5), (0.5, 1), (0, 0.5)]
    elif name == "star":
        pts = [(math.cos(a) * r, math.sin(a) * r) for i in range(10)
               for a, r in [(-math.pi / 2 + i * math.pi / 5, 1.0 if i % 2 == 0 else 0.45)]]
    elif name == "hexagon":
        pts = [(math.cos(i * math.pi / 3), math.sin(i * math.pi / 3)) for i in range(6)]
    elif name == "cross":
        a, b = 1 / 3, 2 / 3
        pts = [(a, 0), (b, 0), (b, a), (1, a), (1, b), (b, b), (b, 1), (a, 1), (a, b), (0, b), (0, a), (a, a)]
    elif name == "arrow":
        pts = [(0, 0.3), (0.55, 0.3), (0.55, 0), (1, 0.5), (0.55, 1), (0.55, 0.7), (0, 0.7)]
    elif name == "trapezoid":
        pts = [(0.25, 0), (0.75, 0), (1, 1), (0, 1)]
    else:
        return None
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    return [((x - min(xs)) / (max(xs) - min(xs)), (y - min(ys)) / (max(ys) - min(ys))) for x, y in pts]


_POLYGONS = {name: _unit_polygon(name) for name in SHAPE_NAMES}


def _background(rng: np.random.Generator, size: int) -> Image.Image:
    """A muted texture: smooth low-frequency colour noise, optional stripes, fine grain."""
    coarse = rng.uniform(60, 190, size=(rng.integers(2, 7), rng.integers(2, 7), 1))
    tint = rng.uniform(-25, 25, size=(1, 1, 3))
    low = Image.fromarray(np.clip(coarse + tint, 0, 255).astype(np.uint8)).resize((size, size), Image.BICUBIC)
    img = np.asarray(low, dtype=np.float32)
    if rng.random() < 0.5:
        period, angle = rng.uniform(6, 40), rng.uniform(0, math.pi)
        yy, xx = np.mgrid[0:size, 0:size]
        img = img + 18 * np.sin((xx * math.cos(angle) + yy * math.sin(angle)) * 2 * math.pi / period)[..., None]
    img = img + rng.normal(0, 8, size=(size, size, 1))
    return Image.fromarray(np.clip(img, 0, 255).astype(np.uint8))


def _overlaps_too_much(box: tuple[int, int, int, int], placed: list[tuple[int, int, int, int]]) -> bool:
    """Reject boxes hiding more than 35% of an earlier object or with IoU > 0.3 against one."""
    x1, y1, x2, y2 = box
    area = (x2 - x1) * (y2 - y1)
    for a1, b1, a2, b2 in placed:
        inter = max(0, min(x2, a2) - max(x1, a1)) * max(0, min(y2, b2) - max(y1, b1))
        other = (a2 - a1) * (b2 - b1)
        if inter > 0.35 * other or inter > 0.3 * (area + other - inter):
            return True
    return False


def _draw(draw: ImageDraw.ImageDraw, name: str, box: tuple[int, int, int, int], colour: tuple[int, ...]) -> None:
    """Draw ``name`` filling the unclipped pixel box ``[x1, x2) x [y1, y2)``."""
    x1, y1, x2, y2 = box
    w, h = x2 - x1 - 1, y2 - y1 - 1
    if name == "circle":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], fill=colour)
    elif name == "ring":
        draw.ellipse([x1, y1, x2 - 1, y2 - 1], outline=colour, width=max(2, round(0.18 * min(w, h))))
    else:
        draw.polygon([(x1 + u * w, y1 + v * h) for u, v in _POLYGONS[name]], fill=colour)


def _make_image(rng: np.random.Generator, size: int, num_classes: int, max_objects: int):
    image = _background(rng, size)
    draw = ImageDraw.Draw(image)
    objects, placed = [], []
    for _ in range(int(rng.integers(1, max_objects + 1))):
        for _attempt in range(20):
            side = size * math.exp(rng.uniform(math.log(0.06), math.log(0.6)))
            ratio = math.exp(rng.uniform(-math.log(2.5), math.log(2.5)))
            w = max(4, min(round(side * math.sqrt(ratio)), round(0.95 * size)))
            h = max(4, min(round(side / math.sqrt(ratio)), round(0.95 * size)))
            x1 = int(rng.integers(-(w // 4), size - w + w // 4 + 1))  # up to a quarter outside the image
            y1 = int(rng.integers(-(h // 4), size - h + h // 4 + 1))
            visible = (max(x1, 0), max(y1, 0), min(x1 + w, size), min(y1 + h, size))
            if not _overlaps_too_much(visible, placed):
                break
        else:
            continue
        label = int(rng.integers(num_classes))
        colour = tuple(int(np.clip(c + rng.integers(-30, 31), 0, 255)) for c in _COLOURS[label])
        _draw(draw, SHAPE_NAMES[label], (x1, y1, x1 + w, y1 + h), colour)
        placed.append(visible)
        objects.append((SHAPE_NAMES[label], visible))
    return image, objects


def _voc_xml(filename: str, size: int, objects) -> str:
    parts = [f"<annotation>\n  <folder>JPEGImages</folder>\n  <filename>{filename}</filename>\n"
             f"  <size><width>{size}</width><height>{size}</height><depth>3</depth></size>\n"]
    for name, (x1, y1, x2, y2) in objects:  # VOC stores 1-based pixel indices: x1 + 1 .. x2 + 1 (see voc.py)
        parts.append(f"  <object><name>{name}</name><difficult>0</difficult><bndbox><xmin>{x1 + 1}</xmin>"
                     f"<ymin>{y1 + 1}</ymin><xmax>{x2 + 1}</xmax><ymax>{y2 + 1}</ymax></bndbox></object>\n")
    parts.append("</annotation>\n")
    return "".join(parts)


def generate_synthetic(root: str | Path, *, num_train: int = 400, num_val: int = 100, image_size: int = 256,
                       num_classes: int = 3, seed: int = 0, max_objects: int = 6, quality: int = 95) -> Path:
    """Write the synthetic VOC dataset to ``root`` and return ``root``.

    Args:
        root: output folder (created); existing files with the same names are overwritten.
        num_train: images in the ``train`` split (ids ``synth_000000``... first).
        num_val: images in the ``val`` split (ids following those of ``train``).
        image_size: square image side in pixels.
        num_classes: K, using the first K of :data:`SHAPE_NAMES` (at most ``len(SHAPE_NAMES)``).
        seed: the same seed (and arguments) gives identical files.
        max_objects: each image has 1..max_objects shapes (fewer when they cannot be placed without heavy overlap).
        quality: JPEG quality.
    """
    if not 1 <= num_classes <= len(SHAPE_NAMES):
        raise ConfigError(f"num_classes must be 1..{len(SHAPE_NAMES)} (one per shape in SHAPE_NAMES), "
                          f"got {num_classes}")
    if image_size < 32:
        raise ConfigError(f"image_size must be at least 32 pixels, got {image_size}")
    root = Path(root)
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "classes.txt").write_text("\n".join(SHAPE_NAMES[:num_classes]) + "\n")
    ids = [f"synth_{i:06d}" for i in range(num_train + num_val)]
    for index, image_id in enumerate(ids):
        rng = np.random.default_rng([seed, index])
        image, objects = _make_image(rng, image_size, num_classes, max_objects)
        image.save(root / "JPEGImages" / f"{image_id}.jpg", quality=quality)
        (root / "Annotations" / f"{image_id}.xml").write_text(_voc_xml(f"{image_id}.jpg", image_size, objects))
    (root / "ImageSets/Main/train.txt").write_text("".join(f"{i}\n" for i in ids[:num_train]))
    (root / "ImageSets/Main/val.txt").write_text("".join(f"{i}\n" for i in ids[num_train:]))
    return root

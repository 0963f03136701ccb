"""``ssd data browse``: one HTML page of a dataset (:mod:`ssd.data.commands.browse_page`): thumbnails with their boxes,
the images ``ssd check`` flags first with its messages, per-class counts, histograms of box sizes and aspect ratios,
and (``batches``) training batches as the trainer builds them (:func:`ssd.training.preview.training_batches`)."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image

from ssd.data.check import find_issues
from ssd.data.commands.browse_page import Thumb, histogram, render_page
from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord
from ssd.errors import ImageError
from ssd.files import check_output, write_text

__all__ = ["browse_dataset", "batch_thumbs"]

_SIDE = 200  # thumbnail side in pixels: small enough that 200 of them keep the page a few MB


def _data_url(image: Image.Image) -> str:
    image.thumbnail((_SIDE, _SIDE))
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, "JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _placeholder(caption: str, issues: list[str]) -> Thumb:
    """A grey picture in place of an image that cannot be shown, with why."""
    return Thumb(_data_url(Image.new("RGB", (_SIDE, _SIDE // 2), (200, 200, 200))), _SIDE, _SIDE // 2, caption, [],
                 issues)


def _thumb(record: ImageRecord, split: str, issues: list[str]) -> Thumb:
    caption = f"{split}: {record.path.name}"
    try:
        pixels = read_image(record.path, min_size=_SIDE)  # the guarded decoder, EXIF applied (the boxes' frame)
    except (ImageError, OSError) as e:
        return _placeholder(caption, [*issues, f"not shown: {e}"])
    image = Image.fromarray(pixels.permute(1, 2, 0).numpy())
    width, height = record.width or image.width, record.height or image.height  # a reduced JPEG decode: full frame
    boxes = [(*o.box, o.label) for o in record.objects]
    return Thumb(_data_url(image), width, height, caption, boxes, issues)


def batch_thumbs(batches: Sequence[dict], mean: Sequence[float], std: Sequence[float]) -> list[Thumb]:
    """The images of :func:`ssd.data.loader.collate` batches (normalized ``[B, 3, H, W]``, boxes ``[B, G, 4]``
    normalized xyxy, labels ``[B, G]`` with -1 padding) as thumbnails with their boxes in the network input's
    pixels."""
    thumbs = []
    m, s = torch.tensor(mean).view(3, 1, 1), torch.tensor(std).view(3, 1, 1)
    for b, batch in enumerate(batches):
        for i, image in enumerate(batch["images"]):
            height, width = image.shape[-2:]
            pixels = ((image.float() * s + m).clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
            keep = batch["labels"][i] >= 0
            boxes = [(x1 * width, y1 * height, x2 * width, y2 * height, int(k)) for (x1, y1, x2, y2), k in
                     zip(batch["boxes"][i][keep].tolist(), batch["labels"][i][keep].tolist())]
            thumbs.append(Thumb(_data_url(Image.fromarray(pixels)), width, height,
                                f"batch {b + 1} image {i + 1}: {Path(batch['paths'][i]).name}", boxes))
    return thumbs


def _box_stats(spec: DatasetSpec, records: list[ImageRecord]) -> tuple[list[tuple[int, int]], list[float],
                                                                        list[float]]:
    counts = [[0, 0] for _ in spec.class_names]
    sides, aspects = [], []
    for record in records:
        for k in {o.label for o in record.objects if 0 <= o.label < spec.num_classes}:
            counts[k][1] += 1
        for o in record.objects:
            if 0 <= o.label < spec.num_classes:
                counts[o.label][0] += 1
            w, h = o.box[2] - o.box[0], o.box[3] - o.box[1]
            if w > 0 and h > 0 and record.width and record.height:
                sides.append(math.sqrt(w * h / (record.width * record.height)))
                aspects.append(math.log2(w / h))
    return [tuple(c) for c in counts], sides, aspects


def browse_dataset(source: str | Path, output: str | Path = "browse.html", split: str | None = None,
                   limit: int = 200, batches: Sequence[Thumb] = ()) -> Path:
    """Write the page of ``source`` (its ``split``, else every split) to ``output``: at most ``limit`` thumbnails,
    the images with problems first; ``batches``: augmented training images (:func:`batch_thumbs`)."""
    spec = load_dataset(source, split=split)
    output = check_output(output, inputs=[source, *spec.input_files()], what="--output")
    splits = list(spec.splits)
    problems: dict[Path, list[str]] = {}
    for issue in find_issues(spec, splits, decode_images=True):
        if issue.image is not None:
            problems.setdefault(Path(issue.image), []).append(f"{issue.severity}: {issue.message}")
    every, seen = [], set()
    for s in splits:  # an image in two splits (VOC's trainval) once, under the first
        every += [(s, r) for r in spec.splits[s] if r.path not in seen and not seen.add(r.path)]
    every.sort(key=lambda item: item[1].path not in problems)  # stable: flagged first, then the dataset's order
    unread = sorted(set(problems) - {r.path for _, r in every})  # images a reader could not take: shown, not hidden
    thumbs = [_placeholder(f"{path.name}", problems[path]) for path in unread[:limit]]
    thumbs += [_thumb(r, s, problems.get(r.path, [])) for s, r in every[:limit - len(thumbs)]]
    counts, sides, aspects = _box_stats(spec, [r for _, r in every])
    summary = (f"{spec.format}, {', '.join(f'{s}: {len(spec.splits[s])} images' for s in splits)} ({len(every)} "
               f"different); "
               f"{len(problems)} image(s) flagged by ssd check; {len(thumbs)} shown")
    page = render_page(f"ssd data browse: {spec.root}", summary, spec.class_names, counts,
                       histogram(sides, 0, 1, 20), histogram(aspects, -4, 4, 16), thumbs, list(batches))
    return write_text(output, page)

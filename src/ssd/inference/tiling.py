"""Tiled prediction for images much larger than the network input (``ssd predict --tile``, ``ssd val --tile``).

A large photo resized to a 256 or 300 px input shrinks its small objects below what the default boxes can match.
:func:`detect_tiled` also runs the detector on overlapping tiles of the original pixels, so that each tile reaches
the network at (about) its own scale, and merges everything back:

1. Crops: the whole image (always: it finds the objects larger than a tile) plus the tiles of
   :func:`tile_windows` (side ``tile`` pixels, neighbours overlapping by at least ``overlap`` of a tile, the last
   tile of a row or column ending exactly on the image border). An image that one tile covers is not tiled.
2. Every crop goes through the caller's ``detect`` function (the one inference pipeline: preprocess,
   :func:`~ssd.detect.detect_batch`), ``batch_size`` crops at a time; its pixel boxes are shifted by the
   tile's origin into pixels of the image.
3. Merge, vectorized over the images: class-wise NMS (``torchvision.ops.batched_nms``, per image and class) over all
   crops, which turns the copies of an object found by overlapping tiles into one box.
4. Cut boxes: a tile box with an edge within :data:`EDGE_MARGIN` network-input pixels of an *interior* tile border
   (one that is not the image border) is "cut": it probably holds part of an object that continues in the
   neighbouring tile. A cut box is dropped when a box of the same class that is not cut (from the whole image or
   another tile), with a score at least :data:`CUT_SCORE_RATIO` times its own, holds the whole object: it overlaps
   the cut box above the NMS IoU threshold (NMS ranks cut boxes by ``CUT_SCORE_RATIO`` times their score, so the
   whole box wins) or, after NMS, covers at least :data:`CUT_COVER` of its area (a small part of a large object
   has a small IoU with it). Otherwise the cut box is kept: a part is better than nothing (an object cut in every
   tile and too small for the whole-image pass is found only as parts; NMS keeps the best of them). Kept boxes
   keep their own scores.
5. The ``max_detections`` highest scores of each image (:func:`ssd.postprocess.first_per_image`, as post-processing).

``tile="auto"`` (:func:`tile_shape`) tiles an image only when it is more than :data:`AUTO_FACTOR` times the network
input along a side, with tiles of the input's own size (a tile maps 1:1 onto the input).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torchvision.ops import batched_nms, box_area

from ssd.errors import ConfigError
from ssd.limits import MAX_TILES_PER_IMAGE
from ssd.postprocess import first_per_image
from ssd.schemas import PredictConfig
from ssd.settings import PREDICT, TILE_OVERLAP, check_tile
from ssd.sizes import as_hw

__all__ = ["AUTO_FACTOR", "CUT_COVER", "CUT_SCORE_RATIO", "EDGE_MARGIN", "detect_tiled", "tile_shape", "tile_windows"]

AUTO_FACTOR = 2.0  # tile="auto" tiles an image more than this many times the network input along a side
EDGE_MARGIN = 2.0  # network-input pixels: a box edge this close to an interior tile border is cut by it
CUT_COVER = 0.7  # a cut box is dropped when an uncut box of its class covers this share of its area ...
CUT_SCORE_RATIO = 0.5  # ... with at least this share of its score

# ``detect(crops) -> detections``: ``[3, h, w]`` images -> per crop ``boxes [N, 4]`` pixel xyxy of that crop,
# ``scores [N]``, ``labels [N]`` (score threshold and per-crop maximum applied by the caller).
DetectFn = Callable[[list[Tensor]], list[dict[str, Tensor]]]


def tile_shape(tile: str | tuple[int, int] | None, image_hw: Sequence[int], input_hw: Sequence[int]
               ) -> tuple[int, int] | None:
    """``(height, width)`` of the tiles for one image (clipped to the image), or ``None`` when it is not tiled.

    ``tile``: as :func:`ssd.settings.check_tile` returns it. ``"auto"`` tiles an image more than :data:`AUTO_FACTOR`
    times the network input ``input_hw`` along a side, with tiles of the input's size. An image that one tile covers
    is not tiled."""
    (height, width), (in_h, in_w) = image_hw, input_hw
    if tile is None or (tile == "auto" and height <= AUTO_FACTOR * in_h and width <= AUTO_FACTOR * in_w):
        return None
    tile_h, tile_w = (in_h, in_w) if tile == "auto" else tile
    if tile_h >= height and tile_w >= width:
        return None
    return min(tile_h, height), min(tile_w, width)


def _count(length: int, side: int, overlap: float) -> int:
    """How many tiles of ``side`` cover ``length`` with neighbours sharing at least ``overlap * side``."""
    return 1 if side >= length else math.ceil((length - side) / (side * (1 - overlap)) - 1e-9) + 1


def _starts(length: int, side: int, count: int) -> Tensor:
    """Start offsets of ``count`` tiles of ``side`` along ``length``: evenly spread, the first at 0, the last at
    ``length - side``."""
    if side >= length:
        return torch.zeros(1, dtype=torch.int64)
    return torch.linspace(0, length - side, count).round().long()


def tile_windows(image_hw: Sequence[int], tile_hw: Sequence[int], overlap: float = TILE_OVERLAP) -> Tensor:
    """Tiles covering an image: ``[T, 4]`` int64 pixel ``(x0, y0, x1, y1)``, row by row.

    Along each axis the tiles are spread evenly: the first starts at 0, the last ends on the image border, and
    neighbours share at least ``overlap`` of a tile (so no tile sticks out of the image)."""
    (height, width), (tile_h, tile_w) = image_hw, tile_hw
    rows, columns = _count(height, tile_h, overlap), _count(width, tile_w, overlap)
    if rows * columns > MAX_TILES_PER_IMAGE:  # checked before anything of that size is allocated
        raise ConfigError(f"--tile {tile_h}x{tile_w} with --tile-overlap {overlap} cuts a {height}x{width} image into "
                          f"{rows * columns:,} tiles, more than {MAX_TILES_PER_IMAGE} "
                          "(ssd.limits.MAX_TILES_PER_IMAGE): use larger tiles or less overlap")
    ys, xs = torch.meshgrid(_starts(height, tile_h, rows), _starts(width, tile_w, columns), indexing="ij")
    x0, y0 = xs.reshape(-1), ys.reshape(-1)
    return torch.stack([x0, y0, (x0 + tile_w).clamp(max=width), (y0 + tile_h).clamp(max=height)], dim=1)


def _uncut(found: dict[str, Tensor]) -> dict[str, Tensor]:
    """Whole-image detections: never cut."""
    return {**found, "cut": torch.zeros_like(found["scores"], dtype=torch.bool)}


def _place(found: dict[str, Tensor], window: Tensor, image_hw: Sequence[int], input_hw: Sequence[int]
           ) -> dict[str, Tensor]:
    """A tile's detections in pixels of its image, with ``cut [N]``: an edge near an interior tile border."""
    boxes = found["boxes"]
    x0, y0, x1, y1 = window.tolist()
    height, width = image_hw
    margin_x = EDGE_MARGIN * (x1 - x0) / input_hw[1]  # network-input pixels -> image pixels, per axis
    margin_y = EDGE_MARGIN * (y1 - y0) / input_hw[0]
    boxes = boxes + boxes.new_tensor([x0, y0, x0, y0])
    near = torch.stack([boxes[:, 0] <= x0 + margin_x, boxes[:, 1] <= y0 + margin_y,
                        boxes[:, 2] >= x1 - margin_x, boxes[:, 3] >= y1 - margin_y], dim=1)
    interior = torch.tensor([x0 > 0, y0 > 0, x1 < width, y1 < height], device=boxes.device)
    return {**found, "boxes": boxes, "cut": (near & interior).any(dim=1)}


def detect_tiled(detect: DetectFn, images: Sequence[Tensor], *, tile: int | str | Sequence[int],
                 input_size: int | Sequence[int], overlap: float = TILE_OVERLAP,
                 iou_threshold: float = PREDICT.iou_threshold, max_detections: int = PREDICT.max_detections,
                 batch_size: int = PredictConfig.batch_size,
                 whole: Sequence[dict[str, Tensor]] | None = None) -> list[dict[str, Tensor]]:
    """Detections of each image from the whole image and its overlapping tiles (rules: module docstring).

    Args:
        detect: crops -> detections in pixels of each crop (see :data:`DetectFn`).
        images: ``[3, H, W]`` images in their original pixels (uint8, or float in ``[0, 1]``).
        tile: see :func:`ssd.settings.check_tile`.
        input_size: the network input, ``S`` or ``(h, w)``.
        overlap: see :func:`ssd.settings.check_tile`.
        batch_size: crops per ``detect`` call.
        whole: the whole-image detections when the caller has them already (``ssd val``: the plain pass of its
            loader), one per image; else the whole images are crops like the tiles.

    Returns:
        One dict per image: ``boxes [N, 4]`` float32 pixel xyxy, ``scores [N]``, ``labels [N]`` int64, sorted by
        decreasing score.
    """
    tile = check_tile(tile, overlap)
    input_hw = as_hw(input_size)
    crops: list[tuple[int, Tensor | None]] = [] if whole is not None else [(i, None) for i in range(len(images))]
    for index, image in enumerate(images):
        shape = tile_shape(tile, image.shape[-2:], input_hw)
        if shape is not None:
            crops += [(index, window) for window in tile_windows(image.shape[-2:], shape, overlap)]
    parts = [(i, _uncut(found)) for i, found in enumerate(whole or [])]
    for start in range(0, len(crops), batch_size):
        chunk = crops[start:start + batch_size]
        pixels = [images[i] if w is None else images[i][:, w[1]:w[3], w[0]:w[2]] for i, w in chunk]
        for (i, window), found in zip(chunk, detect(pixels)):
            parts.append((i, _uncut(found) if window is None else _place(found, window, images[i].shape[-2:],
                                                                          input_hw)))
    return _merge(parts, len(images), iou_threshold, max_detections)


def _merge(parts: list[tuple[int, dict[str, Tensor]]], num_images: int, iou_threshold: float,
           max_detections: int) -> list[dict[str, Tensor]]:
    """Class-wise NMS per image over all crops (cut boxes ranked lower), cut boxes covered by a whole-object box
    dropped, the top ``max_detections`` per image by score; all images at once."""
    cat = {key: torch.cat([found[key] for _, found in parts]) for key in ("boxes", "scores", "labels", "cut")}
    boxes, scores, cut = cat["boxes"].float(), cat["scores"].float(), cat["cut"]
    owner = torch.cat([torch.full_like(found["labels"], i) for i, found in parts])
    group = owner * (int(cat["labels"].max()) + 1 if len(owner) else 1) + cat["labels"]
    keep = batched_nms(boxes, torch.where(cut, scores * CUT_SCORE_RATIO, scores), group, iou_threshold)
    keep = keep[~_covered_cuts(boxes[keep], scores[keep], group[keep], cut[keep])]
    keep = keep[scores[keep].argsort(descending=True, stable=True)]
    keep = keep[torch.sort(owner[keep], stable=True).indices]  # image by image, each by decreasing score
    first, counts = first_per_image(torch.bincount(owner[keep], minlength=num_images), max_detections)
    keep = keep[first]
    return [{"boxes": b, "scores": s, "labels": lab} for b, s, lab in
            zip(boxes[keep].split(counts), cat["scores"][keep].split(counts), cat["labels"][keep].split(counts))]


def _covered_cuts(boxes: Tensor, scores: Tensor, group: Tensor, cut: Tensor) -> Tensor:
    """``[N]`` bool: cut boxes covered (:data:`CUT_COVER` of their area, :data:`CUT_SCORE_RATIO` of their score) by
    an uncut box of the same group (image and class).

    Each cut box is compared with the uncut boxes of its own group only: they are sorted by group and gathered into
    a ``[C, G]`` table (``G`` = the largest group), not the ``[C, U]`` table of all pairs."""
    drop = torch.zeros_like(cut)
    cut_index, uncut_index = cut.nonzero()[:, 0], (~cut).nonzero()[:, 0]
    if len(cut_index) == 0 or len(uncut_index) == 0:
        return drop
    uncut_group, order = group[uncut_index].sort(stable=True)
    uncut_index = uncut_index[order]
    counts = torch.bincount(uncut_group, minlength=int(group.max()) + 1)
    own = group[cut_index]
    width = int(counts[own].max())
    if width == 0:
        return drop
    column = torch.arange(width, device=boxes.device)
    valid = column < counts[own][:, None]  # [C, G]
    other = uncut_index[((counts.cumsum(0) - counts)[own][:, None] + column).clamp(max=len(uncut_index) - 1)]
    a, b = boxes[cut_index][:, None], boxes[other]  # [C, 1, 4], [C, G, 4]
    sides = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = sides[..., 0] * sides[..., 1]
    covered = (inter >= CUT_COVER * box_area(boxes[cut_index])[:, None]) & valid
    covered &= scores[other] >= CUT_SCORE_RATIO * scores[cut_index][:, None]
    drop[cut_index] = covered.any(dim=1)
    return drop

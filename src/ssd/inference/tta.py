"""Test-time augmentation (``ssd val --tta``, ``ssd predict --tta``, ``Detector.predict(tta=True)``).

Each preprocessed batch is also shown to the network as :data:`TTA_VIEWS`: mirrored left to right, and shrunk to
:data:`TTA_SCALE` of the input (the rest padded with the mean color, zero after normalization: the zoom out of
training's augmentation, which helps objects cut by the border or larger than the default boxes). Each view is one
batched call of the caller's ``detect`` (the one pipeline, :func:`ssd.detect.detect_batch`); its pixel boxes are
mapped back onto the original image (mirrored back, divided by the view's scale) and the views' boxes are merged
by weighted box fusion (:func:`fuse_boxes`), all images and classes of a batch at once.

Why not the ``ensemble-boxes`` package: its ``weighted_boxes_fusion`` takes one image at a time and matches box by
box in a Python loop, which would put two Python loops (images, boxes) into every batch of ``ssd val``. The fusion
here is the same weighted average of the same clusters where those are unambiguous (a test compares the two), with
the clusters found by class-wise NMS instead of box by box: each box joins the highest-scored box NMS keeps in its
image and class that it overlaps above ``iou_threshold`` (see :func:`fuse_boxes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.ops import batched_nms

from ssd.postprocess import first_per_image

__all__ = ["TTA_SCALE", "TTA_VIEWS", "detect_tta", "fuse_boxes", "view_batch"]

TTA_SCALE = 0.8  # the shrunk view: 0.8 of the input side, as YOLOv5's TTA's 0.83 / 0.67 scales for a fixed input
TTA_VIEWS: tuple[tuple[float, bool], ...] = ((1.0, False), (1.0, True), (TTA_SCALE, False))
"""``(scale, mirrored)`` of each view: the plain input, its mirror image, and the input shrunk to :data:`TTA_SCALE`."""

# ``detect(batch [B, 3, S, S] normalized, sizes [B, 2] (h, w)) -> per image boxes [N, 4] pixel xyxy, scores, labels``
DetectFn = Callable[[Tensor, Tensor], list[dict[str, Tensor]]]


def view_batch(batch: Tensor, scale: float, mirrored: bool) -> tuple[Tensor, tuple[float, float]]:
    """One view of a normalized ``batch [B, 3, H, W]``: resized to ``scale`` of each side (top left, the rest zero,
    the mean color) and mirrored left to right when ``mirrored``. Returns the view ``[B, 3, H, W]`` and the scale
    really applied per axis ``(sy, sx)`` (sides are rounded to whole pixels)."""
    height, width = batch.shape[-2:]
    view = batch
    if scale != 1.0:
        new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        view = F.interpolate(batch.float(), size=(new_h, new_w), mode="bilinear", align_corners=False,
                             antialias=True).to(batch.dtype)
        view = F.pad(view, (0, width - new_w, 0, height - new_h))
        scale_hw = (new_h / height, new_w / width)
    else:
        scale_hw = (1.0, 1.0)
    return (view.flip(-1) if mirrored else view), scale_hw


def detect_tta(detect: DetectFn, batch: Tensor, sizes: Tensor, *, score_threshold: float, iou_threshold: float,
               max_detections: int, views: Sequence[tuple[float, bool]] = TTA_VIEWS) -> list[dict[str, Tensor]]:
    """Detections of ``batch`` from every view of ``views`` (``(scale, mirrored)``), fused per image and class.

    Args:
        detect: the pipeline (see :data:`DetectFn`); it applies the thresholds to each view.
        batch: ``[B, 3, S, S]`` normalized network inputs.
        sizes: ``[B, 2]`` ``(h, w)`` of the original images.
        score_threshold: keep scores strictly above it (:mod:`ssd.settings`), in each view and after fusion.
        iou_threshold: per-class NMS overlap of each view, and the fusion's clustering overlap.
        max_detections: detections kept per image, in each view and after fusion.
        views: ``(scale, mirrored)`` of each view (:func:`view_batch`).

    Returns:
        One dict per image: ``boxes [N, 4]`` float32 pixel xyxy, ``scores [N]``, ``labels [N]`` int64, sorted by
        decreasing score.
    """
    parts, factors, mirrors = [], [], []
    for index, (scale, mirrored) in enumerate(views):  # a view is a batched call: a handful, never per image
        view, (sy, sx) = view_batch(batch, scale, mirrored)
        found = detect(view, sizes)
        parts += [(image, index, d) for image, d in enumerate(found)]
        factors.append([sx, sy, sx, sy])
        mirrors.append(mirrored)
    boxes = torch.cat([d["boxes"].float() for _, _, d in parts])
    device = boxes.device
    owner = torch.cat([torch.full_like(d["labels"], image) for image, _, d in parts]).to(device)
    view = torch.cat([torch.full_like(d["labels"], index) for _, index, d in parts]).to(device)
    width = sizes.to(device)[owner, 1].to(boxes.dtype)
    height = sizes.to(device)[owner, 0].to(boxes.dtype)
    unmirrored = torch.stack([width - boxes[:, 2], boxes[:, 1], width - boxes[:, 0], boxes[:, 3]], dim=1)
    boxes = torch.where(torch.tensor(mirrors, device=device)[view][:, None], unmirrored, boxes)
    boxes = boxes / torch.tensor(factors, dtype=boxes.dtype, device=device)[view]
    boxes = torch.minimum(boxes.clamp(min=0), torch.stack([width, height, width, height], dim=1))
    return fuse_boxes(boxes, torch.cat([d["scores"].float() for _, _, d in parts]).to(device),
                      torch.cat([d["labels"] for _, _, d in parts]).to(device), owner, num_images=len(batch),
                      num_views=len(views), score_threshold=score_threshold, iou_threshold=iou_threshold,
                      max_detections=max_detections)


def fuse_boxes(boxes: Tensor, scores: Tensor, labels: Tensor, owner: Tensor, *, num_images: int, num_views: int,
               score_threshold: float, iou_threshold: float, max_detections: int) -> list[dict[str, Tensor]]:
    """Weighted box fusion of the boxes of ``num_views`` views, per image and class, all images at once.

    Clusters: class-wise NMS (per image and class) keeps the cluster leaders; every box joins the first leader of
    its image and class, by decreasing score, that it overlaps with IoU above ``iou_threshold`` (a leader joins
    itself). A cluster of ``T`` boxes becomes one box: the score-weighted mean of its corners, scored by the mean of
    its scores times ``min(T, num_views) / num_views`` (a box that few views found is trusted less: WBF's ``avg``).
    Fused scores not above ``score_threshold`` are dropped, then the ``max_detections`` best of each image kept.

    Args:
        boxes: ``[N, 4]`` pixel xyxy.
        scores: ``[N]``.
        labels: ``[N]`` int64.
        owner: ``[N]`` int64, the image of each box, in ``0..num_images-1``.

    Returns:
        One dict per image (``num_images``): ``boxes [M, 4]``, ``scores [M]``, ``labels [M]``, by decreasing score.
    """
    group = owner * (int(labels.max()) + 1 if len(labels) else 1) + labels
    leaders = batched_nms(boxes, scores, group, iou_threshold)  # by decreasing score
    leaders = leaders[torch.sort(group[leaders], stable=True).indices]  # by group, each by decreasing score
    cluster = _first_leader(boxes, group, leaders, iou_threshold)  # [N] position in leaders
    weight = scores[:, None]
    total = torch.zeros(len(leaders), dtype=scores.dtype, device=scores.device).index_add_(0, cluster, scores)
    fused = torch.zeros(len(leaders), 4, dtype=boxes.dtype, device=boxes.device).index_add_(0, cluster,
                                                                                            boxes * weight)
    fused = fused / total[:, None].clamp(min=torch.finfo(total.dtype).tiny)
    count = torch.bincount(cluster, minlength=len(leaders)).to(scores.dtype)
    score = total / count.clamp(min=1) * count.clamp(max=num_views) / num_views
    image, label = owner[leaders], labels[leaders]
    keep = (score > score_threshold).nonzero()[:, 0]
    keep = keep[score[keep].argsort(descending=True, stable=True)]
    keep = keep[torch.sort(image[keep], stable=True).indices]  # image by image, each by decreasing score
    first, counts = first_per_image(torch.bincount(image[keep], minlength=num_images), max_detections)
    keep = keep[first]
    return [{"boxes": b, "scores": s, "labels": lab} for b, s, lab in
            zip(fused[keep].split(counts), score[keep].split(counts), label[keep].split(counts))]


def _first_leader(boxes: Tensor, group: Tensor, leaders: Tensor, iou_threshold: float) -> Tensor:
    """``[N]``: for each box, the position in ``leaders`` (sorted by group, each by decreasing score) of the first
    leader of its group it overlaps above ``iou_threshold`` (the best-overlapping one when none does, which only
    rounding can cause; a leader is its own).

    Each box is compared with the leaders of its own group only: they are gathered into a ``[N, G]`` table (``G`` =
    the most leaders of one group), not the ``[N, L]`` table of all pairs."""
    if len(leaders) == 0:
        return torch.zeros(0, dtype=torch.int64, device=boxes.device)
    counts = torch.bincount(group[leaders], minlength=int(group.max()) + 1)
    starts = counts.cumsum(0) - counts
    column = torch.arange(int(counts.max()), device=boxes.device)
    valid = column < counts[group][:, None]  # [N, G]
    position = (starts[group][:, None] + column).clamp(max=len(leaders) - 1)
    a, b = boxes[:, None], boxes[leaders[position]]  # [N, 1, 4], [N, G, 4]
    sides = (torch.minimum(a[..., 2:], b[..., 2:]) - torch.maximum(a[..., :2], b[..., :2])).clamp(min=0)
    inter = sides[..., 0] * sides[..., 1]
    area_a = (a[..., 2] - a[..., 0]) * (a[..., 3] - a[..., 1])
    area_b = (b[..., 2] - b[..., 0]) * (b[..., 3] - b[..., 1])
    iou = torch.where(valid, inter / (area_a + area_b - inter).clamp(min=torch.finfo(boxes.dtype).tiny), -1.0)
    above = iou > iou_threshold
    first = torch.where(above.any(dim=1), above.float().argmax(dim=1), iou.argmax(dim=1))
    cluster = position.gather(1, first[:, None])[:, 0]
    cluster[leaders] = torch.arange(len(leaders), device=boxes.device)
    return cluster

"""The inference pipeline on numpy arrays, for the runtime install without PyTorch (``pip install
'ssd-detect[runtime]'``): images -> the network's input batch -> detections -> pixels.

A graph with decoding and NMS inside (``ssd export --nms``) returns detections itself; the head outputs of any other
(ONNX and OpenVINO without ``--nms``, TFLite, NCNN) go through :func:`postprocess_arrays`, the rule of
:func:`ssd.postprocess.postprocess_detections` in numpy. Images are ``uint8 [3, H, W]`` RGB arrays, the layout of
the tensors of the PyTorch path, so that sizes read the same (``image.shape[-2:]`` is ``(h, w)``).

The resize is Pillow's bilinear filter widened when shrinking (the antialiasing that ``torchvision``'s
``antialias=True`` reproduces); pixels may differ by one level from the PyTorch path's, so boxes and scores agree
to about 1e-2, not bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from PIL import Image

from ssd.errors import ConfigError, InputError, MissingDependencyError
from ssd.settings import CANDIDATES_PER_CLASS, check_thresholds
from ssd.sizes import as_hw

__all__ = ["pil_to_array", "check_array", "preprocess_arrays", "object_scores", "postprocess_arrays", "detect_arrays"]


def pil_to_array(image: Image.Image) -> np.ndarray:
    """A Pillow image -> ``uint8 [3, H, W]`` RGB."""
    return np.ascontiguousarray(np.asarray(image.convert("RGB")).transpose(2, 0, 1))


def check_array(image: Any, index: int) -> None:
    """Raise ``ValueError`` naming image ``index`` unless it is a ``uint8 [3, H, W]`` numpy array."""
    if not isinstance(image, np.ndarray) or image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise InputError(f"image {index} must be a uint8 [3, H, W] numpy array (RGB, channels first) without PyTorch, "
                         f"got {type(image).__name__} {list(getattr(image, 'shape', []))} "
                         f"{getattr(image, 'dtype', '')}".rstrip())


def preprocess_arrays(images: Sequence[np.ndarray], image_size: int | tuple[int, int], mean: Sequence[float],
                      std: Sequence[float], uint8: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Resize (plain, no letterbox) and normalize, as :func:`ssd.preprocess.preprocess`.

    Args:
        images: ``uint8 [3, H, W]`` arrays (sizes may differ).
        image_size: the network input, ``S`` or ``(H, W)``.
        mean: per channel, of images scaled to ``[0, 1]``.
        std: the same.
        uint8: resize only, for a graph that normalizes itself (``--uint8-input``).

    Returns:
        ``(batch [B, 3, H, W] float32 normalized, or [B, H, W, 3] uint8 with uint8, sizes [B, 2] int64 (h, w) of
        the originals)``.
    """
    if len(images) == 0:
        raise InputError("images must be a non-empty list of uint8 [3, H, W] arrays")
    for index, image in enumerate(images):
        check_array(image, index)
    height, width = as_hw(image_size)
    resized = np.stack([np.asarray(Image.fromarray(image.transpose(1, 2, 0)).resize((width, height),
                                                                                  Image.Resampling.BILINEAR))
                        for image in images])  # [B, H, W, 3] uint8
    sizes = np.array([image.shape[-2:] for image in images], dtype=np.int64)
    if uint8:
        return resized, sizes
    scale = np.float32(1 / 255)
    batch = (resized.astype(np.float32) * scale - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2)), sizes


def object_scores(logits: np.ndarray) -> np.ndarray:
    """``logits [B, P, K+1]`` (background first) -> the object classes' softmax probabilities ``[B, P, K]``."""
    exps = np.exp(logits - logits.max(-1, keepdims=True))
    return exps[..., 1:] / exps.sum(-1, keepdims=True)


def postprocess_arrays(loc: np.ndarray, scores: np.ndarray, priors: np.ndarray, *, score_threshold: float,
                       iou_threshold: float, max_detections: int, variances: Sequence[float],
                       candidates_per_class: int = CANDIDATES_PER_CLASS, classes: Sequence[int] | None = None
                       ) -> list[dict[str, np.ndarray]]:
    """:func:`ssd.postprocess.postprocess_detections` in numpy, for the runtime without PyTorch (where that one
    cannot run): the same rule, the same order of equal scores, the same arguments, but the scores given as
    probabilities (:func:`object_scores` of logits; a TFLite graph returns them).

    Args:
        loc: ``[B, P, 4]`` offsets, ``(x, y, w, h)`` order.
        scores: ``[B, P, K]`` object class probabilities.
        priors: ``[P, 4]`` cxcywh normalized.

    Returns:
        Per image ``boxes [N, 4]`` float32 xyxy normalized, clipped to ``[0, 1]``, ``scores [N]``, ``labels [N]``
        int64, by decreasing score, then label, then prior.
    """
    batch, num_priors, num_classes = scores.shape
    if loc.shape != (batch, num_priors, 4) or priors.shape != (num_priors, 4):
        raise InputError(f"head outputs loc {list(loc.shape)}, scores {list(scores.shape)} and priors "
                         f"{list(priors.shape)} do not agree: loc [B, P, 4], scores [B, P, K], priors [P, 4]")
    if candidates_per_class <= 0:
        raise ConfigError(f"candidates_per_class must be positive, got {candidates_per_class}")
    passing = scores > score_threshold
    if classes is not None:  # before any cut: the other classes take no place
        passing &= np.isin(np.arange(num_classes), list(classes))
    image, prior, label = passing.nonzero()  # by image, prior, label
    score, group = scores[image, prior, label].astype(np.float32), image * num_classes + label
    order = _by_score(group, score)  # by image and class, then decreasing score, then prior
    order = order[_ranks(group[order]) < candidates_per_class]
    order = order[_by_score(image[order], score[order])]  # the output's order: equal scores by label, then prior
    image, prior, label, score, group = image[order], prior[order], label[order], score[order], group[order]

    anchor, offsets = priors[prior], loc[image, prior]
    centre = anchor[:, :2] + offsets[:, :2] * variances[0] * anchor[:, 2:]
    size = anchor[:, 2:] * np.exp(offsets[:, 2:] * variances[1])
    boxes = np.concatenate((centre - 0.5 * size, centre + 0.5 * size), axis=1).clip(0, 1)

    # Greedy NMS keeps or drops a box looking only at higher scores of its image and class: on the best `limit`
    # candidates of an image it is exact for them. Again, wider, on the images left with fewer than max_detections.
    rank, counts = _ranks(image), np.bincount(image, minlength=batch)
    kept, todo, limit = np.zeros(len(image), bool), np.ones(batch, bool), 2 * max_detections
    while todo.any():
        chosen = ((rank < limit) & todo[image]).nonzero()[0]
        kept[chosen] = _greedy_nms(boxes[chosen], group[chosen], iou_threshold)
        todo &= (np.bincount(image[kept], minlength=batch) < max_detections) & (counts > limit)
        limit *= 4
    keep = kept.nonzero()[0]
    keep = keep[_ranks(image[keep]) < max_detections]
    split = np.searchsorted(image[keep], np.arange(1, batch))
    return [{"boxes": b, "scores": s, "labels": lab} for b, s, lab in
            zip(np.split(boxes[keep], split), np.split(score[keep], split), np.split(label[keep], split))]


def _greedy_nms(boxes: np.ndarray, group: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Greedy NMS within each group: ``boxes [N, 4]`` xyxy by decreasing priority, ``group [N]`` -> kept ``[N]``
    bool. Every pair of a group overlapping by more than the threshold at once; then rounds: a box that no
    undecided higher box overlaps is kept, and drops those it overlaps (as many rounds as the longest chain)."""
    order = np.argsort(group, kind="stable")  # each group together, by priority
    rank = _ranks(group[order])
    lower = np.repeat(order, rank)  # each box once per higher box of its group: order[k - rank[k] + t], t < rank[k]
    higher = order[np.repeat(np.arange(len(order)) - np.cumsum(rank), rank) + np.arange(int(rank.sum()))]
    x1, y1, x2, y2 = boxes.T.copy()  # columns: contiguous gathers
    area = (x2 - x1) * (y2 - y1)
    inter = (np.minimum(x2[lower], x2[higher]) - np.maximum(x1[lower], x1[higher])).clip(0)
    inter *= (np.minimum(y2[lower], y2[higher]) - np.maximum(y1[lower], y1[higher])).clip(0)
    with np.errstate(divide="ignore", invalid="ignore"):  # two empty boxes: NaN, not above, kept (as torchvision)
        overlap = (inter / (area[higher] + area[lower] - inter) > iou_threshold).nonzero()[0]
    lower, higher = lower[overlap], higher[overlap]
    undecided, kept = np.ones(len(boxes), bool), np.zeros(len(boxes), bool)
    while undecided.any():  # counts, not masks, of the pairs: boolean indexing is several times slower
        new = undecided & (np.bincount(lower, weights=undecided[higher], minlength=len(boxes)) == 0)
        kept |= new
        undecided &= ~new & (np.bincount(lower, weights=new[higher], minlength=len(boxes)) == 0)
    return kept


def _by_score(major: np.ndarray, score: np.ndarray) -> np.ndarray:
    """The stable order by ``major`` (ints), then decreasing ``score`` (float32 > 0, whose bits read as int32 rise
    with it): one int64 key, several times faster than ``np.lexsort`` over the columns."""
    return np.argsort(major.astype(np.int64) << 31 | (0x7FFFFFFF - score.view(np.int32)), kind="stable")


def _ranks(ids: np.ndarray) -> np.ndarray:
    """Each element's position within its run of equal ``ids`` (grouped) ``[N]`` -> ``[N]``."""
    starts = np.ones(len(ids), bool)
    starts[1:] = ids[1:] != ids[:-1]
    position = np.arange(len(ids))
    return position - np.maximum.accumulate(np.where(starts, position, 0))


def detect_arrays(network: Any, images: Sequence[np.ndarray], *, score_threshold: float, iou_threshold: float,
                  max_detections: int, classes: Sequence[int] | None = None) -> list[dict[str, np.ndarray]]:
    """Detections of ``images`` (``uint8 [3, H, W]`` arrays) in pixels of the originals: per image ``boxes [N, 4]``
    float32 xyxy, ``scores [N]``, ``labels [N]`` int64, by decreasing score.

    ``network``: a backend whose graph holds NMS (``card.nms`` set and ``nms_arrays``, as
    :class:`ssd.inference.backends.onnx.OnnxBackend`), or one that returns head outputs as arrays (``head_arrays(
    batch) -> (loc, scores, priors)``, see :func:`postprocess_arrays`), fed ``uint8 [B, S, S, 3]`` pixels when its
    ``uint8_input`` is set. ``classes``: keep only these labels; a graph's own NMS cuts to ``max_detections`` first,
    so its detections are filtered after it.

    Raises:
        MissingDependencyError: a backend that offers neither (a PyTorch one).
    """
    check_thresholds(score_threshold, iou_threshold, max_detections)
    options = dict(score_threshold=score_threshold, iou_threshold=iou_threshold, max_detections=max_detections)
    card = network.card
    if not hasattr(network, "head_arrays" if card.nms is None else "nms_arrays"):
        raise MissingDependencyError(
            f"{getattr(network, 'source', None) or 'this model'} runs with PyTorch only (not installed): export it "
            "(`ssd export --format onnx`, tflite, openvino or ncnn), or pip install ssd-detect (with PyTorch)")
    batch, sizes = preprocess_arrays(images, card.image_size, card.mean, card.std,
                                     getattr(network, "uint8_input", False))
    if card.nms is None:
        detections = postprocess_arrays(*network.head_arrays(batch), variances=card.variances, classes=classes,
                                        **options)
    else:
        detections = network.nms_arrays(batch, **options)
        if classes is not None:
            detections = [{key: value[np.isin(d["labels"], list(classes))] for key, value in d.items()}
                          for d in detections]
    for detection, (height, width) in zip(detections, sizes):
        detection["boxes"] = detection["boxes"] * np.array([width, height, width, height], dtype=np.float32)
    return detections

"""The one inference pipeline after :func:`ssd.preprocess.preprocess`: network -> post-processing -> pixels.

:func:`detect_batch` is what :meth:`ssd.models.SSD.predict`, :class:`ssd.inference.detector.Detector`, evaluation,
the export check and tiling all run; it sits in the core so that the model itself can use it. The network is an
SSD module (called as it is) or any :class:`ssd.inference.backends.Backend` (PyTorch, ONNX Runtime, ...), read by
its attributes only (``card``, ``priors``, the call, ``nms_detections`` where ``card.nms`` is set).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ssd.nn import unwrap_model
from ssd.postprocess import postprocess_detections
from ssd.preprocess import to_pixels
from ssd.settings import check_thresholds

__all__ = ["detect_batch", "model_input"]


def model_input(batch: Tensor, channels_last: bool) -> Tensor:
    """``batch [B, 3, S, S]`` in the memory format the network's weights are in (channels-last or contiguous)."""
    return batch.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def detect_batch(network: Any, batch: Tensor, sizes: Tensor, *, score_threshold: float, iou_threshold: float,
                 max_detections: int, classes: Sequence[int] | None = None) -> list[dict[str, Tensor]]:
    """Detections of a preprocessed batch, in pixels of the original images.

    Args:
        network: a backend, or an SSD module (possibly DDP-wrapped) called as it is: its train/eval mode, device,
            memory format and autocast are the caller's.
        batch: ``[B, 3, S, S]`` from :func:`ssd.preprocess.preprocess` (or the evaluation transform: plain resize,
            normalized).
        sizes: ``[B, 2]`` int ``(h, w)`` of the original images.
        score_threshold: keep scores strictly above it (see :mod:`ssd.settings`; checked here).
        iou_threshold: per-class NMS overlap (checked here).
        max_detections: detections kept per image (checked here).
        classes: keep only these labels (``None``: all), before the ``max_detections`` cut; a graph with its own
            NMS cuts first, so its detections are filtered after it.

    Returns:
        One dict per image: ``boxes [N, 4]`` float32 pixel xyxy, ``scores [N]``, ``labels [N]`` int64 ``0..K-1``,
        sorted by decreasing score (on the device of the outputs).
    """
    check_thresholds(score_threshold, iou_threshold, max_detections)
    options = dict(score_threshold=score_threshold, iou_threshold=iou_threshold, max_detections=max_detections)
    if isinstance(network, nn.Module):
        model = unwrap_model(network)
        with torch.no_grad():
            loc, logits = network(batch)
        priors, variances = model.priors, model.config.variances
    elif network.card.nms is not None:  # the graph ran its own NMS (see ssd.export.onnx)
        detections = network.nms_detections(batch, **options)
        if classes is not None:
            wanted = torch.as_tensor(list(classes), dtype=torch.int64)
            detections = [{key: value[torch.isin(d["labels"], wanted.to(d["labels"].device))]
                           for key, value in d.items()} for d in detections]
        return to_pixels(detections, sizes)
    else:
        loc, logits = network(batch)
        priors, variances = network.priors, network.card.variances
    detections = postprocess_detections(loc, logits, priors.to(loc.device), variances=variances, classes=classes,
                                        **options)
    return to_pixels(detections, sizes)

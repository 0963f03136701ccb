"""Detections in the COCO results format, written by ``ssd predict --format coco`` and ``ssd val --save-json``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from torch import Tensor

from ssd.errors import InputError

__all__ = ["to_coco_detections", "as_tensor"]


def as_tensor(value: Any, dtype: torch.dtype) -> Tensor:
    """A tensor, array or list as a CPU tensor of ``dtype`` (detached): what per-image result dicts may hold."""
    import torch

    return torch.as_tensor(np.asarray(value) if not isinstance(value, torch.Tensor) else value.detach().cpu(),
                           dtype=dtype)


def _array(value: Any, dtype: type) -> np.ndarray:
    """A tensor, array or list as a numpy array of ``dtype`` (no torch needed for arrays and lists)."""
    return np.asarray(value.detach().cpu() if hasattr(value, "detach") else value, dtype=dtype)


def to_coco_detections(detections: Sequence[Mapping[str, Any]], image_ids: Sequence[Any] | None = None,
                       category_ids: Sequence[int] | Mapping[int, int] | None = None) -> list[dict[str, Any]]:
    """COCO results format: one ``dict(image_id, category_id, bbox=[x, y, w, h] pixels, score)`` per detection.

    Args:
        detections: per-image dicts: ``boxes [N, 4]`` pixel xyxy, ``scores [N]``, ``labels [N]`` in ``0..K-1``
            (tensors, arrays or lists), optionally ``image_id``.
        image_ids: one id per image; default each dict's ``image_id`` key, else its index in ``detections``.
        category_ids: label ``k`` -> category id (a sequence indexed by label, or a mapping); default the label
            itself (``0..K-1``). Pass the dataset's original ids to score with the official annotation file.
    """
    if image_ids is not None and len(image_ids) != len(detections):
        raise InputError(f"{len(image_ids)} image ids for {len(detections)} images")
    results = []
    for index, item in enumerate(detections):
        image_id = image_ids[index] if image_ids is not None else item.get("image_id", index)
        boxes = _array(item["boxes"], np.float64).reshape(-1, 4)
        xywh = np.concatenate([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], axis=1).tolist()
        labels = _array(item["labels"], np.int64).reshape(-1).tolist()
        scores = _array(item["scores"], np.float64).reshape(-1).tolist()
        for box, label, score in zip(xywh, labels, scores):
            category = label if category_ids is None else category_ids[label]
            results.append({"image_id": image_id, "category_id": int(category), "bbox": box, "score": score})
    return results

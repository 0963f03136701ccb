"""Class imbalance: per-class weights of the classification loss from a split's object counts
(``TrainConfig.class_weights``, ``--class-weights auto``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ssd.data.records import ImageRecord
from ssd.data.table import RecordTable

__all__ = ["WEIGHT_CAP", "class_counts", "class_weights"]

WEIGHT_CAP = 10.0
"""The largest weight a class gets: a class of a handful of objects would otherwise dominate the loss."""


def class_counts(records: Sequence[ImageRecord], num_classes: int) -> np.ndarray:
    """``[K]`` int64: the objects of each class that training learns from (difficult and crowd objects left out,
    as the training loader leaves them out)."""
    if isinstance(records, RecordTable):
        labels = records.labels[records.flags == 0]
    else:
        labels = np.array([o.label for r in records for o in r.objects if not o.ignore], np.int64)
    labels = labels[(labels >= 0) & (labels < num_classes)]
    return np.bincount(labels, minlength=num_classes).astype(np.int64)


def class_weights(counts: Sequence[int], cap: float = WEIGHT_CAP) -> list[float]:
    """``[K+1]`` classifier weights, background (index 0) 1: class k gets ``N / (K' * n_k)`` (``N`` objects of
    the ``K'`` classes present; the inverse frequency, scaled so the mean weight per object stays 1 and the loss
    keeps its scale), at most ``cap``; a class without objects gets 1 (nothing of it is weighted)."""
    counts = np.asarray(counts, np.float64)
    present = counts > 0
    total, kinds = counts.sum(), int(present.sum())
    weights = np.ones_like(counts)
    weights[present] = np.minimum(total / (kinds * counts[present]), cap)
    return [1.0, *map(float, weights)]

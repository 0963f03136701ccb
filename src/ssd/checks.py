"""Checks of the tensors given to the core, run before any indexing kernel (CPU and CUDA alike).

A bad label reaching ``gather`` / ``cross_entropy`` is a silent wrong result on CPU and a device-side assert on
CUDA. :func:`validate_targets` turns it into a ``ValueError`` that names the image, the object, the bad value and
the rule. Its cost is a few elementwise ops and one host synchronisation (one combined ``.any()``).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ssd.errors import InputError

__all__ = ["validate_targets", "validate_predictions"]

PADDING = -1
"""Label marking a padding row of batched targets (images have different numbers of objects)."""


def _shape(t: Tensor) -> list[int]:
    return list(t.shape)


def validate_targets(gt_boxes: Tensor, gt_labels: Tensor, num_classes: int | None) -> None:
    """Raise ``ValueError`` unless the batched targets are well formed.

    Args:
        gt_boxes: ``[B, G, 4]`` floating point, xyxy normalized. Rows whose label is ``-1`` (padding) are not checked.
        gt_labels: ``[B, G]`` integer, ``0..K-1`` for objects, ``-1`` for padding.
        num_classes: K, the number of object classes (background excluded); ``None`` skips the upper bound check.

    Rules: labels are ``-1`` or in ``0..K-1``; boxes of objects are finite with ``x2 > x1`` and ``y2 > y1``.
    The message describes the first offending object (in image, then object order) and how many are bad in all.
    """
    if not isinstance(gt_boxes, Tensor) or not isinstance(gt_labels, Tensor):
        raise InputError(
            f"gt_boxes and gt_labels must be tensors, got {type(gt_boxes).__name__} and {type(gt_labels).__name__}"
        )
    if gt_boxes.dim() != 3 or gt_boxes.shape[-1] != 4:
        raise InputError(f"gt_boxes must have shape [B, G, 4] (xyxy, padded), got {_shape(gt_boxes)}")
    if not gt_boxes.is_floating_point():
        raise InputError(f"gt_boxes must be a floating point tensor, got {gt_boxes.dtype}")
    if gt_labels.shape != gt_boxes.shape[:2]:
        raise InputError(
            f"gt_labels must have shape [B, G] = {_shape(gt_boxes)[:2]} to match gt_boxes {_shape(gt_boxes)}, "
            f"got {_shape(gt_labels)}"
        )
    if gt_labels.is_floating_point() or gt_labels.is_complex() or gt_labels.dtype == torch.bool:
        raise InputError(f"gt_labels must be an integer tensor (int64), got {gt_labels.dtype}")
    if gt_labels.device != gt_boxes.device:
        raise InputError(f"gt_boxes is on {gt_boxes.device} but gt_labels is on {gt_labels.device}")
    if num_classes is not None and num_classes < 1:
        raise InputError(f"num_classes must be at least 1 (background excluded), got {num_classes}")

    obj = gt_labels != PADDING
    bad_label = gt_labels < PADDING
    if num_classes is not None:
        bad_label |= gt_labels >= num_classes
    finite = torch.isfinite(gt_boxes).all(dim=-1)
    ordered = (gt_boxes[..., 2] > gt_boxes[..., 0]) & (gt_boxes[..., 3] > gt_boxes[..., 1])
    bad = bad_label | (obj & ~(finite & ordered))
    if not bad.any():  # the one host synchronisation
        return

    bad_cpu = bad.cpu()
    image, index = (int(v) for v in bad_cpu.nonzero()[0])
    label = int(gt_labels[image, index])
    box = [float(v) for v in gt_boxes[image, index]]
    where = f"in image {image}, object {index}"
    count = int(bad_cpu.sum())
    more = f" ({count - 1} more invalid object{'s' if count > 2 else ''} in this batch)" if count > 1 else ""
    labels_rule = f"labels must be 0..{num_classes - 1}" if num_classes is not None else "labels must be >= 0"
    if label < PADDING:
        raise InputError(f"label {label} {where} is negative ({labels_rule}; -1 is reserved for padding rows){more}")
    if num_classes is not None and label >= num_classes:
        hint = "; the background class is added internally, do not count it" if label == num_classes else ""
        raise InputError(
            f"label {label} {where} is out of range for num_classes={num_classes} ({labels_rule}{hint}){more}"
        )
    box_text = "[" + ", ".join(f"{v:g}" for v in box) + "]"
    if not all(math.isfinite(v) for v in box):
        raise InputError(f"box {box_text} {where} (label {label}) is not finite (coordinates must be numbers){more}")
    raise InputError(
        f"box {box_text} {where} (label {label}) is empty or inverted (boxes must be xyxy with x2 > x1 and y2 > y1)"
        f"{more}"
    )


def validate_predictions(loc: Tensor, logits: Tensor, priors: Tensor) -> int:
    """Check the head outputs ``loc [B, P, 4]``, ``logits [B, P, K+1]`` against ``priors [P, 4]``; return K."""
    if loc.dim() != 3 or loc.shape[-1] != 4:
        raise InputError(f"loc must have shape [B, P, 4], got {_shape(loc)}")
    if priors.dim() != 2 or priors.shape[-1] != 4:
        raise InputError(f"priors must have shape [P, 4] (cx, cy, w, h), got {_shape(priors)}")
    if logits.dim() != 3 or logits.shape[:2] != loc.shape[:2]:
        raise InputError(f"logits must have shape [B, P, K+1] = {_shape(loc)[:2] + ['K+1']}, got {_shape(logits)}")
    if loc.shape[1] != priors.shape[0]:
        raise InputError(f"the head predicts {loc.shape[1]} boxes per image but there are {priors.shape[0]} priors")
    if logits.shape[-1] < 2:
        raise InputError(
            f"logits have {logits.shape[-1]} output per box; they need K+1 >= 2 (background plus K object classes)"
        )
    return logits.shape[-1] - 1

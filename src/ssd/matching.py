"""Assign ground-truth boxes to default boxes (priors), vectorized over the batch.

Rule of the original SSD: every prior takes the ground truth it overlaps most (IoU of the xyxy ground truth with the
prior in point form) and is positive when that IoU is at least ``iou_threshold``. In addition each ground truth's
best prior is forced to that ground truth (its overlap counts as 2, so it is always positive); when several ground
truths share a best prior, the one with the highest index wins. Padding rows (label ``-1``) never match.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ssd.boxes import VARIANCES, box_iou_batched, cxcywh_to_xyxy, encode, xyxy_to_cxcywh
from ssd.checks import PADDING, validate_targets

__all__ = ["MATCH_IOU", "match"]

MATCH_IOU = 0.5
"""IoU at which a default box is positive for a ground truth (the original SSD's); default-box coverage counts an
object as covered at the same IoU (:func:`ssd.priors.coverage.coverage`)."""

FORCED_OVERLAP = 2.0
"""Overlap given to each ground truth's best prior (above any IoU, so it is always positive)."""


def match(
    gt_boxes: Tensor,
    gt_labels: Tensor,
    priors: Tensor,
    iou_threshold: float = MATCH_IOU,
    variances: tuple[float, float] = VARIANCES,
    *,
    validate: bool = True,
) -> tuple[Tensor, Tensor]:
    """Match a padded batch of ground truths to the priors.

    Args:
        gt_boxes: ``[B, G, 4]`` xyxy normalized to ``[0, 1]``; padding rows are ignored.
        gt_labels: ``[B, G]`` int64, object classes ``0..K-1``, ``-1`` for padding (an image may have no object).
        priors: ``[P, 4]`` cxcywh normalized (:func:`ssd.priors.default_boxes`).
        iou_threshold: minimum IoU of a positive prior (besides the forced best priors).
        variances: encoding variances, see :func:`ssd.boxes.encode`.
        validate: run :func:`ssd.checks.validate_targets` (labels are not range-checked here: K is unknown).

    Returns:
        ``loc_t [B, P, 4]``: offsets of the matched ground truth for positive priors, ``0`` for background ones.
        ``cls_t [B, P]`` int64: ``0`` for background, ``label + 1`` for positives.
    """
    if validate:
        validate_targets(gt_boxes, gt_labels, num_classes=None)
    batch, num_gt = gt_labels.shape
    num_priors = priors.shape[0]
    if num_gt == 0:
        return gt_boxes.new_zeros(batch, num_priors, 4), gt_labels.new_zeros(batch, num_priors)

    is_object = gt_labels != PADDING  # [B, G]
    iou = box_iou_batched(gt_boxes, cxcywh_to_xyxy(priors))  # [B, G, P]
    iou.masked_fill_(~is_object.unsqueeze(-1), -1.0)

    overlap, gt_index = iou.max(dim=1)  # best ground truth of every prior: [B, P]
    best_prior = iou.argmax(dim=2)  # best prior of every ground truth: [B, G]
    # Forced matches: scatter each real ground truth's index onto its best prior; the highest index wins a tie.
    candidates = torch.arange(num_gt, device=gt_labels.device).expand(batch, num_gt).masked_fill(~is_object, -1)
    forced = torch.full((batch, num_priors), -1, dtype=torch.long, device=gt_labels.device)
    forced.scatter_reduce_(1, best_prior, candidates, reduce="amax")
    is_forced = forced >= 0
    gt_index = torch.where(is_forced, forced, gt_index)
    overlap = overlap.masked_fill(is_forced, FORCED_OVERLAP)

    positive = overlap >= iou_threshold
    cls_t = torch.where(positive, gt_labels.gather(1, gt_index) + 1, 0)
    # Convert the G boxes, not the P matched copies.
    matched = xyxy_to_cxcywh(gt_boxes).gather(1, gt_index.unsqueeze(-1).expand(batch, num_priors, 4))  # [B, P, 4]
    # Background priors get a well-defined zero target (their matched box may be padding).
    loc_t = encode(matched, priors, variances, box_format="cxcywh").masked_fill_(~positive.unsqueeze(-1), 0.0)
    return loc_t, cls_t

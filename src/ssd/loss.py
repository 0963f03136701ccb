"""MultiBoxLoss: smooth L1 localization plus cross-entropy with hard negative mining (original SSD numerics)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ssd.boxes import VARIANCES
from ssd.checks import validate_predictions, validate_targets
from ssd.errors import ConfigError, InputError
from ssd.matching import MATCH_IOU, match

__all__ = ["MultiBoxLoss"]


class MultiBoxLoss(nn.Module):
    """SSD training loss, vectorized over the batch.

    Called as ``loss_fn(loc [B, P, 4], logits [B, P, K+1], priors [P, 4], gt_boxes [B, G, 4], gt_labels [B, G])``
    and returns ``(loc_loss, cls_loss)``, two scalars:

    - targets come from :func:`ssd.matching.match` (positives: ``cls_t > 0``);
    - ``loc_loss``: smooth L1 (beta 1) summed over the positive priors;
    - ``cls_loss``: cross-entropy summed over the positives and, per image, the ``neg_pos_ratio * num_pos``
      background priors with the highest background loss (at most ``P - num_pos``); an image without objects
      counts as one positive for this ratio, so background-only images still teach the classifier (the
      original SSD gives them no negatives; every image with an object is unaffected, since it has a forced
      positive);
    - ``class_weights`` (``[K+1]``, background first; e.g. :func:`ssd.data.balance.class_weights`) scale each
      chosen prior's cross-entropy by the weight of its target class (hard negatives by the background's);
    - both are divided by the number of positives in the batch, clamped to at least 1, so a batch without any
      object gives a finite loss (0 localization, negatives-only classification) instead of NaN.

    K is read from ``logits.shape[-1] - 1`` and the labels are validated against it before any indexing.
    Half-precision predictions are fine: the losses are computed in float32.
    """

    def __init__(
        self, neg_pos_ratio: int = 3, iou_threshold: float = MATCH_IOU, variances: tuple[float, float] = VARIANCES,
        class_weights: Sequence[float] | Tensor | None = None,
    ) -> None:
        super().__init__()
        self.class_weights = None if class_weights is None else torch.as_tensor(class_weights, dtype=torch.float32)
        self.neg_pos_ratio = neg_pos_ratio
        self.iou_threshold = iou_threshold
        self.variances = tuple(variances)

    def forward(
        self, loc: Tensor, logits: Tensor, priors: Tensor, gt_boxes: Tensor, gt_labels: Tensor
    ) -> tuple[Tensor, Tensor]:
        num_classes = validate_predictions(loc, logits, priors)
        validate_targets(gt_boxes, gt_labels, num_classes)
        weight = None
        if self.class_weights is not None:
            if self.class_weights.shape != (num_classes + 1,):
                raise ConfigError(f"class_weights has shape {tuple(self.class_weights.shape)}, the classifier "
                                 f"{num_classes + 1} outputs (background first)")
            weight = self.class_weights.to(logits.device)
        if gt_boxes.shape[0] != loc.shape[0]:
            raise InputError(f"the targets hold {gt_boxes.shape[0]} images but the predictions {loc.shape[0]}")
        with torch.no_grad():
            loc_t, cls_t = match(gt_boxes, gt_labels, priors, self.iou_threshold, self.variances, validate=False)
            positive = cls_t > 0  # [B, P]
            num_pos = positive.sum(dim=1)  # [B]
            negative = self._hard_negatives(logits, positive, num_pos)

        pos_index = positive.nonzero(as_tuple=True)
        loc_loss = F.smooth_l1_loss(loc[pos_index].float(), loc_t[pos_index].float(), reduction="sum", beta=1.0)
        chosen = (positive | negative).nonzero(as_tuple=True)
        cls_loss = F.cross_entropy(logits[chosen].float(), cls_t[chosen], weight=weight, reduction="sum")
        total = num_pos.sum().clamp(min=1)
        return loc_loss / total, cls_loss / total

    def _hard_negatives(self, logits: Tensor, positive: Tensor, num_pos: Tensor) -> Tensor:
        """Per image, the ``neg_pos_ratio * num_pos`` non-positive priors with the highest background loss.

        Returns a ``[B, P]`` bool mask. The background loss is ``-log_softmax(logits)[..., 0]`` (one fused pass; on
        CPU faster and lighter than ``logsumexp``); positives rank last. Only the top ``max(num_neg)`` are ranked.
        """
        num_priors = positive.shape[1]
        background_loss = torch.log_softmax(logits, dim=-1, dtype=torch.float32)[..., 0].neg()
        background_loss.masked_fill_(positive, -float("inf"))
        num_neg = torch.minimum(self.neg_pos_ratio * num_pos.clamp(min=1), num_priors - num_pos)  # [B]
        k = int(num_neg.max()) if num_neg.numel() else 0
        negative = torch.zeros_like(positive)
        if k == 0:
            return negative
        top = background_loss.topk(k, dim=1).indices  # [B, k], highest loss first
        rank_ok = torch.arange(k, device=num_neg.device) < num_neg.unsqueeze(1)
        return negative.scatter_(1, top, rank_ok)

"""The loss of a batch, for the training step and for the validation loss of an epoch (same ``MultiBoxLoss``), and
the operating point of a validation (the best-F1 confidence stored in the checkpoints)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor, nn

import ssd.distributed as ddp
from ssd.device import autocast
from ssd.evaluation.curves import operating_point
from ssd.loss import MultiBoxLoss

__all__ = ["batch_loss", "validation_loss", "validation_operating_point"]


def batch_loss(net: nn.Module, loss_fn: MultiBoxLoss, priors: Tensor, batch: dict[str, Any], device: torch.device,
               *, channels_last: bool = False, amp_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """``(loc_loss, cls_loss)`` (0-d tensors) of ``net`` on a :func:`ssd.data.collate` batch (``images [B, 3, H,
    W]``, ``boxes [B, G, 4]``, ``labels [B, G]``, ``difficult [B, G]``), against ``priors [P, 4]``. Difficult
    objects (kept by evaluation loaders) count as padding, as training's loader leaves them out."""
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    images = batch["images"].to(device, non_blocking=True).contiguous(memory_format=memory_format)
    boxes = batch["boxes"].to(device)
    labels = batch["labels"].masked_fill(batch["difficult"], -1).to(device)
    with autocast(device, amp_dtype):
        loc, logits = net(images)
    return loss_fn(loc.float(), logits.float(), priors, boxes, labels)


@torch.no_grad()
def validation_loss(model: nn.Module, loader: Iterable[dict[str, Any]], loss_fn: MultiBoxLoss, device: torch.device,
                    *, channels_last: bool = False, amp_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Mean ``val/loss``, ``val/loc_loss`` and ``val/cls_loss`` over the batches of ``loader`` (no augmentation)
    of every rank, for the plain ``model`` in eval mode (its mode is restored after)."""
    was_training = model.training
    model.eval()
    totals, batches = torch.zeros(3, dtype=torch.float64), 0
    try:
        for batch in loader:
            loc_loss, cls_loss = batch_loss(model, loss_fn, model.priors, batch, device, channels_last=channels_last,
                                            amp_dtype=amp_dtype)
            totals += torch.tensor([(loc_loss + cls_loss).item(), loc_loss.item(), cls_loss.item()],
                                   dtype=torch.float64)
            batches += 1
    finally:
        model.train(was_training)
    gathered = ddp.all_gather_objects((totals, batches))
    mean = (sum(t for t, _ in gathered) / max(1, sum(n for _, n in gathered))).tolist()
    return {"val/loss": mean[0], "val/loc_loss": mean[1], "val/cls_loss": mean[2]}


def validation_operating_point(metrics: dict[str, Any], class_names: list[str]) -> dict[str, Any] | None:
    """The overall best-F1 point of :func:`ssd.evaluation.evaluator.evaluate_split`'s ``metrics`` (its
    ``detections`` and ``ground_truths``): ``dict(score_threshold, precision, recall, f1, split="val")``, the
    checkpoint's ``operating_point``; ``None`` when the split has no objects or no confidence finds any (F1 0
    everywhere: the best point would be a confidence of 1, which keeps nothing)."""
    curves = operating_point(metrics["detections"], metrics["ground_truths"], len(class_names), class_names)
    best = curves["overall"]["best"]
    if best is None or best["f1"] == 0:
        return None
    return {"score_threshold": float(best["confidence"]), "precision": float(best["precision"]),
            "recall": float(best["recall"]), "f1": float(best["f1"]), "split": "val"}

"""Optimization of a run: parameter groups, the optimizer, the learning-rate schedule (a multiplier per step), mixed
precision, the loss of a batch (the training step's, and the validation loss of an epoch: same ``MultiBoxLoss``), and
the exponential moving average of the weights (``--ema``).

The EMA is Ultralytics' ``ModelEMA`` / timm's ``ModelEmaV2``: :func:`build_ema` wraps a copy of the model in
``torch.optim.swa_utils.AveragedModel``, which averages parameters and floating-point buffers (BatchNorm statistics)
after every optimization step. Its first update copies the model; update ``k >= 2`` uses the warm-up decay
:func:`ema_decay` ``(decay, k)`` = ``decay * (1 - exp(-k / 2000))``, so the early average is not dominated by the
random initialization::

    ema = decay_k * ema + (1 - decay_k) * model
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

import ssd.distributed as ddp
from ssd.device import amp_dtype, autocast
from ssd.log import LOGGER
from ssd.loss import MultiBoxLoss
from ssd.training.config import TrainConfig, default_milestones

__all__ = ["param_groups", "build_optimizer", "LRSchedule", "build_optimization", "resize_schedule", "batch_loss",
           "validation_loss", "EMA_WARMUP", "ema_decay", "build_ema"]


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on conv/linear weights only; none on biases and normalization parameters (all 1-d tensors)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """SGD (momentum ``config.momentum``) or AdamW (``betas=(config.momentum, 0.999)``) at ``config.lr``.

    ``config`` must be :meth:`~ssd.training.config.TrainConfig.resolved` (optimizer, lr and weight decay filled in).
    """
    groups = param_groups(model, config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the peak lr at iteration ``it``: linear warmup from ``warmup_start``, then cosine down to
    ``final_ratio`` at iteration ``total``, or ``gamma ** (milestones passed)`` (milestones in iterations).
    Past ``total`` (a run extended on resume) the cosine stays at ``final_ratio``."""

    total: int
    warmup: int
    kind: str
    final_ratio: float = 0.01
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    warmup_start: float = 0.01

    def __call__(self, it: int) -> float:
        if it < self.warmup:
            return self.warmup_start + (1 - self.warmup_start) * it / self.warmup
        if self.kind == "multistep":
            return self.gamma ** sum(it >= m for m in self.milestones)
        progress = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.final_ratio + (1 - self.final_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    @classmethod
    def from_config(cls, config: TrainConfig, iters_per_epoch: int) -> LRSchedule:
        """The schedule of a resolved config: ``schedule_epochs`` (default ``epochs``) long; multistep without
        ``milestones`` (a ``time`` budget's run) at :func:`~ssd.training.config.default_milestones` of that length."""
        length = config.schedule_epochs or config.epochs
        total = length * iters_per_epoch
        warmup = config.warmup_iters
        if warmup is None:
            warmup = round(config.warmup_epochs * iters_per_epoch)
        return cls(total=total, warmup=min(warmup, total), kind=config.scheduler, final_ratio=config.final_lr_ratio,
                   milestones=tuple(m * iters_per_epoch for m in config.milestones or default_milestones(length)),
                   gamma=config.gamma)


def build_optimization(model: nn.Module, config: TrainConfig, iters_per_epoch: int, device: torch.device
                       ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR, torch.amp.GradScaler,
                                  torch.dtype | None]:
    """``(optimizer, scheduler, scaler, amp_dtype)`` of a run: :func:`build_optimizer`, the :class:`LRSchedule`
    stepped per iteration, the gradient scaler (active for float16 autocast only) and the autocast dtype (None:
    float32, also when ``amp`` is asked for on a device without a fast path, which is logged)."""
    optimizer = build_optimizer(model, config)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, LRSchedule.from_config(config, iters_per_epoch))
    dtype = amp_dtype(device) if config.amp else None
    if config.amp and dtype is None:
        LOGGER.info(f"amp: {device} has no fast bfloat16/float16 path; training in float32")
    return optimizer, scheduler, torch.amp.GradScaler("cuda", enabled=dtype == torch.float16), dtype


def resize_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR, config: TrainConfig, epochs: int,
                    iters_per_epoch: int) -> LRSchedule:
    """Size the run's schedule to ``epochs`` (``--time``'s estimate; ``schedule_epochs`` does not apply): the cosine
    ends, and default multistep milestones fall, within them. The step count is kept and the optimizer's lr set to
    the new schedule's value at it. The schedule is saved in the scheduler's state, so a resumed run continues it."""
    schedule = LRSchedule.from_config(dataclasses.replace(config, epochs=epochs, schedule_epochs=None),
                                      iters_per_epoch)
    scheduler.lr_lambdas = [schedule] * len(scheduler.lr_lambdas)
    for group, base_lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs, strict=True):
        group["lr"] = base_lr * schedule(scheduler.last_epoch)
    return schedule


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


EMA_WARMUP = 2000
"""Updates over which the decay ramps up (``1 - exp(-k / EMA_WARMUP)``)."""


def ema_decay(decay: float, updates: int) -> float:
    """The decay of update number ``updates`` (1-based)."""
    return decay * (1 - math.exp(-updates / EMA_WARMUP))


def build_ema(model: nn.Module, decay: float) -> AveragedModel:
    """An ``AveragedModel`` of ``model`` (the plain module, not its DDP / ``torch.compile`` wrapper) on its device,
    without gradients; ``.module`` is the averaged SSD, ``.n_averaged`` the number of updates so far. Call
    ``update_parameters(model)`` after each optimizer step."""

    def average(averaged: list[Tensor], current: list[Tensor], n_averaged: Tensor) -> None:
        if not averaged[0].is_floating_point():  # BatchNorm's num_batches_tracked: a counter, taken as it is
            for a, c in zip(averaged, current):
                a.copy_(c)
            return
        torch._foreach_lerp_(averaged, current, 1 - ema_decay(decay, int(n_averaged) + 1))

    ema = AveragedModel(model, multi_avg_fn=average, use_buffers=True)
    ema.requires_grad_(False)
    return ema

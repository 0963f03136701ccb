"""Optimization of a run: parameter groups, the optimizer, the learning-rate schedule (a multiplier per step) and
mixed precision."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ssd.device import amp_dtype
from ssd.log import LOGGER
from ssd.training.config import TrainConfig, default_milestones

__all__ = ["param_groups", "build_optimizer", "LRSchedule", "build_optimization", "resize_schedule"]


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

"""Optimization of a run: parameter groups, the optimizer and the learning-rate schedule (a multiplier per step)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ssd.training.config import TrainConfig

__all__ = ["param_groups", "build_optimizer", "LRSchedule"]


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
        """The schedule of a resolved config: ``schedule_epochs`` (default ``epochs``) long."""
        total = (config.schedule_epochs or config.epochs) * iters_per_epoch
        warmup = config.warmup_iters
        if warmup is None:
            warmup = round(config.warmup_epochs * iters_per_epoch)
        return cls(total=total, warmup=min(warmup, total), kind=config.scheduler, final_ratio=config.final_lr_ratio,
                   milestones=tuple(m * iters_per_epoch for m in config.milestones), gamma=config.gamma)

"""Exponential moving average of the weights (``--ema``), as Ultralytics' ``ModelEMA`` / timm's ``ModelEmaV2``.

:func:`build_ema` wraps a copy of the model in ``torch.optim.swa_utils.AveragedModel``, which averages parameters
and floating-point buffers (BatchNorm statistics) after every optimization step. Its first update copies the
model; update ``k >= 2`` uses the warm-up decay :func:`ema_decay` ``(decay, k)`` = ``decay * (1 - exp(-k / 2000))``,
so the early average is not dominated by the random initialization::

    ema = decay_k * ema + (1 - decay_k) * model
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.optim.swa_utils import AveragedModel

__all__ = ["EMA_WARMUP", "ema_decay", "build_ema"]

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

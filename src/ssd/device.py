"""Where a model runs: device names, mixed precision policy and memory format (training and evaluation alike)."""

from __future__ import annotations

import os
import re
from contextlib import AbstractContextManager

import torch
from torch import nn

from ssd.errors import ConfigError

__all__ = ["DEVICES", "resolve_device", "usable_cores", "amp_dtype", "autocast", "prepare_model"]

DEVICES = "cpu, cuda, cuda:N (N = CUDA device index), mps or auto (cuda when available, else cpu)"
_DEVICE = re.compile(r"(cpu|mps|auto|cuda(:\d+)?)")


def usable_cores() -> int:
    """The CPU cores this process may run on (taskset, a cgroup's cpuset), not the machine's: how many threads a
    decoding pool should start."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_device(name: str | torch.device, local_rank: int | None = None) -> torch.device:
    """The ``torch.device`` for a device name of :data:`DEVICES`.

    ``"auto"`` is CUDA when available, else CPU; plain ``"cuda"`` is ``cuda:local_rank`` under torchrun
    (``local_rank`` given), else the current CUDA device. Raises :class:`~ssd.errors.ConfigError` for any other
    name (``gpu``, ``tpu``, ...) and for a device this machine does not have.
    """
    text = str(name)
    if not _DEVICE.fullmatch(text):
        raise ConfigError(f"device {text!r} is not a valid device: use {DEVICES}")
    if text == "auto":
        text = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(text)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {text!r} was requested but MPS is not available here (use cpu or auto)")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ConfigError(f"device {text!r} was requested but CUDA is not available here (use cpu or auto)")
        if device.index is None:
            device = torch.device("cuda", local_rank if local_rank is not None else torch.cuda.current_device())
        if device.index >= count:
            raise ConfigError(f"device {text!r} was requested but this machine has {count} CUDA device(s): "
                              f"cuda:0..cuda:{count - 1}")
        torch.cuda.set_device(device)
    return device


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype for mixed precision on ``device``, or None where it would not help.

    CUDA: bfloat16 where supported, else float16 (with a gradient scaler). CPU: bfloat16 where oneDNN has native
    bfloat16 kernels (AVX512-BF16 / AMX); elsewhere bfloat16 is emulated and slower than float32.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return None


def autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``; a no-op context when ``dtype`` is None (float32)."""
    return torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None)


def prepare_model(model: nn.Module, device: torch.device, channels_last: bool | None) -> tuple[nn.Module, bool]:
    """Move to ``device`` and to channels_last when asked (``None``: as ``model.config.channels_last`` says).

    Returns ``(model, channels_last)``: the inputs must then be given in the same memory format.
    """
    if channels_last is None:
        channels_last = model.config.channels_last
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, channels_last

"""The state that makes a resumed run exact: random number generators, the seed of each epoch, and the metrics as
checkpoint-safe data (everything here loads with ``torch.load(weights_only=True)``)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["seed_everything", "epoch_seed", "rng_state", "set_rng_state", "checkpoint_metrics"]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def epoch_seed(seed: int, epoch: int, rank: int) -> int:
    """The seed of one epoch on one rank: a resumed run draws the same batches as an uninterrupted one."""
    return (seed * 1_000_003 + epoch * 1_009 + rank) % 2**63


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states as tensors/plain types (loadable with ``weights_only=True``)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((state["python"][0], tuple(state["python"][1]), state["python"][2]))
    kind, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics reduced to numbers, strings, lists and tensors (checkpoint-safe for ``weights_only`` loading);
    per-image detections and ground truths are left out."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float, str)):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = checkpoint_metrics(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str)) for v in value):
            out[key] = list(value)
        elif isinstance(value, np.ndarray):
            out[key] = torch.from_numpy(value)
    return out

"""The state that makes a resumed run exact: random number generators, the seed of each epoch, and the training
state a checkpoint holds next to the model (everything here loads with ``torch.load(weights_only=True)``).

With ``ema`` a checkpoint's ``model`` is the average (what is evaluated and deployed); ``last.pt`` also holds
``ema = {"updates": int, "raw_model": state dict}``, the raw weights the optimizer steps, so a resume continues both.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ssd.log import LOGGER
from ssd.weights.checkpoint import save_checkpoint

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["TRAINING_STATE", "TrainState", "seed_everything", "epoch_seed", "rng_state", "set_rng_state",
           "checkpoint_metrics", "save_training_state", "restore_training_state"]

TRAINING_STATE = ("train_config", "epoch", "optimizer", "scheduler", "scaler", "rng", "best_map", "history",
                  "metrics", "nonfinite_skipped", "best_epoch", "stop_reason")
"""Checkpoint keys (besides the model) that ``--resume`` needs; ``ssd train`` writes them in every checkpoint, with
``operating_point`` (when the last validation has one), ``train_images`` and ``category_ids`` (checked or kept on
resume), and ``ema`` in ``last.pt`` with ``--ema``. :class:`TrainState` holds the run's own part of them."""


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


@dataclass
class TrainState:
    """The training state of a run, owned by its :class:`~ssd.training.trainer.Trainer` (callbacks read it as
    ``trainer.state`` and change it through the trainer's methods: ``stop``, ``set_epochs``).

    ``epochs`` is the run's epoch count (``config.epochs``, or ``--time``'s estimate) and ``start_epoch`` the first
    epoch this process trains; neither is saved. The other fields are a checkpoint's training schema
    (:data:`TRAINING_STATE`; :meth:`to_checkpoint` / :meth:`from_checkpoint`): ``epoch`` (0-based; saved as the last
    completed one), ``best_map`` and ``best_epoch`` (1-based), ``history`` (the results.csv rows), ``metrics`` (of the
    last validation), ``operating_point`` (its best-F1 point, None when it has none), ``nonfinite_skipped`` (steps
    skipped for a non-finite loss) and ``stop_reason`` (why the run ended before its last epoch)."""

    epochs: int
    start_epoch: int = 0
    epoch: int = 0
    best_map: float = -1.0
    best_epoch: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, Any] = field(default_factory=dict)
    operating_point: dict[str, Any] | None = None
    nonfinite_skipped: int = 0
    stop_reason: str | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The checkpoint keys of this state (``operating_point`` only when there is one)."""
        saved = {"epoch": self.epoch, "metrics": checkpoint_metrics(self.metrics), "best_map": self.best_map,
                 "best_epoch": self.best_epoch, "history": self.history, "nonfinite_skipped": self.nonfinite_skipped,
                 "stop_reason": self.stop_reason}
        return saved if self.operating_point is None else {**saved, "operating_point": self.operating_point}

    @classmethod
    def from_checkpoint(cls, checkpoint: dict[str, Any], epochs: int) -> TrainState:
        """The state a run resumed from ``checkpoint`` continues with: the epoch after the saved one."""
        start = int(checkpoint["epoch"]) + 1
        return cls(epochs, start, start, checkpoint["best_map"], checkpoint["best_epoch"],
                   list(checkpoint["history"]), dict(checkpoint["metrics"]), checkpoint.get("operating_point"),
                   checkpoint["nonfinite_skipped"], checkpoint["stop_reason"])


def save_training_state(trainer: Trainer, path: Path, *, resume: bool) -> None:
    """Write ``trainer``'s evaluated model and training state (:data:`TRAINING_STATE`) to ``path``; ``resume`` adds
    the raw weights and EMA count (``last.pt``)."""
    extra = {}
    if trainer.ema is not None and resume:
        extra["ema"] = {"updates": int(trainer.ema.n_averaged), "raw_model": trainer.model.state_dict()}
    save_checkpoint(path, trainer.eval_model, optimizer=trainer.optimizer.state_dict(),
                    scheduler=trainer.scheduler.state_dict(), scaler=trainer.scaler.state_dict(), rng=rng_state(),
                    train_config=trainer.config.to_dict(), train_images=len(trainer.train_records),
                    category_ids=trainer.category_ids, **trainer.state.to_checkpoint(), **extra)


def restore_training_state(trainer: Trainer, checkpoint: dict[str, Any]) -> TrainState:
    """Continue ``trainer``'s optimizer, schedule, scaler, RNG and EMA from ``checkpoint`` (its model was built from
    it: with ``ema`` the average, into which the raw weights are loaded back; a checkpoint without them restarts the
    average, saying so); returns the run's :class:`TrainState`."""
    trainer.optimizer.load_state_dict(checkpoint["optimizer"])
    trainer.scheduler.load_state_dict(checkpoint["scheduler"])
    trainer.scaler.load_state_dict(checkpoint["scaler"])
    set_rng_state(checkpoint["rng"])
    if trainer.ema is not None and "ema" in checkpoint:
        trainer.ema.n_averaged.fill_(checkpoint["ema"]["updates"])
        trainer.model.load_state_dict(checkpoint["ema"]["raw_model"])
    elif trainer.ema is not None:
        LOGGER.info(f"ema: {trainer.plan.checkpoint} holds no raw weights (only last.pt does): the average restarts "
                    "from its weights")
    return TrainState.from_checkpoint(checkpoint, trainer.config.epochs)

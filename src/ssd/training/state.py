"""The state that makes a resumed run exact: random number generators, the seed of each epoch, and the training
state a checkpoint holds next to the model (everything here loads with ``torch.load(weights_only=True)``), with
the operating point of each validation; and the guard that nothing non-finite is ever saved (the errors of a step
with a NaN/inf loss and of a run that diverged).

With ``ema`` a checkpoint's ``model`` is the average (what is evaluated and deployed); ``last.pt`` also holds
``ema = {"updates": int, "raw_model": state dict}``, the raw weights the optimizer steps, so a resume continues both.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from ssd.errors import NonFiniteLossError
from ssd.evaluation.curves import operating_point
from ssd.log import LOGGER
from ssd.text import few
from ssd.weights.checkpoint import save_checkpoint

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["TRAINING_STATE", "TrainState", "seed_everything", "epoch_seed", "rng_state", "set_rng_state",
           "checkpoint_metrics", "save_training_state", "restore_training_state", "validation_operating_point",
           "NONFINITE_SHARE", "nonfinite_loss_error", "check_finite"]

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


NONFINITE_SHARE = 0.05
"""With ``skip_nonfinite``, a run stops once more than this share of its steps (and more than one) were skipped,
or when every step of an epoch was."""


def nonfinite_loss_error(where: str, loss: float, paths: Sequence[str]) -> NonFiniteLossError:
    """The error of a step whose loss is ``loss`` (not finite) at ``where``, listing the batch's image ``paths``."""
    files = "\n".join(f"  {p}" for p in paths)
    return NonFiniteLossError(
        f"non-finite loss ({loss}) at {where}; nothing was saved for this step. The batch's images:\n"
        f"{files}\nCheck these files' boxes (`ssd check`), lower lr, or set skip_nonfinite to skip such steps.")


def check_finite(model: nn.Module, epoch: int, steps: int, skipped: int, nonfinite: int) -> None:
    """Stop before anything is saved for ``epoch`` (0-based) when it skipped every one of its ``steps``, the run
    skipped (``nonfinite`` in all) more than :data:`NONFINITE_SHARE` of its steps and more than one, or ``model``'s
    weights hold NaN/inf (the same on every rank)."""
    done = (epoch + 1) * steps
    kept = f"weights/last.pt holds epoch {epoch}" if epoch else "nothing was saved"
    if skipped == steps or nonfinite > max(1, NONFINITE_SHARE * done):
        which = (f"every step of epoch {epoch + 1} ({skipped})" if skipped == steps else
                 f"more than the {NONFINITE_SHARE:.0%} skip_nonfinite tolerates")
        raise NonFiniteLossError(
            f"training diverged: {nonfinite} of {done} steps ({nonfinite / done:.1%}) had a non-finite "
            f"loss and were skipped, {which}. The run stopped before saving epoch {epoch + 1} ({kept}). Lower "
            "lr, check the data (`ssd check`), or train without amp.")
    bad = [name for name, t in model.state_dict().items()
           if t.is_floating_point() and not bool(t.isfinite().all())]
    if bad:
        raise NonFiniteLossError(
            f"training diverged: after epoch {epoch + 1} the weights hold NaN/inf ({few(bad)}). Nothing was saved "
            f"for this epoch ({kept}). Lower lr, keep gradient clipping on (grad_clip), or check the data "
            "(`ssd check`).")

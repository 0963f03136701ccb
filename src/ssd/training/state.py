"""The state that makes a resumed run exact: random number generators, the seed of each epoch, and the training
state a checkpoint holds next to the model (everything here loads with ``torch.load(weights_only=True)``).

With ``ema`` a checkpoint's ``model`` is the average (what is evaluated and deployed); ``last.pt`` also holds
``ema = {"updates": int, "raw_model": state dict}``, the raw weights the optimizer steps, so a resume continues both.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ssd.log import LOGGER
from ssd.weights.checkpoint import save_checkpoint

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["seed_everything", "epoch_seed", "rng_state", "set_rng_state", "checkpoint_metrics", "save_training_state",
           "restore_training_state"]


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


def save_training_state(trainer: Trainer, path: Path, *, resume: bool) -> None:
    """Write ``trainer``'s evaluated model and training state (:data:`ssd.training.plan.TRAINING_STATE`) to
    ``path``; ``resume`` adds the raw weights and EMA count (``last.pt``)."""
    extra = {} if trainer.operating_point is None else {"operating_point": trainer.operating_point}
    if trainer.ema is not None and resume:
        extra["ema"] = {"updates": int(trainer.ema.n_averaged), "raw_model": trainer.model.state_dict()}
    save_checkpoint(path, trainer.eval_model, optimizer=trainer.optimizer.state_dict(),
                    scheduler=trainer.scheduler.state_dict(), scaler=trainer.scaler.state_dict(), epoch=trainer.epoch,
                    rng=rng_state(), metrics=checkpoint_metrics(trainer.metrics), best_map=trainer.best_map,
                    best_epoch=trainer.best_epoch, history=trainer.history, nonfinite_skipped=trainer.nonfinite,
                    stop_reason=trainer.stop_reason, train_config=trainer.config.to_dict(),
                    train_images=len(trainer.train_records), category_ids=trainer.category_ids, **extra)


def restore_training_state(trainer: Trainer, state: dict[str, Any]) -> None:
    """Continue ``trainer`` from a checkpoint's ``state`` (its model was built from it: with ``ema`` the average,
    into which the raw weights are loaded back; a checkpoint without them restarts the average, saying so)."""
    trainer.optimizer.load_state_dict(state["optimizer"])
    trainer.scheduler.load_state_dict(state["scheduler"])
    trainer.scaler.load_state_dict(state["scaler"])
    set_rng_state(state["rng"])
    trainer.start_epoch = trainer.epoch = state["epoch"] + 1
    trainer.best_map, trainer.best_epoch = state["best_map"], state["best_epoch"]
    trainer.history = list(state["history"])
    trainer.metrics = dict(state["metrics"])
    trainer.operating_point = state.get("operating_point")
    trainer.nonfinite, trainer.stop_reason = state["nonfinite_skipped"], state["stop_reason"]
    if trainer.ema is not None and "ema" in state:
        trainer.ema.n_averaged.fill_(state["ema"]["updates"])
        trainer.model.load_state_dict(state["ema"]["raw_model"])
    elif trainer.ema is not None:
        LOGGER.info(f"ema: {trainer.plan.checkpoint} holds no raw weights (only last.pt does): the average restarts "
                    "from its weights")

"""``--time MINUTES``: a training budget, validation included (Ultralytics' ``time=``, in minutes here).

The budget overrides ``--epochs``. At the end of every epoch's training steps (before its validation, so that the
last epoch is always validated) rank 0 estimates how many epochs fit; every rank takes that number
(:func:`ssd.distributed.broadcast_object`) as the run's epoch count (:meth:`~ssd.training.trainer.Trainer.set_epochs`,
which sizes the lr schedule to it), and the epoch after which the next one would not fit is the last: it
is validated and saved, and its reason goes to ``stop.txt``. The estimate: an epoch costs the mean duration of the
epochs this process completed (their validation and checkpoints included; before the first one, the current
epoch's training time), and the current epoch's validation is reserved at the duration of the last one measured.

The budget is the run's: on ``--resume`` the time already trained (the ``time`` column of ``results.csv``) counts,
and the estimate starts from the run's mean epoch; a new ``--time`` on resume sets the run's whole budget. The stop
is not stored in the checkpoint, so a run that spent its budget resumes with a larger one, and with the same one
ends at once, saying so.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import ssd.distributed as ddp
from ssd.errors import ConfigError
from ssd.limits import MAX_EPOCHS
from ssd.training.callbacks import Callback

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["TimeBudget", "epochs_that_fit"]


def epochs_that_fit(budget: float, elapsed: float, epoch_cost: float, reserve: float) -> int:
    """How many more epochs of ``epoch_cost`` seconds fit in ``budget`` after ``elapsed`` seconds and a ``reserve``
    still to spend (the current epoch's validation); 0 when none does, at most :data:`ssd.limits.MAX_EPOCHS`."""
    if epoch_cost <= 0:
        raise ConfigError(f"epoch_cost must be > 0 seconds, got {epoch_cost}")
    return max(0, min(MAX_EPOCHS, math.floor((budget - elapsed - reserve) / epoch_cost)))


class TimeBudget(Callback):
    """Fit the run into ``minutes`` (see the module docstring); runs on every rank, rank 0 decides."""

    def __init__(self, minutes: float) -> None:
        self.minutes = minutes
        self.budget = minutes * 60.0
        self.epoch_costs: list[float] = []  # full epochs completed in this process, seconds
        self.validation = 0.0  # the last validation measured (with its checkpoint), seconds
        self.mean_before = 0.0  # a resumed run's mean epoch, until this process completes one
        self.epoch_start = self.train_end = self.cost = 0.0

    def on_train_start(self, trainer: Trainer) -> None:
        state = trainer.state
        if not state.history:
            return
        done = len(state.history)
        self.mean_before = state.history[-1]["time"] / done
        elapsed = trainer.elapsed()
        more = ddp.broadcast_object(epochs_that_fit(self.budget, elapsed, self.mean_before, 0.0)
                                    if trainer.info.is_main else None)
        if more == 0:
            trainer.set_epochs(state.start_epoch)
            trainer.stop(f"time budget: the run has trained {elapsed / 60:.2f} of its {self.minutes:g} minutes "
                         f"({done} epochs of about {self.mean_before / 60:.2f} min); no further epoch fits "
                         f"(--time {self.minutes:g})")
            return
        trainer.set_epochs(state.start_epoch + more)

    def on_epoch_start(self, trainer: Trainer) -> None:
        self.epoch_start = trainer.clock()

    def on_train_batch_end(self, trainer: Trainer, step: int, losses: list[float] | None) -> None:
        if step != trainer.steps - 1:
            return
        self.train_end = trainer.clock()
        if self.epoch_costs:
            cost = sum(self.epoch_costs) / len(self.epoch_costs)
        else:
            cost = self.mean_before or self.train_end - self.epoch_start
        self.cost = cost
        more = epochs_that_fit(self.budget, trainer.elapsed(), cost, self.validation) if trainer.info.is_main else 0
        trainer.set_epochs(ddp.broadcast_object(trainer.state.epoch + 1 + more))

    def on_epoch_end(self, trainer: Trainer, row: dict[str, Any]) -> None:
        now = trainer.clock()
        self.epoch_costs.append(now - self.epoch_start)
        if "val/mAP" in row:
            self.validation = now - self.train_end
        state = trainer.state
        if state.epoch + 1 >= state.epochs and not state.stop_reason:
            trainer.stop(f"time budget: stopped after epoch {state.epoch + 1}, {row['time'] / 60:.2f} of "
                         f"{self.minutes:g} minutes trained; the next epoch (about {self.cost / 60:.2f} min) would "
                         f"not fit (--time {self.minutes:g})")

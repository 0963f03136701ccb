"""Trainer callbacks: extension points of a run, without editing the trainer.

A callback subclasses :class:`Callback` and overrides the hooks it needs; each receives the
:class:`~ssd.training.trainer.Trainer`: its ``config``, ``run_dir``, ``model``, ``eval_model``, ``epoch``,
``epochs`` and ``state`` (:class:`~ssd.training.state.TrainState`: ``history``, ``metrics``, ``best_map``, ...), to
read; a callback changes the run through the trainer's methods (``stop``, ``set_epochs``), never by assigning.
``train(callbacks=[...])`` runs them on every process after the built-in ones (results.csv, TensorBoard, figures:
:mod:`ssd.training.outputs`, rank 0 only), in list order.
The hooks of one run, in order::

    on_train_start                  the run directory exists, before the first remaining epoch
      on_epoch_start                per epoch (``trainer.epoch``: 0-based)
        on_train_batch_end          per optimization step: losses [loss, loc, cls], None for a skipped step
      on_val_end                    when the epoch was validated (``metrics``; best_map/best_epoch updated)
      on_epoch_end                  after last.pt (and best.pt) were saved: ``row`` is the results.csv row
    on_fit_end                      after the last epoch, or the one early stopping ended the run at
    on_teardown                     always, however the run ends (close files here)

A callback stops the run after the current epoch with ``trainer.stop(reason)``; called by ``on_val_end`` or an
earlier hook, the reason is also saved in that epoch's ``last.pt``, so ``--resume`` keeps the run stopped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ssd.data.mosaic import close_mosaic_epochs, mosaic_probability
from ssd.errors import CallbackError
from ssd.limits import value_text
from ssd.log import LOGGER
from ssd.names import did_you_mean

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["Callback", "EarlyStopping", "MosaicSchedule", "HOOKS", "check_callbacks"]

HOOKS = ("on_train_start", "on_epoch_start", "on_train_batch_end", "on_val_end", "on_epoch_end", "on_fit_end",
         "on_teardown")


class Callback:
    """Base class with a no-op method per hook (see the module docstring for when each runs)."""

    def on_train_start(self, trainer: Trainer) -> None:
        pass

    def on_epoch_start(self, trainer: Trainer) -> None:
        pass

    def on_train_batch_end(self, trainer: Trainer, step: int, losses: list[float] | None) -> None:
        pass

    def on_val_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        pass

    def on_epoch_end(self, trainer: Trainer, row: dict[str, Any]) -> None:
        pass

    def on_fit_end(self, trainer: Trainer) -> None:
        pass

    def on_teardown(self, trainer: Trainer) -> None:
        pass


class EarlyStopping(Callback):
    """Stop once ``patience`` epochs passed since the best validation mAP (checked at each validation; every rank
    sees the same gathered metrics, so all stop together)."""

    def __init__(self, patience: int) -> None:
        self.patience = patience

    def on_val_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        state = trainer.state
        waited = state.epoch + 1 - state.best_epoch
        if waited >= self.patience:
            trainer.stop(f"early stopping after epoch {state.epoch + 1}: no {trainer.config.metric} mAP "
                         f"improvement in the {waited} epochs since epoch {state.best_epoch} (best "
                         f"{state.best_map:.4f}, saved in weights/best.pt); --patience {self.patience}")


class MosaicSchedule(Callback):
    """``--mosaic`` until the last ``--close-mosaic`` epochs: sets the train loader's sampler at every epoch start
    from the epoch and the current ``trainer.epochs`` (so it holds after ``--resume`` and when ``epochs`` changes
    during the run); the sampler, in the main process, hands the probability to the workers in each item's key."""

    def __init__(self) -> None:
        self.probability: float | None = None

    def on_epoch_start(self, trainer: Trainer) -> None:
        config = trainer.config
        probability = mosaic_probability(config.mosaic, trainer.epoch, trainer.epochs, config.close_mosaic)
        trainer.train_loader.sampler.set_mosaic(probability)
        if probability != self.probability:
            closed = close_mosaic_epochs(config.close_mosaic, trainer.epochs)
            LOGGER.info(f"mosaic {probability:g} for epochs {trainer.epoch + 1}-{trainer.epochs - closed}, off for the "
                        f"last {closed} (--close-mosaic)" if probability else
                        f"mosaic off from epoch {trainer.epoch + 1} of {trainer.epochs} (--close-mosaic {closed})")
        self.probability = probability


def check_callbacks(callbacks: Sequence[Callback]) -> None:
    """Refuse, before anything runs: a class given instead of an instance, an object that lacks one of the
    :data:`HOOKS`, and a method named like a hook that is none (``on_epoch_ends`` would never be called), naming the
    closest hooks.

    Raises:
        CallbackError: naming the callback, what is wrong and what to do.
    """
    for callback in callbacks:
        if isinstance(callback, type):
            raise CallbackError(f"callback {callback.__name__} is a class: pass an instance of it, "
                                f"{callback.__name__}(...)")
        missing = [hook for hook in HOOKS if not callable(getattr(callback, hook, None))]
        if missing:
            raise CallbackError(f"callback {value_text(callback)} lacks {', '.join(missing)}: subclass "
                                "ssd.training.callbacks.Callback")
        for name in dir(callback):  # on_* is the hooks' name space: another name there is a typo or never called
            if name.startswith("on_") and name not in HOOKS:
                raise CallbackError(f"callback {type(callback).__name__} has a method {name}, which is not a hook "
                                    f"and would never be called{did_you_mean(name, HOOKS)} (a helper of its own "
                                    "needs a name that does not start with on_)")

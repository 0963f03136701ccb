"""The training loop: :func:`train` takes a dataset to a run directory (:mod:`ssd.training.outputs` describes it).

Extension points are callbacks (:mod:`ssd.training.callbacks`); the run directory's files are written by the output
callbacks of :mod:`ssd.training.outputs` on rank 0, the checkpoints by the trainer. Reproducibility: all random
state of an epoch (data order, augmentation, worker seeds) is derived from ``(seed, epoch, rank)`` at the start of
that epoch, so a run resumed from ``last.pt`` sees the same batches as an uninterrupted one and, on CPU, ends with
identical weights (and EMA). Nothing non-finite is ever saved (:func:`ssd.training.state.check_finite`).
"""

from __future__ import annotations

import itertools
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

import ssd.distributed as ddp
from ssd.data.balance import class_counts, class_weights
from ssd.data.crops import MIN_VISIBLE, describe_plan, parse_crop_scale
from ssd.data.gate import load_training_data
from ssd.data.load import validation_split
from ssd.data.loader import plain_data_errors
from ssd.data.records import DatasetSpec
from ssd.device import prepare_model
from ssd.errors import ConfigError, DataError
from ssd.evaluation.evaluator import evaluate_split, split_loader
from ssd.files import make_run_dir
from ssd.log import LOGGER, progress
from ssd.loss import MultiBoxLoss
from ssd.models.finetune import set_backbone_trainable
from ssd.training.budget import TimeBudget
from ssd.training.callbacks import Callback, EarlyStopping, MosaicSchedule, check_callbacks
from ssd.training.config import TrainConfig
from ssd.training.mlflow_log import MLflowLogger
from ssd.training.optim import batch_loss, build_ema, build_optimization, resize_schedule, validation_loss
from ssd.training.outputs import output_callbacks, prepare_run_dir
from ssd.training.plan import build_run_model, check_resumed_data, given_fields, plan_run
from ssd.training.preview import train_loader
from ssd.training.state import (
    TrainState,
    check_finite,
    epoch_seed,
    nonfinite_loss_error,
    restore_training_state,
    save_training_state,
    seed_everything,
    validation_operating_point,
)

__all__ = ["train", "Trainer", "TrainResult"]


@dataclass
class TrainResult:
    """What :func:`train` returns. ``metrics`` are those of the last validation, ``history`` the rows of
    ``results.csv``, ``step_losses`` the loss of every step this process ran (not those before a resume);
    ``model`` is the trained model (unwrapped, on the training device; the EMA with ``ema``), ``stop_reason``
    why the run ended before its last epoch (None when it did not)."""

    run_dir: Path
    best_map: float
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    step_losses: list[float] = field(default_factory=list, repr=False)
    nonfinite_skipped: int = 0
    model: nn.Module | None = field(default=None, repr=False)
    stop_reason: str | None = None


def train(config: TrainConfig | None = None, *, callbacks: Sequence[Callback] = (), **overrides: Any) -> TrainResult:
    """Check the data, build the model from the dataset's class names, train, validate, write the run directory.

    ``config`` defaults to ``TrainConfig()``; keyword ``overrides`` are applied on top (unknown keys are refused
    with the closest names). ``callbacks`` (:class:`~ssd.training.callbacks.Callback`) run on every process after
    the built-in ones. Launched by ``torchrun``, every process calls this; only rank 0 writes files.
    """
    base = config or TrainConfig()
    config = base.update(**overrides)
    info, device, created = ddp.setup(config.device)
    try:
        with plain_data_errors():
            return Trainer(config, info, device, given=given_fields(base, overrides), callbacks=callbacks).run()
    finally:
        ddp.cleanup(created)


class Trainer:
    """One training run (what :func:`train` drives): data, model, optimizer and schedule are set up on construction
    (``given``: the fields the caller set, see :func:`ssd.training.plan.plan_run`); :meth:`run` trains all remaining
    epochs into the run directory, :meth:`train_step` does one step. ``callbacks`` run after the built-in ones.

    ``state`` (:class:`~ssd.training.state.TrainState`) is the run's training state, what its checkpoints save;
    callbacks read it and change the run through :meth:`stop` and :meth:`set_epochs`. ``epochs`` is the run's epoch
    count: ``config.epochs``, or under ``--time`` the estimate of :class:`~ssd.training.budget.TimeBudget`, updated
    after every epoch's training steps; epoch-based features read it at each epoch start. ``clock`` (seconds,
    monotonic) times the run: :meth:`elapsed`, results.csv's ``time``."""

    clock = staticmethod(time.monotonic)

    def __init__(self, config: TrainConfig, info: ddp.DistInfo, device: torch.device, *,
                 given: set[str] | None = None, callbacks: Sequence[Callback] = ()) -> None:
        self.info, self.device = info, device
        self.plan = plan_run(config, given_fields(config) if given is None else given)
        self.config = config = self.plan.config
        self.run_dir = self.plan.run_dir
        check_callbacks(callbacks)  # the built-in output callbacks write on rank 0 only
        self.callbacks = [*(output_callbacks() if info.is_main else []),
                          *([EarlyStopping(config.patience)] if config.patience else []),
                          *([MosaicSchedule()] if config.mosaic else []),
                          *([TimeBudget(config.time)] if config.time else []),
                          *([MLflowLogger(config.mlflow)] if config.mlflow else []), *callbacks]
        seed_everything(config.seed)
        spec = load_training_data(config.data, skip_invalid=config.skip_invalid, recheck=config.recheck)
        self.class_names = list(spec.class_names)
        self.category_ids = getattr(spec, "category_ids", None)  # the dataset's own ids (COCO), for predictions
        self.train_records, self.val_records = validation_split(spec, config.val_fraction, config.seed)
        if self.plan.state is not None:
            check_resumed_data(self.plan, self.class_names, len(self.train_records))
        self._setup_model(spec)
        self.optimizer, self.scheduler, self.scaler, self.amp_dtype = build_optimization(
            self.model, config, self.steps, self.device)
        self.ema = build_ema(self.model, config.ema_decay) if config.ema else None
        self.state = (TrainState(config.epochs) if self.plan.state is None else
                      restore_training_state(self, self.plan.state))
        self.step_losses: list[float] = []
        self.net: nn.Module = self.model
        if info.enabled:
            self.net = nn.parallel.DistributedDataParallel(  # a frozen backbone leaves parameters without gradients
                self.model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=config.freeze != "none")
        if config.compile:
            self.net = torch.compile(self.net)

    def _setup_model(self, spec: DatasetSpec) -> None:
        config, info = self.config, self.info
        model = build_run_model(self.plan, spec)
        self.plan = replace(self.plan, pretrained=None)  # the weights' checkpoint is in the model now
        if info.enabled and config.sync_bn:
            if self.device.type != "cuda":
                raise ConfigError("sync_bn needs CUDA devices (SyncBatchNorm has no CPU implementation)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model, self.channels_last = prepare_model(model, self.device, config.channels_last)
        self.priors = self.model.priors
        self.loss_fn = MultiBoxLoss(variances=self.model.config.variances, class_weights=self._class_weights())
        mc = self.model.config
        self.train_loader = train_loader(self.train_records, self.class_names, mc, config, info)
        plan = self.train_loader.dataset.dataset.decode_plan
        if plan is not None:
            LOGGER.info(describe_plan(plan, parse_crop_scale(config.crop_scale), mc.image_size, config.cache_images))
        self.val_loader = split_loader(self.val_records, self.class_names, mc, batch_size=config.batch_size,
                                       workers=config.workers, cache_images=config.cache_images, info=info)
        self.steps = ddp.steps_per_epoch(len(self.train_records), config.batch_size, info.world_size)
        if self.steps == 0:
            raise DataError(f"{config.data}: the train split has {len(self.train_records)} image(s), fewer than one "
                            f"batch of {config.batch_size} per process; lower batch_size")

    def _class_weights(self) -> list[float] | None:
        """``--class-weights auto``: from the training split's objects (logged), else None."""
        if self.config.class_weights == "none":
            return None
        weights = class_weights(class_counts(self.train_records, len(self.class_names)))
        LOGGER.info("class weights: " + ", ".join(f"{n} {w:.3g}" for n, w in zip(self.class_names, weights[1:])))
        return weights

    @property
    def eval_model(self) -> nn.Module:
        """The weights that are evaluated and saved as ``model``: the EMA with ``ema``, else the trained model."""
        return self.model if self.ema is None else self.ema.module

    def elapsed(self) -> float:
        """Seconds this run has trained (during :meth:`run`), the time before a ``--resume`` included."""
        return self.clock() - self.start_time

    @property
    def epoch(self) -> int:
        """The current epoch, 0-based (``state.epoch``)."""
        return self.state.epoch

    @property
    def epochs(self) -> int:
        """The run's epoch count (``state.epochs``; :meth:`set_epochs` changes it)."""
        return self.state.epochs

    def stop(self, reason: str) -> None:
        """End the run after the current epoch (its checkpoints and row are still written) for ``reason``."""
        self.state.stop_reason = reason
        LOGGER.info(reason)

    def set_epochs(self, epochs: int) -> None:
        """Make the run ``epochs`` long (``--time``'s estimate), the lr schedule sized to it."""
        if epochs != self.state.epochs:
            self.state.epochs = epochs
            resize_schedule(self.scheduler, self.config, epochs, self.steps)

    def _hook(self, name: str, *args: Any) -> None:
        for callback in self.callbacks:
            getattr(callback, name)(self, *args)

    # -------------------------------------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train the remaining epochs (until early stopping); ``on_teardown`` runs however the run ends."""
        config = self.config
        if self.run_dir is None:
            self.run_dir = ddp.broadcast_object(make_run_dir(config.project, config.name, config.exist_ok)
                                                if self.info.is_main else None)
        lock = prepare_run_dir(self.run_dir, config) if self.info.is_main else None
        state = self.state
        stopped = state.stop_reason
        self.start_time = self.clock() - (state.history[-1]["time"] if state.history else 0.0)
        try:
            self._hook("on_train_start")  # may set the epoch count (--time)
            if stopped:
                LOGGER.info(f"{self.run_dir} already stopped: {stopped}")
            elif state.start_epoch >= state.epochs and not state.stop_reason:
                LOGGER.info(f"{self.run_dir}: all {state.epochs} epochs are already done")
            epoch = state.start_epoch
            while epoch < state.epochs and not state.stop_reason:
                state.epoch = epoch
                self._epoch(epoch)
                epoch += 1
            self._hook("on_fit_end")
            LOGGER.info(f"results saved to {self.run_dir} (best {config.metric} mAP {state.best_map:.4f})")
        finally:
            self._hook("on_teardown")
            if lock is not None:
                lock.release()
        return TrainResult(self.run_dir, state.best_map, state.metrics, state.history, self.step_losses,
                           state.nonfinite_skipped, self.eval_model, state.stop_reason)

    def _epoch(self, epoch: int) -> None:
        """Train one epoch, validate when due, save ``last.pt`` (and ``best.pt``), log the row."""
        config, state = self.config, self.state
        self._hook("on_epoch_start")
        skipped = state.nonfinite_skipped
        losses = self._train_epoch(epoch)
        ddp.broadcast_buffers(self.model)
        if self.ema is not None:  # its BatchNorm statistics averaged each rank's own batches
            ddp.broadcast_buffers(self.ema.module)
        check_finite(self.model, epoch, self.steps, state.nonfinite_skipped - skipped, state.nonfinite_skipped)
        row = {"epoch": epoch + 1, **losses, "lr": self.optimizer.param_groups[0]["lr"]}
        improved = False
        if epoch == state.epochs - 1 or (epoch + 1) % config.val_interval == 0:
            row.update(self._validate())
            improved = state.metrics["map"] > state.best_map
            if improved:
                state.best_map, state.best_epoch = state.metrics["map"], epoch + 1
            self._hook("on_val_end", state.metrics)
        row["time"] = self.elapsed()
        state.history.append(row)
        if self.info.is_main:
            save_training_state(self, self.run_dir / "weights" / "last.pt", resume=True)
            if improved:
                save_training_state(self, self.run_dir / "weights" / "best.pt", resume=False)
        ddp.barrier()
        self._hook("on_epoch_end", row)

    def _validate(self) -> dict[str, float]:
        """Score the validation split with :attr:`eval_model` (``state.metrics``) and its loss; the row's values."""
        config, model, state = self.config, self.eval_model, self.state
        state.metrics = evaluate_split(model, self.val_loader, class_names=self.class_names, metric=config.metric,
                                      device=self.device, channels_last=self.channels_last,
                                      score_threshold=config.score_threshold, iou_threshold=config.iou_threshold,
                                      amp_dtype=self.amp_dtype, progress=self.info.is_main and not config.quiet)
        losses = validation_loss(model, self.val_loader, self.loss_fn, self.device, channels_last=self.channels_last,
                                 amp_dtype=self.amp_dtype)
        state.operating_point = point = validation_operating_point(state.metrics, self.class_names)
        scores = {} if point is None else {"val/precision": point["precision"], "val/recall": point["recall"]}
        return {**losses, "val/mAP": state.metrics["map"], **scores}

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        config = self.config
        seed_everything(epoch_seed(config.seed, epoch, self.info.rank))
        self.train_loader.sampler.set_epoch(epoch)
        self.net.train()
        if config.freeze == "backbone":  # frozen for freeze_epochs epochs (None: the whole run)
            set_backbone_trainable(self.model, config.freeze_epochs is not None and epoch >= config.freeze_epochs)
        totals = torch.zeros(3, dtype=torch.float64)
        steps = crop_dropped = 0
        tic = time.perf_counter()
        with progress(itertools.islice(self.train_loader, self.steps), total=self.steps, leave=True, dynamic_ncols=True,
                  desc=f"epoch {epoch + 1}/{self.epochs}", disable=config.quiet or not self.info.is_main) as bar:
            for step, batch in enumerate(bar):
                crop_dropped += batch["crop_dropped"]
                values = self.train_step(batch, epoch, step)
                self._hook("on_train_batch_end", step, values)
                if values is None:
                    continue
                totals += torch.tensor(values, dtype=torch.float64)
                self.step_losses.append(values[0])
                steps += 1
                if not bar.disable:
                    rate = (step + 1) * config.batch_size * self.info.world_size / (time.perf_counter() - tic)
                    bar.set_postfix(loss=f"{totals[0].item() / steps:.3f}", img_s=f"{rate:.0f}",
                                    lr=f"{self.optimizer.param_groups[0]['lr']:.2e}")
        mean = (totals / max(steps, 1)).tolist()
        crops = {}
        if config.crop_scale is not None:
            LOGGER.info(f"epoch {epoch + 1}: the crops cut and dropped {crop_dropped} object(s) with less than "
                     f"{MIN_VISIBLE:.0%} of their box (or of the crop) inside")
            crops = {"crop_dropped": crop_dropped}
        return {"train/loss": mean[0], "train/loc_loss": mean[1], "train/cls_loss": mean[2],
                "nonfinite_skipped": self.state.nonfinite_skipped, **crops}

    def train_step(self, batch: dict[str, Any], epoch: int = 0, step: int = 0) -> list[float] | None:
        """One optimization step on a :func:`ssd.data.collate` batch: forward, loss, backward, clipping, optimizer,
        lr schedule and EMA update. Returns ``[loss, loc_loss, cls_loss]``, or None when the step was skipped because
        the loss was not finite on some rank (raises :class:`~ssd.errors.NonFiniteLossError` unless
        ``skip_nonfinite``)."""
        self.optimizer.zero_grad(set_to_none=True)
        loc_loss, cls_loss = batch_loss(self.net, self.loss_fn, self.priors, batch, self.device,
                                        channels_last=self.channels_last, amp_dtype=self.amp_dtype)
        loss = loc_loss + cls_loss
        if ddp.any_true(not bool(torch.isfinite(loss)), self.device):
            where = f"epoch {epoch + 1}, step {step + 1} (iteration {epoch * self.steps + step + 1})"
            if not self.config.skip_nonfinite:
                raise nonfinite_loss_error(where, loss.item(), batch["paths"])
            self.state.nonfinite_skipped += 1
            LOGGER.info(f"skipped a non-finite loss at {where} ({self.state.nonfinite_skipped} so far)")
            with warnings.catch_warnings():  # the schedule counts skipped steps on purpose: no optimizer step is due
                warnings.filterwarnings("ignore", r"Detected call of `lr_scheduler\.step\(\)` before", UserWarning)
                self.scheduler.step()
            return None
        self.scaler.scale(loss).backward()
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update_parameters(self.model)
        return torch.stack([loss, loc_loss, cls_loss]).detach().tolist()


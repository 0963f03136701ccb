"""The training loop: :func:`train` takes a dataset to a run directory (:mod:`ssd.training.run` describes it).

Reproducibility: all random state of an epoch (data order, augmentation, worker seeds) is derived from
``(seed, epoch, rank)`` at the start of that epoch, so a run resumed from ``last.pt`` sees the same batches as an
uninterrupted one and, on CPU, ends with identical weights. Nothing non-finite is ever saved: a run whose weights
hold NaN/inf, or that skipped too many non-finite steps, stops with :class:`NonFiniteLossError`.
"""

from __future__ import annotations

import itertools
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

import ssd.distributed as ddp
from ssd._utils import few
from ssd.data import build_dataloader
from ssd.data.load import load_training_data, validation_split
from ssd.data.records import DataError, DatasetSpec
from ssd.device import amp_dtype, autocast, prepare_model
from ssd.evaluation.evaluator import evaluate_split, split_loader
from ssd.loss import MultiBoxLoss
from ssd.models import set_backbone_trainable
from ssd.settings import ConfigError
from ssd.training.config import TrainConfig
from ssd.training.optim import LRSchedule, build_optimizer
from ssd.training.plan import build_run_model, check_resumed_data, given_fields, plan_run
from ssd.training.run import (
    RunOutput,
    checkpoint_metrics,
    epoch_seed,
    make_run_dir,
    plain_data_errors,
    rng_state,
    seed_everything,
    set_rng_state,
)
from ssd.weights.checkpoint import save_checkpoint

__all__ = ["train", "Trainer", "TrainResult", "NonFiniteLossError", "NONFINITE_SHARE"]

NONFINITE_SHARE = 0.05
"""With ``skip_nonfinite``, a run stops once more than this share of its steps (and more than one) were skipped,
or when every step of an epoch was."""


class NonFiniteLossError(ValueError):
    """The loss or the weights became NaN/inf (the message says where, what was saved and what to try)."""


@dataclass
class TrainResult:
    """What :func:`train` returns. ``metrics`` are those of the last validation, ``history`` the rows of
    ``results.csv``, ``step_losses`` the loss of every step this process ran (not those before a resume);
    ``model`` is the trained model (unwrapped, on the training device)."""

    run_dir: Path
    best_map: float
    metrics: dict[str, Any]
    history: list[dict[str, Any]]
    step_losses: list[float] = field(default_factory=list, repr=False)
    nonfinite_skipped: int = 0
    model: nn.Module | None = field(default=None, repr=False)


def train(config: TrainConfig | None = None, **overrides: Any) -> TrainResult:
    """Check the data, build the model from the dataset's class names, train, validate, write the run directory.

    ``config`` defaults to ``TrainConfig()``; keyword ``overrides`` are applied on top (unknown keys are refused
    with the closest names). Launched by ``torchrun``, every process calls this; only rank 0 writes files.
    """
    base = config or TrainConfig()
    config = base.update(**overrides)
    info, device, created = ddp.setup(config.device)
    try:
        with plain_data_errors():
            return Trainer(config, info, device, given=given_fields(base, overrides)).run()
    finally:
        ddp.cleanup(created)


class Trainer:
    """One training run (what :func:`train` drives): data, model, optimizer and schedule are set up on construction
    (``given``: the fields the caller set, see :func:`ssd.training.plan.plan_run`); :meth:`run` trains all remaining
    epochs into the run directory, :meth:`train_step` does one step."""

    def __init__(self, config: TrainConfig, info: ddp.DistInfo, device: torch.device, *,
                 given: set[str] | None = None) -> None:
        self.info, self.device = info, device
        self.log = print if info.is_main else (lambda *a, **k: None)
        self.plan = plan_run(config, given_fields(config) if given is None else given, self.log)
        self.config = config = self.plan.config
        self.run_dir = self.plan.run_dir
        seed_everything(config.seed)
        spec = load_training_data(config.data, skip_invalid=config.skip_invalid, log=self.log)
        self.class_names = list(spec.class_names)
        self.category_ids = getattr(spec, "category_ids", None)  # the dataset's own ids (COCO), for predictions
        self.train_records, self.val_records = validation_split(spec, config.val_fraction, config.seed, self.log)
        if self.plan.state is not None:
            check_resumed_data(self.plan, self.class_names, len(self.train_records))
        self._setup_model(spec)
        self._setup_optimization()
        self.start_epoch, self.best_map, self.history, self.nonfinite = 0, -1.0, [], 0
        self.metrics: dict[str, Any] = {}
        self.step_losses: list[float] = []
        if self.plan.state is not None:
            self._restore(self.plan.state)
        self.net: nn.Module = self.model
        if info.enabled:
            self.net = nn.parallel.DistributedDataParallel(  # a frozen backbone leaves parameters without gradients
                self.model, device_ids=[device.index] if device.type == "cuda" else None,
                find_unused_parameters=config.freeze != "none")
        if config.compile:
            self.net = torch.compile(self.net)

    def _setup_model(self, spec: DatasetSpec) -> None:
        config, info = self.config, self.info
        model = build_run_model(self.plan, spec, self.log)
        if info.enabled and config.sync_bn:
            if self.device.type != "cuda":
                raise ConfigError("sync_bn needs CUDA devices (SyncBatchNorm has no CPU implementation)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model, self.channels_last = prepare_model(model, self.device, config.channels_last)
        self.priors = self.model.priors
        self.loss_fn = MultiBoxLoss(variances=self.model.config.variances)
        mc = self.model.config
        self.train_loader = build_dataloader(
            self.train_records, self.class_names, mc.image_size, mc.mean, mc.std, train=True,
            batch_size=config.batch_size, workers=config.workers, seed=config.seed, augment=config.augment,
            cache_images=config.cache_images, drop_last=True, rank=info.rank, world_size=info.world_size)
        self.val_loader = split_loader(self.val_records, self.class_names, mc, batch_size=config.batch_size,
                                       workers=config.workers, cache_images=config.cache_images, info=info)
        self.steps = ddp.steps_per_epoch(len(self.train_records), config.batch_size, info.world_size)
        if self.steps == 0:
            raise DataError(f"{config.data}: the train split has {len(self.train_records)} image(s), fewer than one "
                            f"batch of {config.batch_size} per process; lower batch_size")

    def _setup_optimization(self) -> None:
        self.optimizer = build_optimizer(self.model, self.config)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, LRSchedule.from_config(self.config,
                                                                                                  self.steps))
        self.amp_dtype = amp_dtype(self.device) if self.config.amp else None
        if self.config.amp and self.amp_dtype is None:
            self.log(f"amp: {self.device} has no fast bfloat16/float16 path; training in float32")
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)

    # ------------------------------------------------------------------------------------------------- state
    def _restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint's training state (the model was built from it)."""
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.start_epoch = state["epoch"] + 1
        self.best_map = state["best_map"]
        self.history = list(state["history"])
        self.metrics = dict(state["metrics"])
        self.nonfinite = state["nonfinite_skipped"]

    def _save(self, path: Path, epoch: int) -> None:
        save_checkpoint(path, self.model, optimizer=self.optimizer.state_dict(),
                        scheduler=self.scheduler.state_dict(), scaler=self.scaler.state_dict(), epoch=epoch,
                        rng=rng_state(), metrics=checkpoint_metrics(self.metrics), best_map=self.best_map,
                        history=self.history, nonfinite_skipped=self.nonfinite,
                        train_config=self.config.to_dict(), train_images=len(self.train_records),
                        category_ids=self.category_ids)

    # -------------------------------------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        """Train the remaining epochs; the TensorBoard writer and progress bars are closed however the run ends."""
        config, main = self.config, self.info.is_main
        if self.run_dir is None:
            self.run_dir = ddp.broadcast_object(make_run_dir(config.project, config.name, config.exist_ok)
                                                if main else None)
        if self.start_epoch >= config.epochs:
            self.log(f"{self.run_dir}: all {config.epochs} epochs are already done")
        self.start_time = time.perf_counter() - (self.history[-1]["time"] if self.history else 0.0)
        with RunOutput(self.run_dir, config, self.log) if main else nullcontext() as out:
            if main and self.plan.state is None:
                out.label_stats(self.train_records, self.class_names)
            for epoch in range(self.start_epoch, config.epochs):
                self._epoch(epoch, out)
            if main:
                out.finish(self.model, self.metrics, self.val_records, self.best_map)
        return TrainResult(self.run_dir, self.best_map, self.metrics, self.history, self.step_losses, self.nonfinite,
                           self.model)

    def _epoch(self, epoch: int, out: RunOutput | None) -> None:
        """Train one epoch, validate when due, save ``last.pt`` (and ``best.pt``), log the row."""
        config = self.config
        skipped = self.nonfinite
        losses = self._train_epoch(epoch)
        ddp.broadcast_buffers(self.model)
        self._check_finite(epoch, self.nonfinite - skipped)
        row = {"epoch": epoch + 1, **losses, "lr": self.optimizer.param_groups[0]["lr"]}
        if epoch == config.epochs - 1 or (epoch + 1) % config.val_interval == 0:
            self.metrics = evaluate_split(self.net, self.val_loader, class_names=self.class_names,
                                          metric=config.metric, device=self.device, channels_last=self.channels_last,
                                          score_threshold=config.score_threshold, iou_threshold=config.iou_threshold,
                                          amp_dtype=self.amp_dtype, progress=self.info.is_main and not config.quiet)
            row["val/mAP"] = self.metrics["map"]
        row["time"] = time.perf_counter() - self.start_time
        self.history.append(row)
        improved = bool(self.metrics) and self.metrics["map"] > self.best_map
        if improved:
            self.best_map = self.metrics["map"]
        if self.info.is_main:
            self._save(self.run_dir / "weights" / "last.pt", epoch)
            if improved:
                self._save(self.run_dir / "weights" / "best.pt", epoch)
            out.epoch(row, self.history)
        ddp.barrier()

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        config = self.config
        seed_everything(epoch_seed(config.seed, epoch, self.info.rank))
        self.train_loader.sampler.set_epoch(epoch)
        self.net.train()
        if config.freeze == "backbone":  # frozen for freeze_epochs epochs (None: the whole run)
            set_backbone_trainable(self.model, config.freeze_epochs is not None and epoch >= config.freeze_epochs)
        totals = torch.zeros(3, dtype=torch.float64)
        steps = 0
        tic = time.perf_counter()
        with tqdm(itertools.islice(self.train_loader, self.steps), total=self.steps, leave=True, dynamic_ncols=True,
                  desc=f"epoch {epoch + 1}/{config.epochs}", disable=config.quiet or not self.info.is_main) as bar:
            for step, batch in enumerate(bar):
                values = self.train_step(batch, epoch, step)
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
        return {"train/loss": mean[0], "train/loc_loss": mean[1], "train/cls_loss": mean[2],
                "nonfinite_skipped": self.nonfinite}

    def train_step(self, batch: dict[str, Any], epoch: int = 0, step: int = 0) -> list[float] | None:
        """One optimization step on a :func:`ssd.data.collate` batch: forward, loss, backward, clipping, optimizer
        and lr schedule. Returns ``[loss, loc_loss, cls_loss]``, or None when the step was skipped because the loss
        was not finite on some rank (raises :class:`NonFiniteLossError` unless ``skip_nonfinite``)."""
        self.optimizer.zero_grad(set_to_none=True)
        loc_loss, cls_loss = self._forward(batch)
        loss = loc_loss + cls_loss
        if ddp.any_true(not bool(torch.isfinite(loss)), self.device):
            self._nonfinite(epoch, step, loss, batch)
            self.scheduler.step()
            return None
        self.scaler.scale(loss).backward()
        if self.config.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        return torch.stack([loss, loc_loss, cls_loss]).detach().tolist()

    def _forward(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        images = batch["images"].to(self.device, non_blocking=True).contiguous(memory_format=memory_format)
        boxes, labels = batch["boxes"].to(self.device), batch["labels"].to(self.device)
        with autocast(self.device, self.amp_dtype):
            loc, logits = self.net(images)
        return self.loss_fn(loc.float(), logits.float(), self.priors, boxes, labels)

    def _nonfinite(self, epoch: int, step: int, loss: Tensor, batch: dict[str, Any]) -> None:
        where = f"epoch {epoch + 1}, step {step + 1} (iteration {epoch * self.steps + step + 1})"
        if self.config.skip_nonfinite:
            self.nonfinite += 1
            self.log(f"skipped a non-finite loss at {where} ({self.nonfinite} so far)")
            return
        files = "\n".join(f"  {p}" for p in batch["paths"])
        raise NonFiniteLossError(
            f"non-finite loss ({loss.item()}) at {where}; nothing was saved for this step. The batch's images:\n"
            f"{files}\nCheck these files' boxes (`ssd check`), lower lr, or set skip_nonfinite to skip such steps.")

    def _check_finite(self, epoch: int, skipped: int) -> None:
        """Stop before anything is saved for ``epoch`` when it skipped every step, the run skipped more than
        :data:`NONFINITE_SHARE` of its steps (and more than one), or the weights hold NaN/inf (same on every rank)."""
        done = (epoch + 1) * self.steps
        kept = f"weights/last.pt holds epoch {epoch}" if epoch else "nothing was saved"
        if skipped == self.steps or self.nonfinite > max(1, NONFINITE_SHARE * done):
            which = (f"every step of epoch {epoch + 1} ({skipped})" if skipped == self.steps else
                     f"more than the {NONFINITE_SHARE:.0%} skip_nonfinite tolerates")
            raise NonFiniteLossError(
                f"training diverged: {self.nonfinite} of {done} steps ({self.nonfinite / done:.1%}) had a non-finite "
                f"loss and were skipped, {which}. The run stopped before saving epoch {epoch + 1} ({kept}). Lower "
                "lr, check the data (`ssd check`), or train without amp.")
        bad = [name for name, t in self.model.state_dict().items()
               if t.is_floating_point() and not bool(torch.isfinite(t).all())]
        if bad:
            raise NonFiniteLossError(
                f"training diverged: after epoch {epoch + 1} the weights hold NaN/inf ({few(bad)}). Nothing was saved "
                f"for this epoch ({kept}). Lower lr, keep gradient clipping on (grad_clip), or check the data "
                "(`ssd check`).")

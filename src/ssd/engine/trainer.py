"""The training loop: ``train(config)`` from a dataset to a run directory, ``evaluate(weights, data)``.

A run directory ``<project>/<name>`` (auto-incremented, never overwritten) holds::

    config.yaml        the resolved TrainConfig (everything needed to reproduce the run)
    results.csv        one row per epoch (columns: ssd.engine.plots.RESULTS_COLUMNS)
    results.png        loss and mAP curves
    pr_curves.png      per-class precision/recall curves of the last validation
    labels.png         label and box statistics of the training split
    val_predictions/   a few validation images with predictions drawn
    events.out.*       TensorBoard scalars
    weights/last.pt    after every epoch (model, optimizer, scheduler, scaler, epoch, RNG, history)
    weights/best.pt    at the best validation mAP

Reproducibility: all random state of an epoch (data order, augmentation, worker seeds) is derived from
``(seed, epoch, rank)`` at the start of that epoch, so a run resumed from ``last.pt`` sees the same batches as an
uninterrupted one and, on CPU, ends with identical weights.
"""

from __future__ import annotations

import csv
import itertools
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from ssd._utils import unwrap_model
from ssd.checkpoint import load_checkpoint, remove_stale_temporaries, save_checkpoint
from ssd.config import ConfigError, TrainConfig
from ssd.data import build_dataloader
from ssd.data.load import load_training_data
from ssd.data.records import DataError
from ssd.engine import distributed as ddp
from ssd.engine.evaluator import evaluate_detections, merge_results, predict_dataset, save_coco_json
from ssd.engine.plots import (RESULTS_COLUMNS, draw_detections, plot_label_stats, plot_pr_curves, plot_results,
                              save_image)
from ssd.loss import MultiBoxLoss
from ssd.models import build_model, model_from_checkpoint
from ssd.models.config import ModelConfig

__all__ = ["train", "evaluate", "Trainer", "TrainResult", "NonFiniteLossError", "find_checkpoint"]


class NonFiniteLossError(ValueError):
    """The loss became NaN/inf (the message names the epoch, the step and the batch's image files)."""


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


# ----------------------------------------------------------------------------------------------------- helpers
def find_checkpoint(resume: str | Path) -> Path:
    """``last.pt`` of a run directory (or the checkpoint file itself)."""
    path = Path(resume)
    if path.is_dir():
        for candidate in (path / "weights" / "last.pt", path / "last.pt"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"cannot resume from {path}: no weights/last.pt inside")
    if not path.is_file():
        raise FileNotFoundError(f"cannot resume from {path}: no such run directory or checkpoint")
    return path


def make_run_dir(project: str | Path, name: str, exist_ok: bool = False) -> Path:
    """``project/name``, or ``name2``, ``name3``, ... when taken (created here, so concurrent runs never share one)."""
    project = Path(project)
    project.mkdir(parents=True, exist_ok=True)
    index = 1
    while True:
        path = project / (name if index == 1 else f"{name}{index}")
        try:
            path.mkdir(exist_ok=exist_ok)
            return path
        except FileExistsError:
            index += 1


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
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


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on conv/linear weights only; none on biases and normalization parameters (all 1-d tensors)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim <= 1 else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    groups = param_groups(model, config.weight_decay)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr, betas=(config.momentum, 0.999))
    return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)


@dataclass(frozen=True)
class LRSchedule:
    """Multiplier of the peak lr at iteration ``it``: linear warmup from ``warmup_start``, then cosine down to
    ``final_ratio`` at the last iteration, or ``gamma ** (milestones passed)`` (milestones in iterations)."""

    total: int
    warmup: int
    kind: str
    final_ratio: float = 0.01
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    warmup_start: float = 0.01

    def __call__(self, it: int) -> float:
        if it < self.warmup:
            return self.warmup_start + (1 - self.warmup_start) * it / self.warmup
        if self.kind == "multistep":
            return self.gamma ** sum(it >= m for m in self.milestones)
        progress = min(1.0, (it - self.warmup) / max(1, self.total - self.warmup))
        return self.final_ratio + (1 - self.final_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    @classmethod
    def from_config(cls, config: TrainConfig, iters_per_epoch: int) -> LRSchedule:
        total = config.epochs * iters_per_epoch
        warmup = config.warmup_iters if config.warmup_iters is not None else round(config.warmup_epochs * iters_per_epoch)
        return cls(total=total, warmup=min(warmup, total), kind=config.scheduler, final_ratio=config.final_lr_ratio,
                   milestones=tuple(m * iters_per_epoch for m in config.milestones), gamma=config.gamma)


# -------------------------------------------------------------------------------------------------------- data
def _records(spec, split: str, fallback: str | None = None):
    if split in spec.splits or fallback is None:
        return spec.records(split)
    return spec.records(fallback)


def make_loader(records, class_names, model_config: ModelConfig, *, train: bool, config: TrainConfig,
                info: ddp.DistInfo) -> DataLoader:
    """:func:`ssd.data.build_dataloader` for this run: order and augmentation are functions of ``(seed, epoch)``;
    under torchrun each rank takes every ``world_size``-th item (training and evaluation)."""
    return build_dataloader(records, class_names, model_config.image_size, model_config.mean,
                            model_config.std, train=train, batch_size=config.batch_size, workers=config.workers,
                            seed=config.seed, augment=config.augment if train else "none",
                            cache_images=config.cache_images, drop_last=train, rank=info.rank,
                            world_size=info.world_size, pin_memory=False)


def steps_per_epoch(num_images: int, batch_size: int, world_size: int) -> int:
    """Full batches of the smallest rank's share (every rank runs the same number of steps, as DDP requires)."""
    return (num_images // world_size) // batch_size


# ----------------------------------------------------------------------------------------------------- model
def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype for mixed precision on ``device``, or None where it would not help.

    CUDA: bfloat16 where supported, else float16 (with a gradient scaler). CPU: bfloat16 where oneDNN has native
    bfloat16 kernels (AVX512-BF16 / AMX), measured 2x faster per ``ssd_tiny`` training step on such a CPU.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if device.type == "cpu" and torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return torch.bfloat16
    return None


def prepare_model(model: nn.Module, device: torch.device, channels_last: bool | None) -> tuple[nn.Module, bool]:
    """Move to ``device`` and to channels_last when asked (``None``: as the model configuration says)."""
    if channels_last is None:
        channels_last = model.config.channels_last
    model = model.to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model, channels_last


def _build(config: TrainConfig, class_names: list[str], log) -> nn.Module:
    options = {"image_size": config.image_size} if config.image_size else {}
    if config.weights:
        model = model_from_checkpoint(config.weights, class_names=class_names, reinit_heads=True)
        log(f"weights: started from {config.weights}")
        return model
    return build_model(config.model, class_names=class_names, backbone_weights=config.backbone_weights, **options)


def validate(model: nn.Module, loader: DataLoader, *, metric: str, device: torch.device, channels_last: bool,
             score_threshold: float, iou_threshold: float, class_names: list[str], amp_dtype=None,
             progress: bool = False) -> dict[str, Any]:
    """Predict this rank's share of the split, gather every rank's per-image detections and score the full set
    (identical metrics on every rank). Runs the plain model: a DDP forward would sync buffers, a collective that
    ranks with different numbers of validation batches would not all join."""
    detections, ground_truths = predict_dataset(unwrap_model(model), loader, device=device, channels_last=channels_last,
                                                score_threshold=score_threshold, iou_threshold=iou_threshold,
                                                amp_dtype=amp_dtype, progress=progress)
    gathered = ddp.all_gather_objects((detections, ground_truths))
    return evaluate_detections(merge_results([d for d, _ in gathered]), merge_results([g for _, g in gathered]),
                               class_names, metric=metric)


# ------------------------------------------------------------------------------------------------------ train
def train(config: TrainConfig | None = None, **overrides: Any) -> TrainResult:
    """Validate the data, build the model from the dataset's class names, train, validate, write the run directory.

    ``config`` defaults to ``TrainConfig()``; keyword ``overrides`` are applied on top (unknown keys are refused
    with the closest names). Launched by ``torchrun``, every process calls this; only rank 0 writes files.
    """
    config = (config or TrainConfig()).update(**overrides)
    info, device, created = ddp.setup(config.device)
    try:
        return Trainer(config, info, device).run()
    finally:
        ddp.cleanup(created)


class Trainer:
    """One training run (what :func:`train` drives): data, model, optimizer, schedule and run directory are set up
    on construction; :meth:`run` trains all remaining epochs, :meth:`train_step` does one step."""

    def __init__(self, config: TrainConfig, info: ddp.DistInfo, device: torch.device) -> None:
        self.info, self.device = info, device
        self.log = print if info.is_main else (lambda *a, **k: None)
        self.resume_state: dict[str, Any] | None = None
        if config.resume:
            ckpt_path = find_checkpoint(config.resume)
            self.resume_state = load_checkpoint(ckpt_path)
            saved = TrainConfig.from_dict(self.resume_state["train_config"], source="key in checkpoint train_config")
            # the run continues as it was configured; only where/how loudly it runs may change
            config = saved.update(resume=str(ckpt_path), device=config.device, workers=config.workers,
                                  quiet=config.quiet)
            self.run_dir: Path = ckpt_path.parent.parent
            self.log(f"resuming {self.run_dir} from {ckpt_path} (epoch {self.resume_state['epoch'] + 1} done)")
        self.config = config = config.resolved()

        seed_everything(config.seed)
        spec = load_training_data(config.data, skip_invalid=config.skip_invalid, log=self.log)
        self.class_names = list(spec.class_names)
        self.train_records = spec.records("train")
        self.val_records = _records(spec, "val", fallback="test" if "test" in spec.splits else "train")

        model = _build(config, self.class_names, self.log)
        if info.enabled and config.sync_bn:
            if device.type != "cuda":
                raise ConfigError("sync_bn needs CUDA devices (SyncBatchNorm has no CPU implementation)")
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        self.model, self.channels_last = prepare_model(model, device, config.channels_last)
        self.priors = self.model.priors
        self.loss_fn = MultiBoxLoss(variances=self.model.config.variances)

        loader_args = dict(class_names=self.class_names, model_config=self.model.config, info=info, config=config)
        self.train_loader = make_loader(self.train_records, train=True, **loader_args)
        self.val_loader = make_loader(self.val_records, train=False, **loader_args)
        self.steps = steps_per_epoch(len(self.train_records), config.batch_size, info.world_size)
        if self.steps == 0:
            raise DataError(f"{config.data}: the train split has {len(self.train_records)} image(s), fewer than one "
                            f"batch of {config.batch_size} per process; lower batch_size")

        self.optimizer = build_optimizer(self.model, config)
        self.schedule = LRSchedule.from_config(config, self.steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self.schedule)
        self.amp_dtype = amp_dtype(device) if config.amp else None
        if config.amp and self.amp_dtype is None:
            self.log(f"amp: {device} has no fast bfloat16/float16 path; training in float32")
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype == torch.float16)

        self.start_epoch, self.best_map, self.history, self.nonfinite = 0, -1.0, [], 0
        self.metrics: dict[str, Any] = {}
        self.step_losses: list[float] = []
        if self.resume_state is not None:
            self._restore(self.resume_state)
        self.net: nn.Module = self.model
        if info.enabled:
            ids = [device.index] if device.type == "cuda" else None
            self.net = nn.parallel.DistributedDataParallel(self.model, device_ids=ids)
        if config.compile:
            self.net = torch.compile(self.net)

        if self.resume_state is None:
            self.run_dir = make_run_dir(config.project, config.name, config.exist_ok) if info.is_main else None
            self.run_dir = ddp.broadcast_object(self.run_dir)
        self.writer = None
        if info.is_main:
            (self.run_dir / "weights").mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(self.run_dir / "weights")  # left by a run killed while saving
            config.to_yaml(self.run_dir / "config.yaml")
            if self.resume_state is None:
                objects = [o for record in self.train_records for o in record.objects]
                plot_label_stats([o.box for o in objects], [o.label for o in objects], self.class_names,
                                 self.run_dir / "labels.png")
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(str(self.run_dir))

    # ------------------------------------------------------------------------------------------------- state
    def _restore(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
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
                        rng=rng_state(), metrics=_plain(self.metrics), best_map=self.best_map,
                        history=self.history, nonfinite_skipped=self.nonfinite,
                        train_config=self.config.to_dict())

    # -------------------------------------------------------------------------------------------------- loop
    def run(self) -> TrainResult:
        config, main = self.config, self.info.is_main
        if self.start_epoch >= config.epochs:
            self.log(f"{self.run_dir}: all {config.epochs} epochs are already done")
        start = time.perf_counter() - (self.history[-1]["time"] if self.history else 0.0)  # cumulative on resume
        for epoch in range(self.start_epoch, config.epochs):
            losses = self._train_epoch(epoch)
            ddp.broadcast_buffers(self.model)
            last = epoch == config.epochs - 1
            row = {"epoch": epoch + 1, **losses, "lr": self.optimizer.param_groups[0]["lr"]}
            if last or (epoch + 1) % config.val_interval == 0:
                self.metrics = validate(self.net, self.val_loader, metric=config.metric, device=self.device,
                                        channels_last=self.channels_last, score_threshold=config.score_threshold,
                                        iou_threshold=config.iou_threshold, class_names=self.class_names,
                                        amp_dtype=self.amp_dtype, progress=main and not config.quiet)
                row["val/mAP"] = self.metrics["map"]
            row["time"] = time.perf_counter() - start
            self.history.append(row)
            improved = bool(self.metrics) and self.metrics["map"] > self.best_map
            if improved:
                self.best_map = self.metrics["map"]
            if main:
                self._save(self.run_dir / "weights" / "last.pt", epoch)
                if improved:
                    self._save(self.run_dir / "weights" / "best.pt", epoch)
                self._log_epoch(row)
            ddp.barrier()
        if main:
            self._finish()
        return TrainResult(self.run_dir, self.best_map, self.metrics, self.history, self.step_losses, self.nonfinite,
                           self.model)

    def _train_epoch(self, epoch: int) -> dict[str, float]:
        config, loader = self.config, self.train_loader
        seed_everything(_epoch_seed(config.seed, epoch, self.info.rank))
        loader.sampler.set_epoch(epoch)
        self.net.train()
        totals = torch.zeros(3, dtype=torch.float64)
        steps = 0
        bar = tqdm(itertools.islice(loader, self.steps), total=self.steps, desc=f"epoch {epoch + 1}/{config.epochs}",
                   disable=config.quiet or not self.info.is_main, leave=True, dynamic_ncols=True)
        tic = time.perf_counter()
        for step, batch in enumerate(bar):
            values = self.train_step(batch, epoch, step)
            if values is None:
                continue
            totals += torch.tensor(values, dtype=torch.float64)
            self.step_losses.append(values[0])
            steps += 1
            if bar.disable:
                continue
            rate = (step + 1) * config.batch_size * self.info.world_size / (time.perf_counter() - tic)
            bar.set_postfix(loss=f"{totals[0].item() / steps:.3f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                            img_s=f"{rate:.0f}")
        bar.close()
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
        with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32, enabled=self.amp_dtype is not None):
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

    # ------------------------------------------------------------------------------------------------ output
    def _log_epoch(self, row: dict[str, Any]) -> None:
        write_results_csv(self.run_dir / "results.csv", self.history)
        for key, value in row.items():
            if key != "epoch":
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()
        if self.config.quiet:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "epoch" and isinstance(v, float))
            print(f"epoch {row['epoch']}/{self.config.epochs}: {shown}")
        elif "val/mAP" in row:
            print(f"epoch {row['epoch']}/{self.config.epochs}: {self.config.metric} mAP {row['val/mAP']:.4f}")

    def _finish(self) -> None:
        run_dir = self.run_dir
        plot_results(run_dir / "results.csv", run_dir / "results.png")
        if self.metrics:
            plot_pr_curves(self.metrics, self.class_names, run_dir / "pr_curves.png")
        self._draw_predictions(run_dir / "val_predictions")
        self.writer.close()
        self.log(f"results saved to {run_dir} (best {self.config.metric} mAP {self.best_map:.4f})")

    @torch.no_grad()
    def _draw_predictions(self, out_dir: Path) -> None:
        from ssd.data.images import read_image

        out_dir.mkdir(exist_ok=True)
        self.model.eval()
        for record in self.val_records[: self.config.num_plot_images]:
            image = read_image(record.path)
            found = self.model.predict([image.to(self.device)], score_threshold=0.3)[0]
            drawn = draw_detections(image, found["boxes"], found["labels"], found["scores"], self.class_names)
            save_image(drawn, out_dir / f"{record.path.stem}.jpg")


def write_results_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``results.csv`` from the run history (so a resumed run never holds duplicate epochs)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in RESULTS_COLUMNS})


def _plain(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics reduced to floats, lists and tensors (checkpoint-safe for ``weights_only`` loading)."""
    out = {}
    for key, value in metrics.items():
        if isinstance(value, (int, float, str)):
            out[key] = value
        elif isinstance(value, dict):
            out[key] = _plain(value)
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float, str)) for v in value):
            out[key] = list(value)
        elif isinstance(value, np.ndarray):
            out[key] = torch.from_numpy(value)
    return out


# --------------------------------------------------------------------------------------------------- evaluate
def evaluate(weights: str | Path, data: str | Path, metric: str = "voc07", split: str = "val", *,
             batch_size: int = 16, workers: int = 0, device: str = "auto", score_threshold: float = 0.01,
             iou_threshold: float = 0.45, skip_invalid: bool = False, save_json: str | Path | None = None
             ) -> dict[str, Any]:
    """Evaluate a checkpoint on a dataset split (validated first, like training).

    Returns the metrics dict of :func:`ssd.engine.evaluator.evaluate_detections` plus ``class_names``; the numbers
    equal those of the end of training for the same split and thresholds.
    """
    torch_device = ddp.resolve_device(device)
    model = model_from_checkpoint(weights)
    spec = load_training_data(data, skip_invalid=skip_invalid, class_names=list(model.class_names), splits=(split,))
    model, channels_last = prepare_model(model, torch_device, None)
    config = TrainConfig(batch_size=batch_size, workers=workers)
    loader = make_loader(spec.records(split), list(model.class_names), model.config, train=False, config=config,
                         info=ddp.DistInfo())
    metrics = validate(model, loader, metric=metric, device=torch_device, channels_last=channels_last,
                       score_threshold=score_threshold, iou_threshold=iou_threshold,
                       class_names=list(model.class_names))
    if save_json is not None:
        save_coco_json(metrics, save_json)
    return {**metrics, "class_names": list(model.class_names)}

"""A training run on disk: the run directory's layout, preparing it (:func:`prepare_run_dir`: locked while a run
writes into it), and what rank 0 writes into it besides the checkpoints, as trainer callbacks: ``results.csv`` and
``stop.txt`` (:class:`ResultsCSV`), TensorBoard scalars (:class:`TensorBoardLogger`, when tensorboard is
installed), the figures (:class:`RunFigures`) and the validation report (:class:`ValidationReport`).
:func:`output_callbacks` lists them for a run; the checkpoints are written by the trainer.

A run directory ``<project>/<name>`` (made by :func:`ssd.files.make_run_dir`: auto-incremented, never overwritten)
holds::

    config.yaml        the resolved TrainConfig: what really ran (everything needed to reproduce the run)
    results.csv        one row per epoch (columns: ssd.plots.RESULTS_COLUMNS)
    results.png        loss and mAP curves
    pr_curves.png      per-class precision/recall curves of the last validation
    labels.png         label and box statistics of the training split
    val_predictions/   a few validation images with predictions drawn
    val_report/        the evaluation report of the last validation (report.html, metrics.json, ...)
    events.out.*       TensorBoard scalars (when tensorboard is installed)
    stop.txt           why the run stopped before its last epoch (early stopping, --patience)
    weights/last.pt    after every epoch (model and the training state: ssd.training.state.TRAINING_STATE)
    weights/best.pt    at the best validation mAP

With ``--ema`` the ``model`` of both checkpoints is the exponential moving average of the weights (what is
evaluated and deployed); ``last.pt`` also keeps the raw weights for ``--resume``
(:func:`ssd.training.optim.build_ema`).
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ssd.data.images import read_image
from ssd.data.table import object_arrays
from ssd.errors import MissingDependencyError
from ssd.files import DirectoryLock, atomic_write, fitted_name, remove_stale_temporaries, write_text
from ssd.log import LOGGER
from ssd.optional import require
from ssd.plots import RESULTS_COLUMNS, draw_detections, plot_label_stats, plot_pr_curves, plot_results, save_image
from ssd.settings import PREDICT
from ssd.training.callbacks import Callback
from ssd.training.config import TrainConfig

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["STOP_FILE", "prepare_run_dir", "ResultsCSV", "TensorBoardLogger", "RunFigures", "ValidationReport",
           "output_callbacks", "write_results_csv"]


STOP_FILE = "stop.txt"


def prepare_run_dir(run_dir: Path, config: TrainConfig) -> DirectoryLock:
    """Lock the run directory (a second run into it, with ``--exist-ok``, is refused while this one holds the lock),
    create ``weights/``, remove the temporary files a run killed while writing a checkpoint left there, and write
    ``config.yaml`` (a resumed run rewrites it: device, workers or epochs may have changed). Returns the lock, for
    the caller to release when the run ends."""
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    lock = DirectoryLock(run_dir)
    remove_stale_temporaries(run_dir / "weights")
    config.to_yaml(run_dir / "config.yaml")
    return lock


def write_results_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``results.csv`` from the run history (so a resumed run never holds duplicate epochs)."""
    with atomic_write(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in RESULTS_COLUMNS})


class ResultsCSV(Callback):
    """``results.csv`` and one logged line (all numbers with ``quiet``, else the mAP when validated) after every
    epoch; ``stop.txt`` with the reason when the run stopped early."""

    def on_epoch_end(self, trainer: Trainer, row: dict[str, Any]) -> None:
        write_results_csv(trainer.run_dir / "results.csv", trainer.state.history)
        config = trainer.config
        if config.quiet:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "epoch" and isinstance(v, float))
            LOGGER.info(f"epoch {row['epoch']}/{trainer.epochs}: {shown}")
        elif "val/mAP" in row:
            LOGGER.info(f"epoch {row['epoch']}/{trainer.epochs}: {config.metric} mAP {row['val/mAP']:.4f}")

    def on_fit_end(self, trainer: Trainer) -> None:
        if trainer.state.stop_reason:
            write_text(trainer.run_dir / STOP_FILE, trainer.state.stop_reason + "\n")


class TensorBoardLogger(Callback):
    """The numbers of every results.csv row as TensorBoard scalars in the run directory; skipped, with one logged
    line, when the ``tensorboard`` package is not installed."""

    def __init__(self) -> None:
        self.writer = None

    def on_train_start(self, trainer: Trainer) -> None:
        try:  # heavy, and an optional extra
            tensorboard = require("torch.utils.tensorboard", "tensorboard", "TensorBoard logging")
        except MissingDependencyError as missing:
            LOGGER.info(f"{missing} (this run goes on without TensorBoard scalars)")
            return
        self.writer = tensorboard.SummaryWriter(str(trainer.run_dir))

    def on_epoch_end(self, trainer: Trainer, row: dict[str, Any]) -> None:
        if self.writer is None:
            return
        for key, value in row.items():
            if key != "epoch":
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()

    def on_teardown(self, trainer: Trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class RunFigures(Callback):
    """``labels.png`` when a run starts (not again on resume); at the end ``results.png``, ``pr_curves.png`` of the
    last validation and ``num_plot_images`` validation images drawn with the evaluated model's predictions
    (thresholds :data:`ssd.settings.PREDICT`) in ``val_predictions/``."""

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.plan.state is None:
            boxes, labels = object_arrays(trainer.train_records)
            plot_label_stats(boxes, labels, trainer.class_names, trainer.run_dir / "labels.png")

    @torch.no_grad()
    def on_fit_end(self, trainer: Trainer) -> None:
        run_dir, class_names = trainer.run_dir, trainer.class_names
        plot_results(run_dir / "results.csv", run_dir / "results.png")
        if trainer.state.metrics:
            plot_pr_curves(trainer.state.metrics, class_names, run_dir / "pr_curves.png")
        out_dir = run_dir / "val_predictions"
        out_dir.mkdir(exist_ok=True)
        model = trainer.eval_model
        model.eval()
        device = model.priors.device
        for record in trainer.val_records[: trainer.config.num_plot_images]:
            image = read_image(record.path)
            found = model.predict([image.to(device)], **PREDICT.as_kwargs())[0]
            drawn = draw_detections(image, found["boxes"], found["labels"], found["scores"], class_names)
            save_image(drawn, out_dir / fitted_name(record.path.stem, ".jpg"))


class ValidationReport(Callback):
    """The evaluation report of the run's last validation in ``val_report/`` (what ``ssd val`` writes: metrics.json,
    detections.json, curves, confusion matrices, the worst images and report.html; :mod:`ssd.evaluation.report`),
    for the weights the run ended with."""

    def on_fit_end(self, trainer: Trainer) -> None:
        metrics = trainer.state.metrics
        if not metrics.get("ground_truths"):  # nothing validated in this process (a finished run resumed)
            return
        from ssd.evaluation.report import build_report, write_report  # matplotlib: only at the end of a run

        report = build_report(metrics["detections"], metrics["ground_truths"], trainer.class_names,
                              priors=trainer.eval_model.priors.detach().cpu(), data=str(trainer.config.data),
                              split="val", model=trainer.config.model)
        out_dir = trainer.run_dir / "val_report"
        out_dir.mkdir(exist_ok=True)
        page = write_report(report, out_dir, metrics["detections"], metrics["ground_truths"],
                            category_ids=trainer.category_ids)
        LOGGER.info(f"validation report: {page}")


def output_callbacks() -> list[Callback]:
    """The run directory's writers (the trainer adds them on rank 0 only)."""
    return [ResultsCSV(), TensorBoardLogger(), RunFigures(), ValidationReport()]

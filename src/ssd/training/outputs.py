"""What rank 0 writes into the run directory besides the checkpoints, as trainer callbacks: ``results.csv`` and
``stop.txt`` (:class:`ResultsCSV`), TensorBoard scalars (:class:`TensorBoardLogger`, when tensorboard is
installed), and the figures (:class:`RunFigures`). :func:`output_callbacks` lists them for a run."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ssd._utils import MissingDependencyError, require
from ssd.data.images import read_image
from ssd.data.table import object_arrays
from ssd.files import atomic_write, fitted_name, write_text
from ssd.log import LOGGER
from ssd.plots import RESULTS_COLUMNS, draw_detections, plot_label_stats, plot_pr_curves, plot_results, save_image
from ssd.settings import PREDICT
from ssd.training.callbacks import Callback
from ssd.training.rundir import STOP_FILE

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["ResultsCSV", "TensorBoardLogger", "RunFigures", "ValidationReport", "output_callbacks", "write_results_csv"]


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

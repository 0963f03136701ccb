"""A training run on disk: its directory and files, and the random state that makes a resume exact.

A run directory ``<project>/<name>`` (auto-incremented, never overwritten) holds::

    config.yaml        the resolved TrainConfig: what really ran (everything needed to reproduce the run)
    results.csv        one row per epoch (columns: ssd.plots.RESULTS_COLUMNS)
    results.png        loss and mAP curves
    pr_curves.png      per-class precision/recall curves of the last validation
    labels.png         label and box statistics of the training split
    val_predictions/   a few validation images with predictions drawn
    events.out.*       TensorBoard scalars
    weights/last.pt    after every epoch (model and the training state: ssd.training.plan.TRAINING_STATE)
    weights/best.pt    at the best validation mAP
"""

from __future__ import annotations

import csv
import random
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ssd.data.images import read_image
from ssd.data.records import DataError, ImageRecord
from ssd.plots import (
    RESULTS_COLUMNS,
    draw_detections,
    plot_label_stats,
    plot_pr_curves,
    plot_results,
    save_image,
)
from ssd.settings import PREDICT
from ssd.training.config import TrainConfig
from ssd.weights.checkpoint import remove_stale_temporaries

__all__ = ["make_run_dir", "seed_everything", "epoch_seed", "rng_state", "set_rng_state",
           "write_results_csv", "checkpoint_metrics", "RunOutput", "plain_data_errors"]


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


def write_results_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """Rewrite ``results.csv`` from the run history (so a resumed run never holds duplicate epochs)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: row.get(k, "") for k in RESULTS_COLUMNS})


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


class RunOutput:
    """What the main process writes into the run directory: ``config.yaml`` and ``labels.png`` when the run starts,
    ``results.csv``, TensorBoard scalars and one printed line per epoch, the figures and drawn predictions at the end.

    Use as a context manager (or call :meth:`close`): the TensorBoard writer is closed whatever ends the run.
    """

    def __init__(self, run_dir: Path, config: TrainConfig, log: Callable[[str], object] = print) -> None:
        from torch.utils.tensorboard import SummaryWriter  # heavy: only when a run starts

        self.run_dir, self.config, self.log = run_dir, config, log
        (run_dir / "weights").mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(run_dir / "weights")  # left by a run killed while writing a checkpoint
        config.to_yaml(run_dir / "config.yaml")
        self.writer = SummaryWriter(str(run_dir))

    def label_stats(self, records: Sequence[ImageRecord], class_names: list[str]) -> None:
        objects = [o for record in records for o in record.objects]
        plot_label_stats([o.box for o in objects], [o.label for o in objects], class_names,
                         self.run_dir / "labels.png")

    def epoch(self, row: dict[str, Any], history: list[dict[str, Any]]) -> None:
        write_results_csv(self.run_dir / "results.csv", history)
        for key, value in row.items():
            if key != "epoch":
                self.writer.add_scalar(key, value, row["epoch"])
        self.writer.flush()
        epochs = self.config.epochs
        if self.config.quiet:
            shown = ", ".join(f"{k}={v:.4g}" for k, v in row.items() if k != "epoch" and isinstance(v, float))
            print(f"epoch {row['epoch']}/{epochs}: {shown}")
        elif "val/mAP" in row:
            print(f"epoch {row['epoch']}/{epochs}: {self.config.metric} mAP {row['val/mAP']:.4f}")

    @torch.no_grad()
    def finish(self, model: nn.Module, metrics: dict[str, Any], records: Sequence[ImageRecord],
               best_map: float) -> None:
        """Curves, PR curves of the last validation, and ``num_plot_images`` of ``records`` drawn with ``model``'s
        predictions (thresholds :data:`ssd.settings.PREDICT`)."""
        run_dir, class_names = self.run_dir, list(model.class_names)
        plot_results(run_dir / "results.csv", run_dir / "results.png")
        if metrics:
            plot_pr_curves(metrics, class_names, run_dir / "pr_curves.png")
        out_dir = run_dir / "val_predictions"
        out_dir.mkdir(exist_ok=True)
        model.eval()
        device = model.priors.device
        for record in records[: self.config.num_plot_images]:
            image = read_image(record.path)
            found = model.predict([image.to(device)], **PREDICT.as_kwargs())[0]
            drawn = draw_detections(image, found["boxes"], found["labels"], found["scores"], class_names)
            save_image(drawn, out_dir / f"{record.path.stem}.jpg")
        self.log(f"results saved to {run_dir} (best {self.config.metric} mAP {best_map:.4f})")

    def close(self) -> None:
        self.writer.close()

    def __enter__(self) -> RunOutput:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@contextmanager
def plain_data_errors() -> Iterator[None]:
    """Re-raise a :class:`~ssd.data.records.DataError` from a DataLoader worker with its own message: the worker
    wraps it in a message holding its whole traceback ("Caught DataError in DataLoader worker process 0 ...")."""
    try:
        yield
    except DataError as exc:
        text, name = str(exc), type(exc).__qualname__
        starts = [m.end() for m in re.finditer(rf"^\S*\b{re.escape(name)}: ", text, flags=re.MULTILINE)]
        if not text.startswith(f"Caught {type(exc).__name__} in DataLoader worker") or not starts:
            raise
        raise type(exc)(text[starts[-1]:].strip()) from None

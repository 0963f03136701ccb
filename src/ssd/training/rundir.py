"""A training run on disk: the run directory's layout, and preparing it (locked while a run writes into it).

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
    weights/last.pt    after every epoch (model and the training state: ssd.training.plan.TRAINING_STATE)
    weights/best.pt    at the best validation mAP

With ``--ema`` the ``model`` of both checkpoints is the exponential moving average of the weights (what is
evaluated and deployed); ``last.pt`` also keeps the raw weights for ``--resume`` (``ssd.training.ema``).
The files are written by the output callbacks of :mod:`ssd.training.outputs`, the checkpoints by the trainer.
"""

from __future__ import annotations

from pathlib import Path

from ssd.files import DirectoryLock, remove_stale_temporaries
from ssd.training.config import TrainConfig

__all__ = ["prepare_run_dir", "STOP_FILE"]

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

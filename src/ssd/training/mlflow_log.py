"""``--mlflow [URI]`` (``ssd train``, ``ssd tune``): a run's options, per-epoch metrics, model card and files in an
MLflow tracking store, as a trainer callback (:class:`MLflowLogger`; the ``mlflow`` extra).

The store is ``./mlruns`` (a local file store) when the option is given alone, a folder given as a path, or any
MLflow tracking URI (``file://...``, ``http://host:5000`` for a tracking server, ``sqlite:///mlflow.db``). Each
training run is one MLflow run of the experiment ``ssd-detect``, named after its run directory (a tune's trials
are ``trial0``, ``trial1``, ... and its final training the tune's run name), tagged ``ssd.run_dir``. Logged, on
rank 0 only:

- parameters: every ``TrainConfig`` option as the run resolved it (what ``config.yaml`` holds);
- metrics: every number of each ``results.csv`` row, at the epoch as its step;
- at the end: the model card (``model_card.json``), ``config.yaml``, ``results.csv``, the figures and
  ``weights/best.pt`` as artifacts; the MLflow run ends ``FINISHED``, or ``FAILED`` when training raised.

MLflow 3 keeps its file store in maintenance mode and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is set: a
folder (or ``file://`` URI) given here is a file store asked for, so that variable is set to ``true`` unless the
environment already sets it. ``sqlite:///mlflow.db`` is MLflow's database store, with no such step.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ssd.optional import require
from ssd.training.callbacks import Callback

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["EXPERIMENT", "MLflowLogger", "tracking_uri"]

EXPERIMENT = "ssd-detect"
ARTIFACTS = ("config.yaml", "results.csv", "results.png", "pr_curves.png", "labels.png", "weights/best.pt")


def tracking_uri(value: str) -> str:
    """A tracking URI as MLflow takes it: a URI (``scheme://...``) as it is, a folder as its ``file://`` URI."""
    return value if "://" in value else Path(value).absolute().as_uri()


class MLflowLogger(Callback):
    """Log the run to the MLflow store at ``uri`` (see the module docstring); ``run_id`` once started."""

    def __init__(self, uri: str) -> None:
        self.uri = tracking_uri(uri)
        self.client = None
        self.run_id: str | None = None
        self.finished = False

    def on_train_start(self, trainer: Trainer) -> None:
        if not trainer.info.is_main:
            return
        if self.uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = require("mlflow.tracking", "mlflow", "--mlflow")
        entities = require("mlflow.entities", "mlflow", "--mlflow")
        self.client = client = tracking.MlflowClient(tracking_uri=self.uri)
        experiment = client.get_experiment_by_name(EXPERIMENT)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(EXPERIMENT)
        run = client.create_run(experiment_id, run_name=trainer.run_dir.name,
                                tags={"ssd.run_dir": str(trainer.run_dir.absolute())})
        self.run_id = run.info.run_id
        params = [entities.Param(key, _text(value)) for key, value in trainer.config.to_dict().items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per batch
            client.log_batch(self.run_id, params=params[start:start + 100])

    def on_epoch_end(self, trainer: Trainer, row: dict[str, Any]) -> None:
        if self.run_id is None:
            return
        entities = require("mlflow.entities", "mlflow", "--mlflow")
        step = int(row["epoch"])
        metrics = [entities.Metric(key, float(value), 0, step) for key, value in row.items()
                   if key != "epoch" and isinstance(value, (int, float)) and not isinstance(value, bool)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_fit_end(self, trainer: Trainer) -> None:
        if self.run_id is None:
            return
        self.client.log_dict(self.run_id, trainer.eval_model.card.to_dict(), "model_card.json")
        for name in ARTIFACTS:
            path = trainer.run_dir / name
            if path.is_file():
                self.client.log_artifact(self.run_id, str(path), str(Path(name).parent) if "/" in name else None)
        self.finished = True

    def on_teardown(self, trainer: Trainer) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id, "FINISHED" if self.finished else "FAILED")


def _text(value: Any) -> str:
    return "" if value is None else str(value)

"""``ssd tune``'s options (:class:`TuneConfig`), a command schema like those of :mod:`ssd.schemas`, read by the command
line and :func:`ssd.training.tune.tune` alike."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ssd.errors import ConfigError
from ssd.limits import MAX_TRAIN_MINUTES, is_real
from ssd.schemas import DATA_HELP, CommandSchema, option

__all__ = ["MIN_TRIAL_MINUTES", "TuneConfig"]

MIN_TRIAL_MINUTES = 0.1
"""The shortest trial ``ssd tune`` runs (every trial trains at least one epoch, validated)."""


@dataclass(frozen=True, kw_only=True)
class TuneConfig(CommandSchema):
    """``ssd tune``: search training options under one time budget, then train the best; a run in ``project/name``
    (:func:`ssd.training.tune.tune`)."""

    data: str = option(DATA_HELP)
    model: str | None = option("model name (default: --config's, else ssd train's)", None)
    time: float = option("the whole budget in minutes, wall clock: the trials and the final training of the best "
                         "configuration")
    trials: int | None = option("at most this many trials, each (1 - --final-share) * --time / N minutes (default: "
                                "8 trials' worth, and as many as the time allows when some end early)", None)
    space: Path | None = option("search space YAML: TrainConfig field -> {low, high[, log]} or {choices: [...]} "
                                "(default: one for the model, written to the run directory as space.yaml)", None,
                                metavar="YAML")
    storage: str | None = option("Optuna storage URL shared by several tunes of one study (--name), e.g. "
                                 "postgresql://... or sqlite:///file.db (default: study.db in the run directory)",
                                 None, metavar="URL")
    config: Path | None = option("ssd train options every trial keeps (a YAML like config.yaml: batch size, workers, "
                                 "...)", None, metavar="YAML")
    final_share: float = option("share of --time kept for the final training of the best configuration", 0.3)
    device: str = option("cpu, cuda, cuda:N, mps or auto", "auto")
    mlflow: str | None = option("log every trial and the final training to MLflow: a tracking URI or folder (alone: "
                                "./mlruns)", None, const="mlruns", metavar="URI")
    resume: Path | None = option("continue the tune of this run directory (its study.db and space.yaml), with a new "
                                 "--time budget", None, metavar="RUN")
    project: Path = option("where the run directory goes", Path("runs/tune"))
    name: str = option("run directory and study name; name2, name3, ... for the directory when taken", "exp")

    def __post_init__(self) -> None:
        self._check_common()
        self._require("time", is_real(self.time, finite=True) and 0 < self.time <= MAX_TRAIN_MINUTES,
                      f"must be a number of minutes in (0, {MAX_TRAIN_MINUTES}]")
        self._positive("trials")
        self._require("final_share", is_real(self.final_share, finite=True) and 0 < self.final_share < 1,
                      "must be in (0, 1)")
        per_trial = self.time * (1 - self.final_share) / (self.trials or 1)
        if per_trial < MIN_TRIAL_MINUTES:
            raise ConfigError(f"--time {self.time:g} is too short: with --final-share {self.final_share:g}"
                              f"{f' and --trials {self.trials}' if self.trials else ''} each trial gets "
                              f"{per_trial:.3g} minutes, under the {MIN_TRIAL_MINUTES} a trial needs; give --time "
                              f"{MIN_TRIAL_MINUTES * (self.trials or 1) / (1 - self.final_share):.2g} or more"
                              f"{' or fewer --trials' if self.trials else ''}")

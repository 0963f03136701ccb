"""``ssd tune``: the training options that do best on a dataset within one time budget, then a model trained
with them (Optuna: TPE sampling, median pruning on each epoch's validation mAP).

:func:`tune` checks everything first (options, search space, data, study database), then runs trials until the
search part of the budget is spent (``1 - final_share`` of ``--time``; at most ``--trials``): each trial is an
``ssd train`` run (:func:`ssd.training.trainer.train`) of the sampled options with its own ``--time``, in
``trials/trialN`` of the run directory; it reports its validation mAP after every epoch (:class:`TrialPruning`),
the first trial of a new study runs ``ssd train``'s own values of the searched options (the yardstick), trials
last at least ``MIN_TRIAL_EPOCHS`` epochs (lengthened, fewer of them, once the first shows an epoch's time), and a
trial whose mAP is below the median of the earlier trials at that epoch is stopped (pruned). A trial that
fails (a non-finite loss, out of memory, options ``ssd train`` refuses together) is recorded failed with its
reason, and the search goes on. What is left of the budget trains the best trial's options into the run directory
itself. The whole budget is wall clock: setting up each run (reading the data, building the model) counts, and is
taken from the next run's ``--time``.

The run directory (:func:`ssd.files.make_run_dir`, ``runs/tune/exp`` by default)::

    config.yaml        the winning configuration (ssd train --config reads it; it trains into runs/train)
    weights/best.pt    the final training's best model (and last.pt, results.csv, ...: an ssd train run)
    space.yaml         the search space (the default one for the model when --space is not given)
    study.db           the Optuna study (SQLite; unless --storage): ssd tune --resume RUN continues it
    trials.csv         a row per trial: state, mAP, minutes, epochs, why it failed or was pruned, its options
    trials.png         the trials' mAP (best so far) and each trial run's mAP against its minutes
    trials/trialN/     each trial's ssd train run directory
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ssd.data.gate import load_training_data
from ssd.errors import MissingInputError, StudyError
from ssd.files import make_run_dir
from ssd.log import LOGGER
from ssd.optional import require
from ssd.training.callbacks import Callback
from ssd.training.config import TrainConfig
from ssd.training.trainer import TrainResult, train
from ssd.training.tune_space import Param, default_params, default_space, read_space, sample, space_to_yaml
from ssd.training.tune_study import OWNER, check_sqlite, open_study, sqlite_url, write_trials
from ssd.tune_schema import MIN_TRIAL_MINUTES, TuneConfig

if TYPE_CHECKING:
    from ssd.training.trainer import Trainer

__all__ = ["tune", "TuneResult", "TrialPruning", "TRIAL_ERRORS"]

TRIAL_ERRORS = (ValueError, RuntimeError, MemoryError)
"""What a failed trial raises (ssd's errors, a non-finite loss, torch's out of memory): recorded, the search goes
on. Anything else (Ctrl-C) stops the tune, and the trial is marked interrupted when the study is opened again."""

DEFAULT_TRIALS = 8  # without --trials, each trial gets this share of the search time (more run when some end early)
MIN_TRIAL_EPOCHS = 5  # a trial ranked on fewer epochs is ranked on noise: trials are lengthened to this many

TrainFn = Callable[..., TrainResult]


@dataclass
class TuneResult:
    """What :func:`tune` returns: the run directory, the best trial's options and mAP, the final training's result,
    how many trials ended in each state (``COMPLETE``, ``PRUNED``, ``FAIL``; this study, all processes) and the
    minutes this call took."""

    run_dir: Path
    best_params: dict[str, Any]
    best_map: float
    final: TrainResult = field(repr=False)
    states: dict[str, int]
    minutes: float


class TrialPruning(Callback):
    """Report each validation's mAP to an Optuna trial (step: the epoch) and stop the run when the pruner says so
    (``pruned``: why)."""

    def __init__(self, trial) -> None:
        self.trial = trial
        self.pruned: str | None = None

    def on_val_end(self, trainer: Trainer, metrics: dict[str, Any]) -> None:
        epoch = trainer.epoch + 1
        self.trial.report(float(metrics["map"]), epoch)
        if self.pruned is None and self.trial.should_prune():
            self.pruned = (f"pruned after epoch {epoch}: mAP {metrics['map']:.4f} below the median of the earlier "
                           "trials at that epoch")
            trainer.stop(f"ssd tune: trial {self.trial.number} {self.pruned}")


def _base_config(config: TuneConfig) -> TrainConfig:
    """The options every trial keeps: ``--config``'s, the data, model, device and MLflow store."""
    base = TrainConfig.from_yaml(config.config) if config.config is not None else TrainConfig()
    given = {key: getattr(config, key) for key in ("model", "mlflow") if getattr(config, key) is not None}
    return base.update(data=config.data, device=config.device, **given)


def _space(config: TuneConfig, run_dir: Path | None, model: str) -> list[Param]:
    if config.space is not None:
        return read_space(config.space)
    if run_dir is not None and (run_dir / "space.yaml").is_file():  # a resumed tune keeps its space
        return read_space(run_dir / "space.yaml")
    return default_space(model)


def tune(config: TuneConfig, *, train_fn: TrainFn = train, callbacks: Sequence[Callback] = (),
         clock: Callable[[], float] = time.monotonic) -> TuneResult:
    """Run ``ssd tune`` (see the module docstring). ``train_fn``: what runs a trial and the final training
    (:func:`~ssd.training.trainer.train`'s signature); ``callbacks``: added to every run (e.g. MLflow logging)."""
    require("optuna", "tune", "ssd tune")
    start = clock()
    if config.resume is not None and not Path(config.resume).is_dir():
        raise MissingInputError(f"--resume {config.resume}: no such run directory of ssd tune")
    base = _base_config(config)
    space = _space(config, config.resume, base.model)
    spec = load_training_data(base.data, skip_invalid=base.skip_invalid)  # refused before any study or folder
    run_dir = Path(config.resume) if config.resume is not None else make_run_dir(config.project, config.name)
    storage = config.storage or sqlite_url(run_dir / "study.db")
    search_minutes = config.time * (1 - config.final_share)
    trial_minutes = search_minutes / (config.trials or DEFAULT_TRIALS)
    name = config.name
    if config.resume is not None and config.storage is None:  # the run directory's own study, whatever its name
        optuna = require("optuna", "tune", "ssd tune")
        check_sqlite(run_dir / "study.db")  # before Optuna reads it
        names = optuna.study.get_all_study_names(storage) if (run_dir / "study.db").is_file() else []
        name = names[0] if len(names) == 1 else name
    study = open_study(storage, name, {"model": base.model, "classes": list(spec.class_names)},
                       seed=base.seed if config.storage is None else None,
                       startup_trials=max(2, (config.trials or DEFAULT_TRIALS) // 3))
    if not study.trials:  # the first trial is the defaults: the yardstick every other trial is ranked against
        study.enqueue_trial(default_params(space, base), skip_if_exists=True)
    space_to_yaml(space, run_dir / "space.yaml")
    names = [p.name for p in space]
    LOGGER.info(f"ssd tune: {config.time:g} minutes on {base.model}: trials of {trial_minutes:.2f} min for "
                f"{search_minutes:.2f} min, then the best trains; searching {', '.join(names)}; study "
                f"{name!r} in {storage} ({len(study.trials)} trials so far)")
    search_end = start + search_minutes * 60
    overhead = 0.0  # minutes a run spends outside its --time (data, model): the most seen
    shortest = MIN_TRIAL_MINUTES  # a trial's least length: MIN_TRIAL_EPOCHS epochs once an epoch's time is known
    count = 0
    while config.trials is None or count < config.trials:
        left = (search_end - clock()) / 60
        if left < shortest + overhead and (count or _best(study, storage, quiet=True)):
            break  # setting up may have taken the search time: one trial still runs when the study has none done
        spent, epoch_minutes = _run_trial(study, space, base, run_dir, min(trial_minutes, left) - overhead,
                                          train_fn, callbacks, clock)
        overhead = max(overhead, spent)
        count += 1
        if count == 1 and epoch_minutes:
            shortest = MIN_TRIAL_EPOCHS * epoch_minutes
            if trial_minutes < shortest:
                LOGGER.warning(f"ssd tune: an epoch of this data takes {epoch_minutes:.2f} min, so trials of "
                               f"{trial_minutes:.2f} min would be ranked after {trial_minutes / epoch_minutes:.1f} "
                               f"epochs: they get {shortest:.2f} min ({MIN_TRIAL_EPOCHS} epochs) each, fewer of "
                               "them (with no time for a second, the defaults of the first are trained)")
                trial_minutes = shortest
    write_trials(study, names, run_dir)
    best = _best(study, storage)
    final_minutes = max(MIN_TRIAL_MINUTES, (start + config.time * 60 - clock()) / 60 - overhead)
    LOGGER.info(f"ssd tune: best trial {best.number}, mAP {best.value:.4f}: {best.params}; the final training "
                f"gets {final_minutes:.2f} minutes")
    final = base.update(**best.params, time=final_minutes, project=str(run_dir.parent), name=run_dir.name,
                        exist_ok=True)
    result = train_fn(final, callbacks=list(callbacks))
    final.update(project=TrainConfig.project, name=TrainConfig.name, exist_ok=False).to_yaml(run_dir / "config.yaml")
    states: dict[str, int] = {}
    for trial in study.get_trials(deepcopy=False):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
    return TuneResult(run_dir, dict(best.params), float(best.value), result, states, (clock() - start) / 60)


def _run_trial(study, space: list[Param], base: TrainConfig, run_dir: Path, minutes: float, train_fn: TrainFn,
               callbacks: Sequence[Callback], clock: Callable[[], float]) -> tuple[float, float | None]:
    """Ask the study for a trial, train it for ``minutes``, tell the study how it ended; returns the minutes the
    run spent outside its ``--time`` (setting up) and the minutes of one of its epochs (``None``: it trained none)."""
    optuna = require("optuna", "tune", "ssd tune")
    state = optuna.trial.TrialState
    trial = study.ask()
    trial.set_user_attr("owner", OWNER)
    params = sample(space, trial, base)
    trial_dir = run_dir / "trials" / f"trial{trial.number}"
    trial.set_user_attr("run_dir", str(trial_dir))
    pruning = TrialPruning(trial)
    began = clock()
    try:
        config = base.update(**params, time=max(minutes, MIN_TRIAL_MINUTES), project=str(trial_dir.parent),
                             name=trial_dir.name, exist_ok=True, quiet=True)
        result = train_fn(config, callbacks=[pruning, *callbacks])
    except TRIAL_ERRORS as e:
        reason = f"{type(e).__name__}: {' '.join(str(e).split())}"[:500]
        trial.set_user_attr("fail_reason", reason)
        study.tell(trial, state=state.FAIL)
        LOGGER.info(f"trial {trial.number}: failed: {reason}")
        return 0.0, None
    trained = result.history[-1]["time"] / 60 if result.history else 0.0
    trial.set_user_attr("epochs", len(result.history))
    epoch_minutes = trained / len(result.history) if result.history else None
    if pruning.pruned is not None:
        trial.set_user_attr("pruned", pruning.pruned)
        study.tell(trial, state=state.PRUNED)
        LOGGER.info(f"trial {trial.number}: {pruning.pruned}")
    elif not math.isfinite(result.best_map) or result.best_map < 0:
        trial.set_user_attr("fail_reason", "the run ended without a validation mAP")
        study.tell(trial, state=state.FAIL)
    else:
        study.tell(trial, result.best_map)
        LOGGER.info(f"trial {trial.number}: mAP {result.best_map:.4f} in {len(result.history)} epochs: {params}")
    return max(0.0, (clock() - began) / 60 - trained), epoch_minutes


def _best(study, storage: str, quiet: bool = False):
    """The best completed trial, or :class:`~ssd.errors.StudyError` with why none completed (``None`` when
    ``quiet``)."""
    complete = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    if complete:
        return max(complete, key=lambda t: t.value)
    if quiet:
        return None
    reasons = [t.user_attrs.get("fail_reason") or t.user_attrs.get("pruned") or t.state.name
               for t in study.get_trials(deepcopy=False)]
    raise StudyError(f"{storage}: no trial completed ({len(reasons)} ran"
                     f"{': ' + reasons[0] if reasons else ''}); see trials.csv, or give a larger --time")

"""The Optuna study behind ``ssd tune``: its storage (checked before Optuna touches it), the trials' table and
figure.

Storage: an SQLite file in the run directory by default (``study.db``: a killed tune resumes from it), or any
Optuna RDB URL given with ``--storage`` (``postgresql://...``, or an ``sqlite:///`` file several processes on one
machine share): processes that name the same storage and study (``--name``) tune one study together, each running
its own trials and its own final training on the best configuration found so far. An SQLite file that is not an
SQLite database, or holds another program's tables, is refused before Optuna opens it, and a study that another
kind of tune made (another model, other classes) is refused once opened: never overwritten, never mixed.

A trial is recorded with its state (``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING``), its value (the trial run's
best validation mAP), its options, and as user attributes its run directory (``run_dir``), why it failed
(``fail_reason``) or was pruned, and the process that ran it (``owner``, host and pid): a trial left ``RUNNING`` by
a process of this machine that no longer exists (a tune killed mid-trial) is marked failed, ``interrupted``, when a
tune opens the study again.
"""

from __future__ import annotations

import csv
import os
import socket
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib import rc_context
from matplotlib.figure import Figure

from ssd._version import __version__
from ssd.errors import StudyError
from ssd.files import atomic_write
from ssd.log import LOGGER
from ssd.optional import require
from ssd.plots import PLAIN_TEXT
from ssd.text import few
from ssd.training.runs import read_run

__all__ = ["OWNER", "check_sqlite", "open_study", "sqlite_url", "trials_table", "write_trials"]

OWNER = f"{socket.gethostname()}:{os.getpid()}"
"""The ``owner`` user attribute of the trials this process runs."""

_OPTUNA_TABLES = {"studies", "trials", "version_info"}
_SQLITE_MAGIC = b"SQLite format 3\x00"


def sqlite_url(path: str | Path) -> str:
    """The Optuna storage URL of an SQLite file."""
    return f"sqlite:///{Path(path).absolute()}"


def check_sqlite(path: str | Path) -> None:
    """Refuse an existing file that is not an SQLite database or holds tables that are not Optuna's (a missing or
    empty file is a new study); read only, the file is never changed here."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb") as f:
        head = f.read(len(_SQLITE_MAGIC))
    keep = "ssd tune leaves it as it is: give another --storage or --name, or move the file"
    if head != _SQLITE_MAGIC:
        raise StudyError(f"{path}: not an SQLite database (it starts with {head[:8]!r}), so not a study; {keep}")
    try:
        with sqlite3.connect(f"file:{path.absolute()}?mode=ro", uri=True) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.DatabaseError as e:
        raise StudyError(f"{path}: a damaged SQLite database ({e}); {keep}") from None
    if tables and not _OPTUNA_TABLES.issubset(tables):
        raise StudyError(f"{path}: an SQLite database of something else (tables: {few(sorted(tables))}), not an "
                         f"Optuna study; {keep}")


_JOIN_ATTEMPTS = 5
_START_RACES = {"OperationalError", "IntegrityError", "DuplicatedStudyError"}


def open_study(storage: str, name: str, signature: dict[str, Any], *, seed: int | None, startup_trials: int):
    """Create or join the study ``name`` in ``storage`` (maximizing validation mAP; TPE sampler, median pruner on
    the per-epoch mAP), after the checks of the module docstring; ``signature`` (model, classes) must match the
    one the study was made with. Trials this machine left running are marked failed."""
    optuna = require("optuna", "tune", "ssd tune")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # ssd tune says what each trial did, once
    if storage.startswith("sqlite:///"):
        check_sqlite(storage.removeprefix("sqlite:///"))
    sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=2, n_warmup_steps=2)  # from epoch 2: the first is noise
    for attempt in range(1, _JOIN_ATTEMPTS + 1):
        try:
            study = optuna.create_study(storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                                        sampler=sampler, pruner=pruner)
            break
        except Exception as e:  # Optuna's and SQLAlchemy's errors for a storage it cannot use: named, not overwritten
            # two tunes starting one new study at once: the later one meets the other's half-made tables or study
            if type(e).__name__ in _START_RACES and attempt < _JOIN_ATTEMPTS:
                time.sleep(0.2 * attempt)
                continue
            raise StudyError(f"{storage}: Optuna cannot open study {name!r} there ({type(e).__name__}: {e})") from None
    made = study.user_attrs.get("ssd")
    if made is None and study.trials:
        raise StudyError(f"{storage}: study {name!r} was not made by ssd tune (it has {len(study.trials)} trials and "
                         "no ssd signature); give another --name")
    if made is None:
        for key, value in {"ssd": __version__, **signature}.items():
            study.set_user_attr(key, value)
    else:
        for key, value in signature.items():
            if study.user_attrs.get(key) != value:
                raise StudyError(f"{storage}: study {name!r} tunes {key} {study.user_attrs.get(key)!r}, not "
                                 f"{value!r}; give another --name for a new study")
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        raise StudyError(f"{storage}: study {name!r} minimizes its value; ssd tune maximizes mAP")
    _fail_interrupted(study, optuna)
    return study


def _fail_interrupted(study, optuna) -> None:
    """Mark failed the trials left running by a process of this machine that has ended."""
    host = socket.gethostname()
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner_host, _, pid = str(trial.user_attrs.get("owner", "")).rpartition(":")
        if owner_host != host or not pid.isdigit() or _alive(int(pid)):
            continue
        study._storage.set_trial_user_attr(trial._trial_id, "fail_reason", "interrupted (its tune process ended)")
        study._storage.set_trial_state_values(trial._trial_id, optuna.trial.TrialState.FAIL)
        LOGGER.info(f"trial {trial.number}: interrupted by the end of its process, marked failed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


TRIAL_COLUMNS = ("trial", "state", "mAP", "minutes", "epochs", "reason", "run_dir")


def trials_table(study, names: Sequence[str]) -> tuple[list[str], list[list[Any]]]:
    """A row per trial: :data:`TRIAL_COLUMNS` then the searched options ``names`` (empty where a trial has none)."""
    rows = []
    for trial in study.get_trials(deepcopy=False):
        attrs = trial.user_attrs
        minutes = (None if trial.datetime_complete is None or trial.datetime_start is None else
                   (trial.datetime_complete - trial.datetime_start).total_seconds() / 60)
        rows.append([trial.number, trial.state.name, trial.value, minutes, attrs.get("epochs"),
                     attrs.get("fail_reason") or attrs.get("pruned", ""), attrs.get("run_dir", ""),
                     *(trial.params.get(name) for name in names)])
    return [*TRIAL_COLUMNS, *names], rows


def write_trials(study, names: Sequence[str], run_dir: Path) -> tuple[Path, Path]:
    """``trials.csv`` (:func:`trials_table`) and ``trials.png`` (each trial's mAP by number, with the best so far;
    each trial run's validation mAP against its minutes) in ``run_dir``."""
    header, rows = trials_table(study, names)
    table = run_dir / "trials.csv"
    with atomic_write(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if c is None else c for c in row] for row in rows])
    with rc_context(PLAIN_TEXT):
        fig = Figure(figsize=(12, 4.5), layout="constrained")
        values, curves = fig.subplots(1, 2)
        best, best_so_far = float("-inf"), []
        for state, marker in (("COMPLETE", "o"), ("PRUNED", "x"), ("FAIL", "v")):
            shown = [(row[0], row[2] if row[2] is not None else 0.0) for row in rows if row[1] == state]
            values.scatter([s[0] for s in shown], [s[1] for s in shown], marker=marker, label=state.lower())
        for row in rows:
            if row[1] == "COMPLETE" and row[2] is not None:
                best = max(best, row[2])
                best_so_far.append((row[0], best))
        values.step([b[0] for b in best_so_far], [b[1] for b in best_so_far], where="post", label="best so far")
        values.set(title="trials: best validation mAP", xlabel="trial", ylim=(0, 1))
        values.legend(fontsize="small")
        for row in rows:
            path = Path(row[6]) if row[6] else None
            if path is not None and (path / "results.csv").is_file():
                times, maps = read_run(path).column("val/mAP", by="time")
                curves.plot([t / 60 for t in times], maps, marker=".", alpha=0.7, label=f"trial {row[0]}")
        curves.set(title="validation mAP of each trial run", xlabel="minutes trained", ylim=(0, 1))
        for ax in (values, curves):
            ax.grid(alpha=0.3)
        figure = run_dir / "trials.png"
        with atomic_write(figure) as f:
            fig.savefig(f, dpi=100, format="png")
    return table, figure

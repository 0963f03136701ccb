"""Training runs side by side (``ssd runs RUN...``): one table and one figure of several run directories, read from
their files (``results.csv``, ``config.yaml``: see :mod:`ssd.training.outputs`), no server needed.

The table has a row per run: its best and last validation mAP, the epoch of the best, the epochs and minutes
trained, the last training loss, and every option of ``config.yaml`` whose value differs between the runs (what
was compared). The figure draws each run's validation mAP against the epoch and against the minutes trained (runs
of one time budget compare there) and its training loss against the epoch.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from matplotlib import rc_context
from matplotlib.figure import Figure

from ssd.errors import ConfigError
from ssd.files import atomic_write, check_outputs
from ssd.plots import PLAIN_TEXT, font_for
from ssd.text import render_table
from ssd.yamlfile import safe_load

__all__ = ["Run", "read_run", "compare_runs", "format_comparison", "plot_runs", "write_comparison",
           "SUMMARY_COLUMNS"]

SUMMARY_COLUMNS = ("run", "best mAP", "best epoch", "last mAP", "epochs", "minutes", "train loss")
"""The table's first columns; the options that differ between the runs follow, by their ``config.yaml`` keys."""


@dataclass
class Run:
    """One run directory as read: ``rows`` of ``results.csv`` (numbers as floats, empty cells left out) and its
    ``config.yaml`` (empty when it has none)."""

    path: Path
    rows: list[dict[str, float]]
    config: dict[str, Any] = field(default_factory=dict)

    def column(self, name: str, by: str = "epoch") -> tuple[list[float], list[float]]:
        """``(x, y)`` of the rows that have ``name`` (``by``: the x column: ``epoch`` or ``time``)."""
        pairs = [(row[by], row[name]) for row in self.rows if name in row and by in row]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def summary(self) -> dict[str, Any]:
        """The run's row of the table (:data:`SUMMARY_COLUMNS`); ``None`` for what it has not measured."""
        epochs, maps = self.column("val/mAP")
        best = max(range(len(maps)), key=maps.__getitem__) if maps else None
        last = self.rows[-1] if self.rows else {}
        return {"run": str(self.path), "best mAP": None if best is None else maps[best],
                "best epoch": None if best is None else int(epochs[best]), "last mAP": maps[-1] if maps else None,
                "epochs": int(last.get("epoch", 0)), "minutes": last["time"] / 60 if "time" in last else None,
                "train loss": last.get("train/loss")}


def read_run(path: str | Path) -> Run:
    """A run directory's ``results.csv`` and ``config.yaml``; one that has no ``results.csv`` is refused by name."""
    path = Path(path)
    results = path / "results.csv"
    if not results.is_file():
        raise ConfigError(f"{path}: not a training run directory (no results.csv in it; ssd train writes one "
                          "after every epoch)")
    with open(results, newline="") as f:
        rows = [{key: _number(results, line, key, value) for key, value in row.items() if value not in ("", None)}
                for line, row in enumerate(csv.DictReader(f), start=2)]
    config: dict[str, Any] = {}
    if (path / "config.yaml").is_file():
        try:
            config = safe_load((path / "config.yaml").read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path / 'config.yaml'}: not valid YAML ({e})") from None
        if not isinstance(config, dict):
            raise ConfigError(f"{path / 'config.yaml'}: expected a mapping of option: value")
    return Run(path, rows, config)


def _number(path: Path, line: int, key: str, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ConfigError(f"{path}, line {line}: {key} is {value!r}, not a number") from None


def compare_runs(runs: Sequence[Run]) -> tuple[list[str], list[list[Any]]]:
    """The table: a header (:data:`SUMMARY_COLUMNS`, then the ``config.yaml`` keys whose values differ between the
    runs, in the first run's order) and a row per run (``None`` where a run has no value)."""
    keys: list[str] = []
    for run in runs:
        keys += [key for key in run.config if key not in keys]
    differing = [key for key in keys if len({repr(run.config.get(key)) for run in runs}) > 1
                 and key not in ("name", "exist_ok", "resume", "quiet")]  # where it was written, not what ran
    rows = [[*run.summary().values(), *(run.config.get(key) for key in differing)] for run in runs]
    return [*SUMMARY_COLUMNS, *differing], rows


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) and abs(value) < 1e4 else f"{value:g}"
    return str(value)


def format_comparison(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """The table as text, one line per run."""
    return "\n".join(render_table(header, [[_cell(c) for c in row] for row in rows]))


def plot_runs(runs: Sequence[Run], out_png: str | Path) -> Path:
    """Validation mAP against the epoch and the minutes trained, and training loss against the epoch: a line per
    run, labelled by its folder name."""
    labels = [run.path.name or str(run.path) for run in runs]
    font = font_for(labels)
    with rc_context({**PLAIN_TEXT, **({"font.family": [font]} if font else {})}):
        fig = Figure(figsize=(15, 4.5), layout="constrained")
        by_epoch, by_time, loss = fig.subplots(1, 3)
        for run, label in zip(runs, labels):
            epochs, maps = run.column("val/mAP")
            by_epoch.plot(epochs, maps, marker="o", label=label)
            times, maps = run.column("val/mAP", by="time")
            by_time.plot([t / 60 for t in times], maps, marker="o", label=label)
            loss.plot(*run.column("train/loss"), marker=".", label=label)
        by_epoch.set(title="validation mAP", xlabel="epoch", ylim=(0, 1))
        by_time.set(title="validation mAP", xlabel="minutes trained", ylim=(0, 1))
        loss.set(title="training loss", xlabel="epoch")
        for ax in (by_epoch, by_time, loss):
            ax.grid(alpha=0.3)
        by_epoch.legend(fontsize="small")
        out = Path(out_png)
        with atomic_write(out) as f:
            fig.savefig(f, dpi=100, format="png")
    return out


def write_comparison(runs: Sequence[Run], output: str | Path) -> tuple[str, Path, Path]:
    """Write the table of ``runs`` (:func:`read_run`) as ``runs.csv`` and their figure as ``runs.png`` into
    ``output`` (created); return ``(table text, csv path, png path)``. An output that is one of the runs' files is
    refused."""
    output = Path(output)
    inputs = [file for run in runs for file in (run.path / "results.csv", run.path / "config.yaml")]
    table, figure = check_outputs([output / "runs.csv", output / "runs.png"], inputs=inputs, what="ssd runs output")
    header, rows = compare_runs(runs)
    with atomic_write(table, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows([["" if c is None else c for c in row] for row in rows])
    plot_runs(runs, figure)
    return format_comparison(header, rows), table, figure

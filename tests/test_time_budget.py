"""``--time``: a training budget in minutes. The trainer's clock is a fake advanced by each training step and each
validation (no sleeps, no real timing), so the estimated epochs, the schedule length, the stop and resume are exact."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import ssd
from builders import TINY_TRAIN
from ssd.errors import ConfigError
from ssd.training import trainer as trainer_module
from ssd.training.budget import epochs_that_fit
from ssd.training.callbacks import Callback
from ssd.training.config import TrainConfig
from ssd.training.outputs import ResultsCSV
from ssd.training.trainer import Trainer, train

# conftest's shapes (16 train / 8 val images of 64 px) under TINY_TRAIN: 2 steps of 8 images per epoch
STEP, VALIDATION = 30.0, 15.0  # fake seconds: an epoch trains 60 s and validates 15 s


class FakeClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> FakeClock:
    """The trainer's clock, advanced STEP by every training step and VALIDATION by every validation. A step only
    advances the lr schedule (the budget reads the clock, not the weights), and the run writes results.csv and
    stop.txt but no figures, which keeps each run to seconds."""
    fake = FakeClock()
    validate = Trainer._validate

    def timed_step(self, *args, **kwargs):
        fake.now += STEP
        self.optimizer.step()  # no gradients: the weights stay as they are
        self.scheduler.step()
        return [1.0, 0.5, 0.5]

    def timed_validate(self):
        fake.now += VALIDATION
        return validate(self)

    monkeypatch.setattr(Trainer, "clock", staticmethod(fake))
    monkeypatch.setattr(Trainer, "train_step", timed_step)
    monkeypatch.setattr(Trainer, "_validate", timed_validate)
    monkeypatch.setattr(trainer_module, "output_callbacks", lambda: [ResultsCSV()])
    return fake


class Watch(Callback):
    """The trainer's epoch count at every epoch start and end, and the trainer itself."""

    def __init__(self, die_at: int | None = None) -> None:
        self.at_start: list[int] = []
        self.at_end: list[int] = []
        self.die_at = die_at
        self.trainer = None

    def on_epoch_start(self, trainer):
        if trainer.epoch == self.die_at:
            raise KeyboardInterrupt  # killed after the previous epoch's last.pt
        self.trainer = trainer
        self.at_start.append(trainer.epochs)

    def on_epoch_end(self, trainer, row):
        self.at_end.append(trainer.epochs)


# the lr of each row (after the epoch's last step) as a share of the peak: warmup ends after epoch 1's 2 steps; from
# epoch 2 the cosine is 8 steps long: 0.01 + 0.99 * (1 + cos(pi * (step - 2) / 6)) / 2 at steps 4, 6, 8
LR_4 = [1.0, 0.7525, 0.2575, 0.01]
STOP_4 = ("time budget: stopped after epoch 4, 5.00 of 5 minutes trained; the next epoch (about 1.25 min) would "
          "not fit (--time 5)")


def test_epochs_that_fit_by_hand():
    assert epochs_that_fit(300, 60, 60, 0) == 4  # 240 s left for 60 s epochs
    assert epochs_that_fit(300, 135, 75, 15) == 2  # (300 - 135 - 15) / 75
    assert epochs_that_fit(300, 285, 75, 15) == 0
    assert epochs_that_fit(300, 310, 75, 0) == 0  # past the budget: none, never negative
    with pytest.raises(ValueError, match="epoch_cost must be > 0 seconds, got 0"):
        epochs_that_fit(300, 0, 0, 0)


@pytest.mark.parametrize("value", [0, -1.5, 1e308, 527041])
def test_time_must_be_positive_minutes_within_a_year(value):
    rule = "must be a number of minutes in (0, 527040] (a year; ssd.limits.MAX_TRAIN_MINUTES) (--time)"
    with pytest.raises(ConfigError, match=re.escape(f"time={value!r} is invalid: {rule}")):
        TrainConfig(time=value)
    assert TrainConfig(time=527040).time == 527040


def test_time_1e308_on_the_command_line_exits_2_before_a_run_directory(tmp_path, capsys):
    from ssd.cli import main

    project = tmp_path / "runs"
    assert main(["train", "--data", "d.yaml", "--project", str(project), "--time", "1e308"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: ssd train: time=1e+308 is invalid: must be a number of minutes in (0, 527040] (a year; "
                   "ssd.limits.MAX_TRAIN_MINUTES) (--time)"]
    assert not project.exists()


def test_a_year_of_budget_for_microsecond_epochs_is_at_most_max_epochs():
    assert epochs_that_fit(527040 * 60.0, 0, 1e-6, 0) == 100_000


def test_time_from_the_command_line_is_a_train_config_field():
    from ssd.cli.parsers import build_parser, parse

    assert parse(build_parser(), ["train", "--data", "d.yaml", "--time", "2.5"]).time == 2.5


def test_budget_sets_epochs_schedule_and_stop_file(shapes, tmp_path, clock):
    """Epoch 1 trains 60 s: 4 more fit in 300 s (5 estimated). From epoch 2 an epoch costs 75 s with validation and
    the current validation (15 s) is reserved: after epoch 2 two more fit (4), after 3 one, after 4 none."""
    watch = Watch()
    result = train(data=str(shapes), time=5, project=str(tmp_path), callbacks=[watch], **TINY_TRAIN)
    assert watch.at_start == [50, 5, 4, 4]  # --epochs (the default 50) until the first estimate
    assert watch.at_end == [5, 4, 4, 4]
    trainer = watch.trainer
    assert trainer.epochs == 4 and len(result.history) == 4
    assert [row["time"] for row in result.history] == [75.0, 150.0, 225.0, 300.0]
    assert all("val/mAP" in row for row in result.history)
    schedule = trainer.scheduler.lr_lambdas[0]
    assert (schedule.total, schedule.warmup) == (8, 2)  # 4 epochs of 2 steps; 1 warmup epoch
    assert [row["lr"] / trainer.config.lr for row in result.history] == pytest.approx(LR_4)
    assert result.stop_reason == STOP_4
    assert (result.run_dir / "stop.txt").read_text() == STOP_4 + "\n"
    assert ssd.load_checkpoint(result.run_dir / "weights" / "last.pt")["epoch"] == 3


def test_budget_validates_the_last_epoch_between_intervals(shapes, tmp_path, clock):
    """With --val-interval 3 the epoch the budget ends at is validated although 3 does not divide it."""
    result = train(data=str(shapes), time=4, val_interval=3, project=str(tmp_path), **TINY_TRAIN)
    # epoch 1: 60 s, 3 more fit in 240 s (est. 4); epoch 2 (60 s, no validation): est. (240-120)/60 + 2 = 4;
    # epoch 3 validates (75 s, est. 4, 195 s); epoch 4: (240-255-15) < 0, the last: validated, 270 s. Before the
    # first validation its duration is unknown (counted 0), which is what overran this budget by 30 s

    assert [row["time"] for row in result.history] == [60.0, 120.0, 195.0, 270.0]
    assert ["val/mAP" in row for row in result.history] == [False, False, True, True]


@pytest.mark.slow
def test_resume_continues_the_remaining_budget_and_ends_spent(shapes, tmp_path, clock):
    with pytest.raises(KeyboardInterrupt):
        train(data=str(shapes), time=5, project=str(tmp_path), callbacks=[Watch(die_at=2)], **TINY_TRAIN)
    run = tmp_path / "exp"
    assert ssd.load_checkpoint(run / "weights" / "last.pt")["epoch"] == 1
    clock.now = 1000.0  # a new process: only the durations count
    watch = Watch()
    resumed = train(resume=str(run), quiet=True, callbacks=[watch])
    # 150 s trained in 2 epochs of 75 s: 2 more fit, and the schedule goes on as in the uninterrupted run
    assert watch.at_start == [4, 4]
    assert [row["time"] for row in resumed.history] == [75.0, 150.0, 225.0, 300.0]
    assert [row["lr"] / watch.trainer.config.lr for row in resumed.history] == pytest.approx(LR_4)
    assert resumed.stop_reason == STOP_4

    again = train(resume=str(run), quiet=True)  # the budget is spent: nothing trains
    assert again.stop_reason == ("time budget: the run has trained 5.00 of its 5 minutes (4 epochs of about 1.25 "
                                 "min); no further epoch fits (--time 5)")
    assert len(again.history) == 4 and (run / "stop.txt").read_text() == again.stop_reason + "\n"

    longer = train(resume=str(run), quiet=True, time=6.5)  # a larger budget for the whole run: one more epoch
    assert [row["time"] for row in longer.history][-1] == 375.0 and len(longer.history) == 5
    assert longer.stop_reason.startswith("time budget: stopped after epoch 5, 6.25 of 6.5 minutes trained")


DDP_SCRIPT = """
import os, sys, torch
import ssd
from ssd.training.trainer import Trainer

rank = int(os.environ["RANK"])
now = [0.0]

def timed_step(self, *args, **kwargs):  # rank 1's clock runs 4 times faster: only rank 0's estimate counts
    now[0] += 30.0 * (1 + 3 * rank)
    self.optimizer.step()
    self.scheduler.step()
    return [1.0, 0.5, 0.5]

Trainer.clock = staticmethod(lambda: now[0])
Trainer.train_step = timed_step  # the real steps and their collectives are left out: the decision is the test
result = ssd.train(data=sys.argv[1], project=sys.argv[2], model="ssd_tiny", image_size=64, batch_size=4, workers=0,
                   device="cpu", quiet=True, seed=0, augment="none", num_plot_images=0, time=4)
torch.save({"epochs": len(result.history), "lr": [row["lr"] for row in result.history]},
           os.path.join(sys.argv[3], f"rank{rank}.pt"))
"""


@pytest.mark.slow
def test_torchrun_ranks_take_rank_zeros_decision(shapes, tmp_path):
    script = tmp_path / "budget_ddp.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT))
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(shapes), str(tmp_path / "runs"), str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rank0, rank1 = (torch.load(out / f"rank{r}.pt") for r in (0, 1))
    # rank 0: 2 steps of 30 s per epoch (each rank holds 8 images), 240 s: 4 epochs; rank 1 alone would stop at 1
    assert rank0["epochs"] == rank1["epochs"] == 4
    assert rank0["lr"] == rank1["lr"]  # the same schedule, sized to rank 0's estimate

"""SIGKILL `ssd train` at random moments: last.pt always loads, --resume carries on, no temporary file outlives a start.

A tiny run (16 synthetic 64 px images, ssd_tiny, one step per epoch, with an EMA of the weights) is killed three
times at seeded random moments; each kill is followed by a resume, the last resume runs to the end. Before each resume
a stale temporary file, as a kill in the middle of a checkpoint write leaves it, is planted in weights/ (kills land
there rarely by chance on so small a model); the resumed run must remove it when it starts. Waits are bounded polls
for files, never timing assertions.
"""

import csv
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ssd
from builders import make_dataset
from ssd.weights.checkpoint import load_checkpoint

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL")

EPOCHS, KILLS = 10, 3
DEADLINE_S = 300  # a bound for a loaded machine, not a timing expectation


def _start(args, cwd, log):
    env = {**os.environ, "PYTHONPATH": str(Path(ssd.__file__).parents[1]), "OMP_NUM_THREADS": "1"}
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "ssd", "train", *args], cwd=cwd, env=env, stdout=out,
                                stderr=subprocess.STDOUT)


def _wait_for(condition, proc, log, what):
    """Poll until ``condition()`` holds; fail (with the run's output) if the run ends first or never gets there."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc.poll() is not None and not condition():
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"no {what} within {DEADLINE_S} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


def _run_to_a_random_moment(proc, last, rng):
    """Let the run go on for a random time up to a second, but no further than two more saves of ``last`` (an epoch
    lasts a fraction of a second: so three kills leave epochs for the last resume)."""
    end, saves, stamp = time.monotonic() + rng.uniform(0.0, 1.0), 0, last.stat().st_mtime_ns
    while time.monotonic() < end and saves < 2 and proc.poll() is None:
        time.sleep(0.005)
        if last.stat().st_mtime_ns != stamp:
            saves, stamp = saves + 1, last.stat().st_mtime_ns


@pytest.mark.slow
def test_sigkill_at_random_moments_then_resume(tmp_path):
    make_dataset("voc", tmp_path / "data", train=16, val=8, size=64, classes=2)
    weights = tmp_path / "runs" / "exp" / "weights"
    last, log = weights / "last.pt", tmp_path / "train.log"
    fresh = ["--data", "data", "--model", "ssd_tiny", "--image-size", "64", "--workers", "0", "--batch-size", "16",
             "--epochs", str(EPOCHS), "--val-interval", "100", "--num-plot-images", "1", "--device", "cpu",
             "--project", "runs", "--quiet", "--ema"]
    rng = random.Random(2024)
    planted, epoch, kills = [], -1, 0
    while True:
        proc = _start(fresh if not planted else ["--resume", str(weights.parent), "--quiet"], tmp_path, log)
        if not planted:
            _wait_for(last.exists, proc, log, "weights/last.pt")
        else:  # started: the stale temporary planted before this resume is gone
            _wait_for(lambda: not planted[-1].exists(), proc, log, f"removal of {planted[-1].name}")
        if kills == KILLS:
            break
        _run_to_a_random_moment(proc, last, rng)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        if proc.wait(timeout=DEADLINE_S) == 0:
            break  # the run ended before the kill: nothing left to resume
        assert proc.returncode == -signal.SIGKILL, log.read_text()[-3000:]

        ckpt = load_checkpoint(last)  # never half-written, whatever the moment of the kill
        assert ckpt["epoch"] >= epoch and len(ckpt["history"]) == ckpt["epoch"] + 1
        epoch = ckpt["epoch"]
        # what a kill in the middle of save_checkpoint leaves behind (random suffix, partial zip archive)
        suffix = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(8))
        planted.append(weights / f".last.pt.{suffix}.ssdtmp")
        planted[-1].write_bytes(last.read_bytes()[:4096])

    assert proc.wait(timeout=DEADLINE_S) == 0, log.read_text()[-3000:]
    assert kills == KILLS and len(planted) == KILLS
    assert sorted(p.name for p in weights.iterdir()) == ["best.pt", "last.pt"]  # no temporary file survived
    ckpt = load_checkpoint(last)
    assert ckpt["epoch"] == EPOCHS - 1 and [row["epoch"] for row in ckpt["history"]] == list(range(1, EPOCHS + 1))
    assert ckpt["ema"]["updates"] == EPOCHS  # one step per epoch, each averaged once whatever the kills
    assert load_checkpoint(weights / "best.pt")["epoch"] == EPOCHS - 1  # validated once, at the end
    with open(weights.parent / "results.csv", newline="") as f:
        assert [int(row["epoch"]) for row in csv.DictReader(f)] == list(range(1, EPOCHS + 1))

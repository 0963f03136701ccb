"""DDP: two CPU processes (gloo) launched by torchrun train a few steps with an EMA of the weights, end with identical
(averaged) weights and write exactly one run directory; metrics cover the full validation split."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ssd
import ssd.distributed as ddp

SCRIPT = """
import os, sys, torch
import ssd
result = ssd.train(data=sys.argv[1], project=sys.argv[2], model="ssd_tiny", image_size=128, epochs=1, batch_size=8,
                   workers=0, device="cpu", quiet=True, seed=0, ema=True)
rank = os.environ["RANK"]
torch.save({"model": result.model.state_dict(), "map": result.metrics["map"],
            "run_dir": str(result.run_dir)}, os.path.join(sys.argv[3], f"rank{rank}.pt"))
"""


def test_single_process_helpers_are_identity():
    info = ddp.DistInfo()
    assert not info.enabled and info.is_main
    assert ddp.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert ddp.broadcast_object(3) == 3
    assert ddp.any_true(True, torch.device("cpu")) is True


def test_steps_per_epoch_equal_on_every_rank():
    assert ddp.steps_per_epoch(49, 8, 2) == 3  # ranks hold 25 and 24 images: both run 3 full batches
    assert ddp.steps_per_epoch(48, 8, 1) == 6


@pytest.mark.slow
def test_torchrun_two_cpu_ranks_identical_weights_one_run_dir(synthetic_voc, tmp_path):
    script = tmp_path / "ddp_train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    project, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
           str(synthetic_voc), str(project), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    rank0, rank1 = (torch.load(out / f"rank{r}.pt") for r in (0, 1))
    assert rank0["model"].keys() == rank1["model"].keys()
    assert all(torch.equal(rank0["model"][k], rank1["model"][k]) for k in rank0["model"])
    assert rank0["map"] == rank1["map"]  # every rank scores the gathered full split
    assert [p.name for p in project.iterdir()] == ["exp"]
    assert rank0["run_dir"] == rank1["run_dir"] == str(project / "exp")
    saved = ssd.load_checkpoint(project / "exp" / "weights" / "last.pt")
    assert all(torch.equal(saved["model"][k], rank0["model"][k]) for k in rank0["model"])
    # the gathered metrics equal a single-process evaluation of the saved weights over the whole split
    single = ssd.evaluate(project / "exp" / "weights" / "last.pt", synthetic_voc, device="cpu")
    assert single["map"] == pytest.approx(rank0["map"], abs=1e-6)

"""DDP: two CPU processes (gloo) launched by torchrun train a few steps with an EMA of the weights, end with identical
(averaged) weights and write exactly one run directory; metrics cover the full validation split."""

from __future__ import annotations

import json
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


def test_a_large_datasets_first_index_build_fits_the_process_groups_timeout(monkeypatch):
    """Rank 0 builds the index while the others wait in a collective: NCCL's default 10 minutes is too short, so the
    group waits 3 hours (SSD_DIST_TIMEOUT seconds when set), and setup passes it to init_process_group."""
    from datetime import timedelta

    from ssd.errors import ConfigError

    monkeypatch.delenv("SSD_DIST_TIMEOUT", raising=False)
    assert ddp.process_group_timeout() == timedelta(hours=3)
    monkeypatch.setenv("SSD_DIST_TIMEOUT", "7200")
    assert ddp.process_group_timeout() == timedelta(hours=2)
    for bad in ("0", "nan", "2h", "1e9"):
        monkeypatch.setenv("SSD_DIST_TIMEOUT", bad)
        with pytest.raises(ConfigError, match=rf"^SSD_DIST_TIMEOUT='{bad}': must be a number of seconds in \(0, "):
            ddp.process_group_timeout()
    monkeypatch.setenv("SSD_DIST_TIMEOUT", "60")
    seen = {}
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *args, **kwargs: seen.update(kwargs))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(ddp, "quiet_other_ranks", lambda rank: None)  # this test process stays rank 0's
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}.items():
        monkeypatch.setenv(key, value)
    assert ddp.setup("cpu")[2] and seen == {"rank": 1, "world_size": 2, "timeout": timedelta(seconds=60)}


def test_rank_device_puts_each_torchrun_rank_on_its_own_gpu(monkeypatch):
    set_to = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rule only: no GPU is touched
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", set_to.append)
    second_of_two, alone = ddp.DistInfo(rank=1, world_size=2, local_rank=1), ddp.DistInfo(local_rank=3)
    assert [str(ddp.rank_device(name, second_of_two)) for name in ("cuda", "auto", "cuda:2", "cpu")] == [
        "cuda:1", "cuda:1", "cuda:2", "cpu"]
    assert [str(ddp.rank_device(name, alone)) for name in ("cuda", "auto", "cuda:2")] == ["cuda:0", "cuda:0", "cuda:2"]
    assert [str(d) for d in set_to] == ["cuda:1", "cuda:1", "cuda:2", "cuda:0", "cuda:0", "cuda:2"]


def test_steps_per_epoch_equal_on_every_rank():
    assert ddp.steps_per_epoch(49, 8, 2) == 3  # ranks hold 25 and 24 images: both run 3 full batches
    assert ddp.steps_per_epoch(48, 8, 1) == 6


def test_leader_first_builds_in_the_only_process_and_sends_the_token_even_when_the_build_raises(monkeypatch):
    follow = lambda token: pytest.fail(f"followed {token}")  # noqa: E731
    assert ddp.leader_first(lambda: {"id": 7}, lambda made: made["id"], follow) == {"id": 7}
    assert ddp.leader_first(lambda: None, lambda made: pytest.fail("token of None"), follow) is None
    sent = []
    monkeypatch.setattr("ssd.distributed.broadcast_object", lambda obj: sent.append(obj) or obj)
    with pytest.raises(KeyError, match="'id'"):
        ddp.leader_first(lambda: {}["id"], lambda made: pytest.fail("token of a failed build"), follow)
    assert sent == [None]
    monkeypatch.setattr("ssd.distributed.rank", lambda: 1)  # another rank: follows what rank 0 sent
    monkeypatch.setattr("ssd.distributed.broadcast_object", lambda obj: sent.append(obj) or 7)
    assert ddp.leader_first(lambda: pytest.fail("built"), lambda made: 0, lambda token: ("followed", token)) == (
        "followed", 7)
    assert sent == [None, None]


LEADER_SCRIPT = """
import json, os, sys
import torch.distributed as dist
import ssd.distributed as ddp
dist.init_process_group("gloo")
built, out = [], []
def build(fail):
    built.append(fail)
    if fail:
        raise RuntimeError("rank 0 failed")
    return {"id": 7}
for fail in (False, True):  # the second call: rank 0 raises, rank 1 follows None and both go on in step
    try:
        out.append(ddp.leader_first(lambda: build(fail), lambda made: made["id"], lambda token: ["followed", token]))
    except RuntimeError as e:
        out.append(str(e))
dist.barrier()
with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
    json.dump({"built": built, "out": out}, f)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_torchrun_two_ranks_leader_first_builds_on_rank_0_and_the_other_follows_its_token(tmp_path):
    script, out = tmp_path / "leader.py", tmp_path / "out"
    script.write_text(LEADER_SCRIPT)
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script), str(out)]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / str(rank)).read_text()) for rank in (0, 1)]
    assert ranks == [{"built": [False, True], "out": [{"id": 7}, "rank 0 failed"]},
                     {"built": [], "out": [["followed", 7], ["followed", None]]}]


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

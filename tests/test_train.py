"""Training: config, schedule, run directory, a 2-epoch run, resume equality, non-finite loss, YOLO seed scenario,
``evaluate`` agreeing with the end of training."""

from __future__ import annotations

import csv
import dataclasses
import math
import re
from pathlib import Path

import pytest
import torch

import ssd
import ssd.device as device
from builders import TINY_TRAIN, make_dataset
from ssd.errors import ConfigError, DataError, NonFiniteLossError
from ssd.evaluation.evaluator import evaluate
from ssd.files import make_run_dir
from ssd.training import optim, state, trainer
from ssd.training.config import TrainConfig
from ssd.training.optim import LRSchedule, param_groups
from ssd.training.trainer import train

# ssd_tiny at 128 px with the light augmentation and the default 4 drawn images: seconds per epoch of the synthetic
# fixture on 2 cores
FAST = {**TINY_TRAIN, "image_size": 128, "augment": "light", "num_plot_images": 4}


# ------------------------------------------------------------------------------------------------------ config
def test_config_unknown_key_names_closest():
    with pytest.raises(ConfigError, match=r"unknown option 'epoch'; did you mean 'epochs'"):
        TrainConfig().update(epoch=3)
    with pytest.raises(ConfigError, match=r"optimizer='adam' is invalid: choose one of sgd, adamw"):
        TrainConfig(optimizer="adam")
    with pytest.raises(ConfigError, match="batch_size=0 is invalid"):
        TrainConfig().update(batch_size=0)


def test_config_yaml_round_trip_and_unknown_yaml_key(tmp_path):
    config = TrainConfig(data="d.yaml", epochs=7, milestones=[3, 5], scheduler="multistep")
    path = tmp_path / "c.yaml"
    config.to_yaml(path)
    assert TrainConfig.from_yaml(path) == config
    path.write_text("epochs: 3\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"unknown key in .*c.yaml 'learning_rate'"):
        TrainConfig.from_yaml(path)


def test_config_per_model_defaults():
    tiny = TrainConfig(model="ssd_tiny").resolved()
    assert (tiny.optimizer, tiny.lr) == ("adamw", 3e-3)
    vgg = TrainConfig(model="ssd300_vgg16").resolved()
    assert (vgg.optimizer, vgg.lr, vgg.momentum, vgg.weight_decay) == ("sgd", 1e-3, 0.9, 5e-4)
    assert TrainConfig(model="ssd_tiny", lr=0.01).resolved().lr == 0.01
    assert TrainConfig(epochs=9, scheduler="multistep").resolved().milestones == [6, 8]


def test_lr_schedule_warmup_cosine_multistep_by_hand():
    cos = LRSchedule(total=10, warmup=2, kind="cosine", final_ratio=0.0, warmup_start=0.0)
    assert [cos(i) for i in (0, 1, 2)] == [0.0, 0.5, 1.0]
    assert cos(6) == pytest.approx(0.5)  # half way through the 8 cosine iterations
    assert cos(10) == pytest.approx(0.0)
    step = LRSchedule(total=10, warmup=0, kind="multistep", milestones=(4, 8), gamma=0.1)
    assert [step(3), step(4), step(8)] == [1.0, 0.1, pytest.approx(0.01)]


def test_run_dir_increments_never_overwrites(tmp_path):
    assert [make_run_dir(tmp_path, "exp").name for _ in range(3)] == ["exp", "exp2", "exp3"]
    assert make_run_dir(tmp_path, "exp", exist_ok=True).name == "exp"


def test_param_groups_no_decay_on_norms_and_biases():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4))
    decay, no_decay = param_groups(model, 5e-4)
    assert [p.shape for p in decay["params"]] == [torch.Size([4, 3, 3, 3])]
    assert len(no_decay["params"]) == 3 and no_decay["weight_decay"] == 0.0


# ---------------------------------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def two_epochs(synthetic_voc, tmp_path_factory):
    project = tmp_path_factory.mktemp("runs")
    return train(data=str(synthetic_voc), epochs=2, project=str(project), **FAST)


@pytest.mark.slow
def test_two_epochs_lower_loss_and_every_file(two_epochs):
    result = two_epochs
    assert all(math.isfinite(x) for x in result.step_losses)
    assert result.history[-1]["train/loss"] < result.step_losses[0]
    assert result.history[-1]["val/mAP"] == result.metrics["map"]
    run = result.run_dir
    for name in ("config.yaml", "results.csv", "results.png", "pr_curves.png", "labels.png",
                 "weights/last.pt", "weights/best.pt"):
        assert (run / name).is_file(), name
    assert list(run.glob("events.out.tfevents*"))
    assert len(list((run / "val_predictions").glob("*.jpg"))) == 4
    rows = (run / "results.csv").read_text().splitlines()
    assert len(rows) == 3  # header + 2 epochs
    assert TrainConfig.from_yaml(run / "config.yaml").epochs == 2
    ckpt = ssd.load_checkpoint(run / "weights" / "last.pt")
    assert ckpt["epoch"] == 1 and ckpt["class_names"] == ["circle", "square", "triangle"]
    assert {"optimizer", "scheduler", "scaler", "rng", "train_config"} <= set(ckpt)


def test_validation_stores_its_best_f1_point_in_the_checkpoints_and_results_csv(two_epochs):
    """The last validation's best-F1 point is last.pt's operating point, its precision and recall are the row's,
    and predict with the checkpoint defaults to that confidence."""
    run = two_epochs.run_dir
    point = ssd.load_checkpoint(run / "weights" / "last.pt")["operating_point"]
    assert set(point) == {"score_threshold", "precision", "recall", "f1", "split"} and point["split"] == "val"
    assert 0 <= point["score_threshold"] < 1
    assert 0 < point["f1"] <= 1  # the mean of the classes' F1, not the F1 of the mean P and R
    rows = list(csv.DictReader((run / "results.csv").open()))
    assert float(rows[-1]["val/precision"]) == pytest.approx(point["precision"])
    assert float(rows[-1]["val/recall"]) == pytest.approx(point["recall"])
    best = ssd.load_checkpoint(run / "weights" / "best.pt")
    best_row = rows[best["best_epoch"] - 1]
    assert float(best_row["val/precision"]) == pytest.approx(best["operating_point"]["precision"])
    assert ssd.load(run / "weights" / "last.pt").confidence()[0] == point["score_threshold"]


def test_evaluate_checkpoint_equals_end_of_training(two_epochs, synthetic_voc):
    metrics = evaluate(two_epochs.run_dir / "weights" / "last.pt", synthetic_voc, metric="voc07", device="cpu")
    assert metrics["map"] == pytest.approx(two_epochs.metrics["map"], abs=1e-9)
    assert metrics["class_names"] == ["circle", "square", "triangle"]


@pytest.mark.slow
def test_resume_after_kill_matches_uninterrupted_run(two_epochs, synthetic_voc, tmp_path, monkeypatch):
    saved = state.save_checkpoint

    def save_then_die(path, *args, **kwargs):  # the process dies right after epoch 1's last.pt
        saved(path, *args, **kwargs)
        if Path(path).name == "last.pt":
            raise KeyboardInterrupt

    monkeypatch.setattr(state, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(data=str(synthetic_voc), epochs=2, project=str(tmp_path), **FAST)
    monkeypatch.setattr(state, "save_checkpoint", saved)
    run = tmp_path / "exp"
    assert ssd.load_checkpoint(run / "weights" / "last.pt")["epoch"] == 0

    resumed = train(resume=str(run), quiet=True)
    assert resumed.run_dir == run
    assert not (tmp_path / "exp2").exists()
    a = ssd.load_checkpoint(two_epochs.run_dir / "weights" / "last.pt")["model"]
    b = ssd.load_checkpoint(run / "weights" / "last.pt")["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.metrics["map"] == two_epochs.metrics["map"]
    assert len((run / "results.csv").read_text().splitlines()) == 3


def test_train_state_reads_and_writes_the_checkpoints_training_schema(two_epochs):
    """A run's last.pt holds the training schema; TrainState continues after its epoch and writes its keys back
    with the same values (metrics' arrays, already tensors in the file, are the evaluation's to write)."""
    ckpt = ssd.load_checkpoint(two_epochs.run_dir / "weights" / "last.pt")
    assert {*state.TRAINING_STATE, "operating_point", "train_images", "category_ids"} <= set(ckpt)
    restored = state.TrainState.from_checkpoint(ckpt, epochs=3)
    assert (restored.epochs, restored.start_epoch, restored.epoch, restored.stop_reason) == (3, 2, 2, None)
    again = dataclasses.replace(restored, epoch=1).to_checkpoint()
    assert set(again) == {"epoch", "best_map", "best_epoch", "history", "metrics", "operating_point",
                          "nonfinite_skipped", "stop_reason"} <= set(state.TRAINING_STATE) | {"operating_point"}
    assert {k: v for k, v in again.items() if k != "metrics"} == {k: ckpt[k] for k in again if k != "metrics"}
    assert again["metrics"]["map"] == ckpt["metrics"]["map"] == two_epochs.metrics["map"]


@pytest.mark.slow
def test_nonfinite_loss_stops_naming_step_and_files(tmp_path, monkeypatch):
    data = make_dataset("yolo", tmp_path / "data")
    calls = {"n": 0}
    real = trainer.MultiBoxLoss.forward

    def nan_on_second_step(self, *args):
        calls["n"] += 1
        loc_loss, cls_loss = real(self, *args)
        return (loc_loss * float("nan"), cls_loss) if calls["n"] == 2 else (loc_loss, cls_loss)

    monkeypatch.setattr(trainer.MultiBoxLoss, "forward", nan_on_second_step)
    small = {**FAST, "batch_size": 4, "augment": "none"}
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss \(nan\) at epoch 1, step 2") as info:
        train(data=str(data), epochs=1, project=str(tmp_path / "runs"), **small)
    assert len(re.findall(r"images/train/img\d+\.jpg", str(info.value))) == 4  # the batch's 4 files
    assert not list(tmp_path.glob("runs/*/weights/*.pt"))  # nothing saved

    calls["n"] = 0
    result = train(data=str(data), epochs=1, project=str(tmp_path / "runs"), skip_nonfinite=True, **small)
    assert result.nonfinite_skipped == 1 and len(result.step_losses) == 2  # 3 steps, one skipped
    assert all(torch.isfinite(p).all() for p in result.model.parameters())


# ------------------------------------------------------------------------------------- the seed scenario (YOLO)
@pytest.mark.slow
def test_yolo_six_classes_train_without_num_classes(tmp_path):
    data = make_dataset("yolo", tmp_path / "ok")
    result = train(data=str(data), epochs=1, project=str(tmp_path / "runs"), **FAST)
    assert result.model.num_classes == 6
    assert result.model.class_names == ["a", "b", "c", "d", "e", "f"]
    assert math.isfinite(result.metrics["map"])


def test_yolo_label_out_of_range_refused_before_training(tmp_path):
    data = make_dataset("yolo", tmp_path / "bad", bad_label=True)
    with pytest.raises(DataError, match=r"img5\.txt.*3") as info:
        train(data=str(data), epochs=1, project=str(tmp_path / "runs"), **FAST)
    assert "6" in str(info.value)
    assert not (tmp_path / "runs").exists()  # refused before building anything


@pytest.mark.slow
def test_yolo_label_out_of_range_dropped_with_skip_invalid(tmp_path, ssd_messages):
    data = make_dataset("yolo", tmp_path / "bad", bad_label=True)
    result = train(data=str(data), epochs=1, project=str(tmp_path / "runs"), skip_invalid=True,
                   **{**FAST, "augment": "none"})
    assert any("skip_invalid: dropped 1 object(s) and 0 image(s)" in m for m in ssd_messages())
    assert result.model.num_classes == 6


@pytest.mark.slow
def test_amp_on_cpu_autocasts_to_bfloat16_and_ema_averages_float32_weights(tmp_path, monkeypatch):
    supported = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert device.amp_dtype(torch.device("cpu")) == (torch.bfloat16 if supported else None)
    monkeypatch.setattr(optim, "amp_dtype", lambda device: torch.bfloat16)  # the path, even where it is slow
    dtypes = []
    build = trainer.build_run_model

    def build_and_watch(*args, **kwargs):
        model = build(*args, **kwargs)
        first_conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
        first_conv.register_forward_hook(lambda module, inputs, output: dtypes.append((module.training, output.dtype)))
        return model

    monkeypatch.setattr(trainer, "build_run_model", build_and_watch)
    data = make_dataset("yolo", tmp_path / "ok")
    result = train(data=str(data), epochs=1, amp=True, ema=True, project=str(tmp_path / "runs"), **FAST)
    assert {dtype for training, dtype in dtypes if training} == {torch.bfloat16}  # every training step
    assert all(math.isfinite(v) for v in result.step_losses)
    ema = ssd.load_checkpoint(result.run_dir / "weights" / "last.pt")["ema"]  # the average of the autocast steps
    assert ema["updates"] == len(result.step_losses)
    assert all(p.dtype == torch.float32 and bool(p.isfinite().all()) for p in result.model.parameters())

"""Training extension points and features: callbacks (order of the hooks, teardown on failure), TensorBoard as an
optional extra, validation loss in results.csv, EMA of the weights (exact numbers, saved, resumed), early stopping."""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import ssd
from builders import TINY_TRAIN
from ssd.data.gate import load_training_data
from ssd.errors import CallbackError, ConfigError, DataError
from ssd.evaluation.evaluator import evaluate, split_loader
from ssd.loss import MultiBoxLoss
from ssd.training import trainer
from ssd.training.callbacks import Callback, EarlyStopping, check_callbacks
from ssd.training.config import TrainConfig
from ssd.training.optim import batch_loss, build_ema, ema_decay, validation_loss
from ssd.training.trainer import train

# 16 train / 8 val images of 64 px, 2 classes: 2 steps of 8 images per epoch


class Recorder(Callback):
    """Every hook call as ``"hook epoch"`` (the trainer's 0-based epoch), optionally failing at one hook."""

    def __init__(self, fail_at: str | None = None) -> None:
        self.calls: list[str] = []
        self.rows: list[dict] = []
        self.fail_at = fail_at

    def _seen(self, hook: str, trainer: trainer.Trainer) -> None:
        self.calls.append(f"{hook} {trainer.epoch}")
        if hook == self.fail_at:
            raise RuntimeError(f"callback failed in {hook}")

    def on_train_start(self, trainer):
        self._seen("on_train_start", trainer)

    def on_epoch_start(self, trainer):
        self._seen("on_epoch_start", trainer)

    def on_train_batch_end(self, trainer, step, losses):
        self._seen("on_train_batch_end", trainer)

    def on_val_end(self, trainer, metrics):
        self._seen("on_val_end", trainer)

    def on_epoch_end(self, trainer, row):
        self.rows.append(row)
        self._seen("on_epoch_end", trainer)

    def on_fit_end(self, trainer):
        self._seen("on_fit_end", trainer)

    def on_teardown(self, trainer):
        self._seen("on_teardown", trainer)


# --------------------------------------------------------------------------------------------------- callbacks
@pytest.mark.slow
def test_a_callback_sees_every_hook_in_order_and_val_loss_reaches_results_csv(shapes, tmp_path):
    recorder = Recorder()
    result = train(data=str(shapes), epochs=2, val_interval=2, project=str(tmp_path), callbacks=[recorder],
                   **TINY_TRAIN)
    assert recorder.calls == [
        "on_train_start 0",
        "on_epoch_start 0", "on_train_batch_end 0", "on_train_batch_end 0", "on_epoch_end 0",
        "on_epoch_start 1", "on_train_batch_end 1", "on_train_batch_end 1", "on_val_end 1", "on_epoch_end 1",
        "on_fit_end 1", "on_teardown 1"]
    assert recorder.rows == result.history
    with open(result.run_dir / "results.csv", newline="") as f:
        first, second = csv.DictReader(f)
    assert (first["val/loss"], first["val/mAP"]) == ("", "")  # epoch 1 was not validated
    last = result.history[-1]
    assert float(second["val/loss"]) == last["val/loss"]
    assert last["val/loss"] == pytest.approx(last["val/loc_loss"] + last["val/cls_loss"], rel=1e-6)
    # the same loss recomputed for the saved weights on the validation split
    model = ssd.model_from_checkpoint(result.run_dir / "weights" / "last.pt")
    loader = split_loader(load_training_data(shapes).records("val"), model.class_names, model.config, batch_size=8)
    again = validation_loss(model, loader, MultiBoxLoss(variances=model.config.variances), torch.device("cpu"))
    assert again == pytest.approx({k: last[k] for k in ("val/loss", "val/loc_loss", "val/cls_loss")}, rel=1e-6)


def test_a_failing_callback_still_gets_teardown(shapes, tmp_path):
    recorder = Recorder(fail_at="on_train_batch_end")
    with pytest.raises(RuntimeError, match="callback failed in on_train_batch_end"):
        train(data=str(shapes), epochs=1, project=str(tmp_path), callbacks=[recorder], **TINY_TRAIN)
    assert recorder.calls == ["on_train_start 0", "on_epoch_start 0", "on_train_batch_end 0", "on_teardown 0"]


def test_an_object_without_the_hooks_is_refused_before_anything_runs(shapes, tmp_path):
    with pytest.raises(TypeError, match=r"callback 3 lacks on_train_start, on_epoch_start, .*, on_teardown: "
                                        r"subclass ssd.training.callbacks.Callback"):
        train(data=str(shapes), epochs=1, project=str(tmp_path / "runs"), callbacks=[3], **TINY_TRAIN)
    assert not (tmp_path / "runs").exists()


def test_a_callback_class_given_instead_of_an_instance_is_refused_before_anything_runs(shapes, tmp_path):
    with pytest.raises(CallbackError, match=r"callback EarlyStopping is a class: pass an instance of it, "
                                            r"EarlyStopping\(\.\.\.\)"):
        train(data=str(shapes), epochs=1, project=str(tmp_path / "runs"), callbacks=[EarlyStopping], **TINY_TRAIN)
    assert not (tmp_path / "runs").exists()


def test_a_misspelled_hook_is_refused_naming_the_nearest_hook():
    class Late(Callback):
        def on_epoch_ends(self, trainer, row):
            raise AssertionError("never called")

    with pytest.raises(CallbackError, match=r"callback Late has a method on_epoch_ends, which is not a hook and would "
                                            r"never be called; did you mean 'on_epoch_end', 'on_epoch_start', "
                                            r"'on_val_end'\? \(a helper of its own needs a name that does not start "
                                            r"with on_\)"):
        check_callbacks([Late()])
    check_callbacks([Callback(), EarlyStopping(3)])  # the library's own pass


@pytest.mark.slow
def test_without_tensorboard_the_run_goes_on_and_says_how_to_install_it(shapes, tmp_path, monkeypatch, ssd_messages):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # what `import` sees when it is not installed
    result = train(data=str(shapes), epochs=1, project=str(tmp_path), **TINY_TRAIN)
    out = "\n".join(ssd_messages())
    assert out.count("TensorBoard logging needs torch.utils.tensorboard, from the optional 'tensorboard' "
                     "dependencies: pip install 'ssd-detect[tensorboard]' (this run goes on without TensorBoard "
                     "scalars)") == 1
    assert not list(result.run_dir.glob("events.out.tfevents*"))
    assert (result.run_dir / "results.csv").is_file() and (result.run_dir / "results.png").is_file()


def test_difficult_objects_count_as_padding_in_the_loss():
    torch.manual_seed(0)
    priors = torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5], [0.5, 0.5, 0.9, 0.9]])
    net = lambda images: (torch.randn(2, 3, 4), torch.randn(2, 3, 3))  # noqa: E731
    boxes = torch.tensor([[[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 1.0]], [[0.1, 0.1, 0.9, 0.9], [0.0, 0.0, 0.0, 0.0]]])
    batch = {"images": torch.zeros(2, 3, 8, 8), "boxes": boxes, "labels": torch.tensor([[0, 1], [1, -1]]),
             "difficult": torch.tensor([[False, True], [False, False]])}
    loss_fn, cpu = MultiBoxLoss(), torch.device("cpu")
    torch.manual_seed(1)
    flagged = batch_loss(net, loss_fn, priors, batch, cpu)
    torch.manual_seed(1)
    padded = batch_loss(net, loss_fn, priors, {**batch, "labels": torch.tensor([[0, -1], [1, -1]]),
                                               "difficult": torch.zeros(2, 2, dtype=torch.bool)}, cpu)
    assert torch.equal(torch.stack(flagged), torch.stack(padded))


# --------------------------------------------------------------------------------------------------------- EMA
def test_ema_update_by_hand():
    model = nn.Sequential(nn.Linear(1, 1, bias=False), nn.BatchNorm1d(1))
    ema = build_ema(model, decay=0.9)
    expected_weight = expected_mean = None
    for k, value in enumerate([1.0, 3.0, 5.0], start=1):
        with torch.no_grad():
            model[0].weight.fill_(value)
            model[1].running_mean.fill_(2 * value)
        ema.update_parameters(model)
        d = 0.0 if k == 1 else 0.9 * (1 - math.exp(-k / 2000))  # the first update copies
        expected_weight = value if k == 1 else d * expected_weight + (1 - d) * value
        expected_mean = 2 * value if k == 1 else d * expected_mean + (1 - d) * 2 * value
    assert ema.module[0].weight.item() == pytest.approx(expected_weight, rel=1e-6)
    assert ema.module[1].running_mean.item() == pytest.approx(expected_mean, rel=1e-6)
    assert int(ema.n_averaged) == 3 and not any(p.requires_grad for p in ema.parameters())
    assert ema_decay(0.9999, 2000) == pytest.approx(0.9999 * (1 - math.exp(-1)))


@pytest.mark.parametrize("decay", [0.0, 1.0, 1.5])
def test_ema_decay_outside_0_1_names_the_option(decay):
    with pytest.raises(ConfigError, match=rf"ema_decay={decay} is invalid: must be in \(0, 1\), e.g. 0.9999 "
                                          r"\(--ema-decay\)"):
        TrainConfig(ema=True, ema_decay=decay)
    with pytest.raises(ConfigError, match=r"patience=-1 is invalid: must be >= 0 \(--patience\)"):
        TrainConfig(patience=-1)


@pytest.mark.slow
def test_ema_is_evaluated_saved_and_resumed_exactly(shapes, tmp_path):
    ema = dict(epochs=2, ema=True, ema_decay=0.5, **TINY_TRAIN)
    full = train(data=str(shapes), project=str(tmp_path / "full"), **ema)
    last = ssd.load_checkpoint(full.run_dir / "weights" / "last.pt")
    assert last["ema"]["updates"] == 4  # 2 epochs of 2 steps
    averaged, raw = last["model"], last["ema"]["raw_model"]
    assert averaged.keys() == raw.keys() and not all(torch.equal(averaged[k], raw[k]) for k in raw)
    assert all(torch.equal(full.model.state_dict()[k], averaged[k]) for k in averaged)
    assert "ema" not in ssd.load_checkpoint(full.run_dir / "weights" / "best.pt")  # resume state: last.pt only
    assert evaluate(full.run_dir / "weights" / "last.pt", shapes, device="cpu")["map"] == pytest.approx(
        full.metrics["map"], abs=1e-9)  # the EMA was validated

    class DieAfterFirstEpoch(Callback):  # the process dies right after epoch 1's last.pt
        def on_epoch_end(self, trainer, row):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(data=str(shapes), project=str(tmp_path / "killed"), callbacks=[DieAfterFirstEpoch()], **ema)
    assert ssd.load_checkpoint(tmp_path / "killed" / "exp" / "weights" / "last.pt")["epoch"] == 0
    resumed = train(resume=str(tmp_path / "killed" / "exp"), quiet=True)
    again = ssd.load_checkpoint(resumed.run_dir / "weights" / "last.pt")
    assert again["ema"]["updates"] == 4
    for name in ("model", "raw"):
        a, b = (averaged, again["model"]) if name == "model" else (raw, again["ema"]["raw_model"])
        assert all(torch.equal(a[k], b[k]) for k in a), name
    assert resumed.metrics["map"] == full.metrics["map"]


# ---------------------------------------------------------------------------------------------- early stopping
@pytest.mark.slow
def test_early_stopping_ends_the_run_says_why_and_resume_keeps_it_stopped(shapes, tmp_path, monkeypatch,
                                                                            ssd_messages):
    maps, real = [0.5, 0.4, 0.3, 0.9], trainer.evaluate_split
    monkeypatch.setattr(trainer, "evaluate_split", lambda *a, **k: {**real(*a, **k), "map": maps.pop(0)})
    result = train(data=str(shapes), epochs=6, patience=2, project=str(tmp_path), **TINY_TRAIN)
    reason = ("early stopping after epoch 3: no voc07 mAP improvement in the 2 epochs since epoch 1 (best 0.5000, "
              "saved in weights/best.pt); --patience 2")
    assert result.stop_reason == reason and reason in ssd_messages()
    assert (result.run_dir / "stop.txt").read_text() == reason + "\n"
    assert [row["val/mAP"] for row in result.history] == [0.5, 0.4, 0.3]
    weights = result.run_dir / "weights"
    assert ssd.load_checkpoint(weights / "best.pt")["epoch"] == 0
    assert ssd.load_checkpoint(weights / "last.pt")["stop_reason"] == reason

    resumed = train(resume=str(result.run_dir), quiet=True)
    assert f"{result.run_dir} already stopped: {reason}" in ssd_messages()
    assert len(resumed.history) == 3 and maps == [0.9]  # nothing trained or validated again


def test_patience_without_a_validation_split_says_how_to_get_one(shapes, tmp_path):
    """Early stopping watches a held-out split: data without one is refused, naming the two ways to give one."""
    data = Path(shutil.copytree(shapes, tmp_path / "train_only"))
    (data / "ImageSets" / "Main" / "val.txt").unlink()
    with pytest.raises(DataError, match=r"train_only has no validation split, and training never scores on its own "
                                        r"training images: name one .* or hold out part of train with --val-fraction"):
        train(data=str(data), epochs=2, patience=3, project=str(tmp_path / "runs"), **TINY_TRAIN)
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_training_ends_with_the_report_of_its_last_validation(shapes, tmp_path):
    """The run directory holds what `ssd val` writes for the final weights: the same numbers as the last validation."""
    result = train(data=str(shapes), epochs=1, project=str(tmp_path), **TINY_TRAIN)
    report_dir = result.run_dir / "val_report"
    saved = json.loads((report_dir / "metrics.json").read_text())
    assert saved["voc07"]["map"] == pytest.approx(result.metrics["map"], abs=1e-6)  # the run's metric is voc07
    assert {p.name for p in report_dir.iterdir()} >= {"metrics.json", "detections.json", "report.html",
                                                       "confusion.png", "pr_curves.png"}

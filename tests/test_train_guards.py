"""No quiet bad runs: resume without training state, non-finite steps and weights, device names,
contradicting options, resume with a moved dataset or more epochs, data errors mid-run, dataset category ids."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

import ssd
from builders import TINY_TRAIN, make_dataset
from ssd.cli import main
from ssd.device import resolve_device
from ssd.errors import CheckpointError, ConfigError, DataError, NonFiniteLossError
from ssd.training import plan, trainer
from ssd.training.config import TrainConfig
from ssd.training.optim import LRSchedule
from ssd.training.trainer import train

# 12 train / 4 val images of 96 px (make_dataset's yolo default), ssd_tiny at 64 px: 3 steps of 4 images per epoch
TINY = {**TINY_TRAIN, "batch_size": 4}
NAMES = ["a", "b", "c", "d", "e", "f"]


@pytest.fixture(scope="module")
def yolo(tmp_path_factory) -> Path:
    return make_dataset("yolo", tmp_path_factory.mktemp("yolo") / "data")


@pytest.fixture(scope="module")
def one_epoch(yolo, tmp_path_factory):
    """A finished 1-epoch run (not modified by the tests: copy it first)."""
    return train(data=str(yolo), epochs=1, project=str(tmp_path_factory.mktemp("runs")), **TINY)


def _copy_run(run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(run_dir, tmp_path / "run"))


# -------------------------------------------------------------------------- resuming from a weights-only checkpoint
def test_resume_of_weights_only_checkpoint_says_what_is_missing(tmp_path, capsys):
    path = ssd.save_checkpoint(tmp_path / "plain.pt", ssd.build_model("ssd_tiny", class_names=NAMES, image_size=64))
    with pytest.raises(CheckpointError, match=r"no training state \(missing train_config, epoch, optimizer") as info:
        train(resume=str(path))
    assert f"--weights {path}" in str(info.value)
    assert main(["train", "--resume", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot resume from") and "Traceback" not in err


# ------------------------------------------------------------------------------------------------- non-finite steps
def _nan_loss_on(monkeypatch, steps: set[int]) -> None:
    real, calls = trainer.MultiBoxLoss.forward, {"n": 0}

    def forward(self, *args):
        calls["n"] += 1
        loc_loss, cls_loss = real(self, *args)
        return (loc_loss * float("nan"), cls_loss) if calls["n"] in steps else (loc_loss, cls_loss)

    monkeypatch.setattr(trainer.MultiBoxLoss, "forward", forward)


@pytest.mark.filterwarnings("error:Detected call of `lr_scheduler")  # skipped steps keep the schedule
def test_skip_nonfinite_every_step_fails_and_saves_nothing(yolo, tmp_path, monkeypatch):
    _nan_loss_on(monkeypatch, {1, 2, 3})
    with pytest.raises(NonFiniteLossError, match=r"3 of 3 steps \(100.0%\) had a non-finite loss and were skipped, "
                                                 r"every step of epoch 1 \(3\).*nothing was saved"):
        train(data=str(yolo), epochs=2, project=str(tmp_path), skip_nonfinite=True, **TINY)
    assert not list(tmp_path.glob("*/weights/*.pt"))


@pytest.mark.filterwarnings("error:Detected call of `lr_scheduler")  # skipped steps keep the schedule
def test_skip_nonfinite_more_than_a_small_share_fails(yolo, tmp_path, monkeypatch):
    _nan_loss_on(monkeypatch, {1, 3})  # 2 of 3 steps: more than one step and more than 5 %
    with pytest.raises(NonFiniteLossError, match=r"2 of 3 steps \(66.7%\).*more than the 5% skip_nonfinite"):
        train(data=str(yolo), epochs=1, project=str(tmp_path), skip_nonfinite=True, **TINY)
    assert not list(tmp_path.glob("*/weights/*.pt"))


def test_diverged_weights_are_never_saved(yolo, tmp_path, monkeypatch):
    real = trainer.Trainer.train_step

    def step_then_overflow(self, batch, epoch=0, step=0):  # the last step overflows the weights: no loss sees it
        values = real(self, batch, epoch, step)
        if (epoch, step) == (1, self.steps - 1):
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("inf"))
        return values

    monkeypatch.setattr(trainer.Trainer, "train_step", step_then_overflow)
    with pytest.raises(NonFiniteLossError, match=r"after epoch 2 the weights hold NaN/inf \(\S+.*"
                                                 r"weights/last.pt holds epoch 1"):
        train(data=str(yolo), epochs=2, project=str(tmp_path), **TINY)
    last = ssd.load_checkpoint(tmp_path / "exp" / "weights" / "last.pt")
    assert last["epoch"] == 0 and all(torch.isfinite(t).all() for t in last["model"].values())


# ----------------------------------------------------------------------------------------------------- device names
@pytest.mark.parametrize("name", ["gpu", "tpu", "cuda:x", "CPU"])
def test_unknown_device_lists_the_valid_ones(name):
    with pytest.raises(ConfigError, match=rf"device '{name}' is not a valid device: use cpu, cuda, cuda:N .*mps "
                                          r"or auto"):
        resolve_device(name)


def test_device_gpu_from_the_command_line(yolo, capsys):
    assert main(["train", "--data", str(yolo), "--device", "gpu"]) == 1
    assert "use cpu, cuda, cuda:N" in capsys.readouterr().err
    assert main(["val", "--weights", "x.pt", "--data", str(yolo), "--device", "tpu"]) == 1
    assert "device 'tpu' is not a valid device" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(ConfigError, match=r"device 'cuda:1' was requested but CUDA is not available"):
        resolve_device("cuda:1")


# ------------------------------------------------------------------------------------------------------- --momentum
def test_momentum_out_of_range_names_the_option(capsys):
    with pytest.raises(ConfigError, match=r"momentum=5 is invalid: must be in \[0, 1\) .*\(--momentum\)"):
        TrainConfig(momentum=5)
    assert main(["train", "--data", "x", "--momentum", "5"]) == 2  # a command-line mistake
    assert "(--momentum)" in capsys.readouterr().err


# -------------------------------------------------------------------------------- --weights contradicted by --model
@pytest.mark.slow
def test_weights_contradicted_by_model_and_image_size_is_refused(one_epoch, yolo, tmp_path, capsys):
    weights = one_epoch.run_dir / "weights" / "last.pt"
    with pytest.raises(ConfigError, match=r"holds a ssd_tiny model for 64 px inputs, which --model ssd300_vgg16 "
                                          r"and --image-size 96 contradict"):
        train(data=str(yolo), weights=str(weights), model="ssd300_vgg16", image_size=96, project=str(tmp_path))
    args = ["train", "--data", str(yolo), "--weights", str(weights), "--model", "ssd300_vgg16", "--project",
            str(tmp_path)]
    assert main(args) == 1
    assert "--model ssd300_vgg16 contradict" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # refused before anything was written


@pytest.mark.slow
def test_weights_decide_model_and_config_yaml_records_it(one_epoch, yolo, tmp_path, ssd_messages):
    weights = one_epoch.run_dir / "weights" / "last.pt"
    options = {k: v for k, v in TINY.items() if k not in ("model", "image_size")}
    result = train(data=str(yolo), weights=str(weights), epochs=1, project=str(tmp_path), **options)
    assert any("holds a ssd_tiny model for 64 px inputs: training that" in m for m in ssd_messages())
    recorded = TrainConfig.from_yaml(result.run_dir / "config.yaml")
    assert (recorded.model, recorded.image_size) == ("ssd_tiny", 64)
    assert (recorded.optimizer, recorded.lr) == ("adamw", 3e-3)  # ssd_tiny's defaults, not the default model's
    assert result.model.config.name == "ssd_tiny" and result.model.image_size == 64


@pytest.mark.slow
def test_weights_given_as_a_run_directory_start_from_its_best_checkpoint(one_epoch, yolo, tmp_path, monkeypatch,
                                                                         ssd_messages):
    reads, started = [], []
    read, build = plan.read_weights, trainer.build_run_model
    monkeypatch.setattr(plan, "read_weights", lambda path: reads.append(path) or read(path))

    def build_and_keep(*args, **kwargs):
        model = build(*args, **kwargs)
        started.append({name: value.clone() for name, value in model.state_dict().items()})
        return model

    monkeypatch.setattr(trainer, "build_run_model", build_and_keep)
    options = {k: v for k, v in TINY.items() if k not in ("model", "image_size")}
    train(data=str(yolo), weights=str(one_epoch.run_dir), epochs=1, project=str(tmp_path), **options)
    best = one_epoch.run_dir / "weights" / "best.pt"
    assert reads == [best]  # resolved once, read once
    assert f"weights: started from {one_epoch.run_dir}" in ssd_messages()
    saved = ssd.load_checkpoint(best)["model"]
    assert all(torch.equal(started[0][k], v) for k, v in saved.items() if k.startswith("backbone."))


# ---------------------------------------------------------------------------------------------- what resume accepts
def test_resume_refuses_options_it_would_ignore(one_epoch, tmp_path):
    run = _copy_run(one_epoch.run_dir, tmp_path)
    with pytest.raises(ConfigError, match=r"but --lr 0.1 \(the run has 0.003\): only --data, --epochs, --time, "
                                          r"--device, --workers, --quiet and --mlflow may change on resume"):
        train(resume=str(run), lr=0.1)


def test_resume_refuses_a_dataset_with_other_classes(one_epoch, tmp_path):
    run = _copy_run(one_epoch.run_dir, tmp_path)
    other = tmp_path / "other"
    data = make_dataset("yolo", other)
    text = data.read_text().replace("names: [a, b, c, d, e, f]", "names: [u, v, w, x, y, z]")
    data.write_text(text)
    with pytest.raises(DataError, match=r"has the classes \['u', .*\] but the run was trained on \['a', "):
        train(resume=str(run), data=str(data))


@pytest.mark.slow
def test_resume_with_moved_data_extends_a_finished_run(one_epoch, yolo, tmp_path, ssd_messages):
    run = _copy_run(one_epoch.run_dir, tmp_path)
    moved = tmp_path / "moved"
    shutil.copytree(yolo.parent, moved)
    (moved / "data.yaml").write_text((moved / "data.yaml").read_text().replace(str(yolo.parent), str(moved)))

    result = train(resume=str(run), data=str(moved / "data.yaml"), epochs=2, quiet=True)
    assert any("the lr schedule keeps its 1-epoch length, epochs 2-2 use its final lr" in m for m in ssd_messages())
    assert result.run_dir == run and [row["epoch"] for row in result.history] == [1, 2]
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    assert (recorded["epochs"], recorded["schedule_epochs"], recorded["data"]) == (2, 1, str(moved / "data.yaml"))
    final_lr = 3e-3 * recorded["final_lr_ratio"]
    assert result.history[-1]["lr"] == pytest.approx(final_lr)
    assert ssd.load_checkpoint(run / "weights" / "last.pt")["epoch"] == 1


def test_schedule_epochs_holds_the_final_lr():
    config = TrainConfig(epochs=4, schedule_epochs=2, warmup_epochs=0, final_lr_ratio=0.1)
    schedule = LRSchedule.from_config(config, iters_per_epoch=5)
    assert schedule.total == 10
    assert [schedule(i) for i in (10, 15, 19)] == [pytest.approx(0.1)] * 3
    assert TrainConfig(epochs=9, schedule_epochs=3, scheduler="multistep").resolved().milestones == [2, 3]


# ---------------------------------------------------------------------------------------------- data errors mid-run
def test_data_error_in_a_worker_is_reported_with_its_own_message(yolo, tmp_path, monkeypatch):
    import torch.utils.tensorboard as tensorboard

    from ssd.data import loader

    closed = []

    class Writer(tensorboard.SummaryWriter):
        def close(self):
            closed.append(True)
            super().close()

    real = loader.read_image

    def read_image(path, *args, **kwargs):  # an image that turns out unreadable while training (worker process)
        if Path(path).name == "img7.jpg":
            raise DataError(f"cannot decode image {path}: truncated")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(tensorboard, "SummaryWriter", Writer)
    monkeypatch.setattr(loader, "read_image", read_image)
    with pytest.raises(DataError) as info:
        train(data=str(yolo), epochs=1, project=str(tmp_path), **{**TINY, "workers": 1})
    assert str(info.value) == f"cannot decode image {yolo.parent / 'images' / 'train' / 'img7.jpg'}: truncated"
    assert closed == [True]


# --------------------------------------------------------------------------------------- the dataset's category ids
def _write_coco(root: Path) -> Path:
    """COCO folder, categories 1, 5 and 90, 8 train / 4 val images of 64 px with two boxes each (not
    builders.make_dataset: category ids that are not 1..K and image ids from 100 are what must come back)."""
    (root / "images").mkdir(parents=True)
    (root / "annotations").mkdir()
    categories = [{"id": i, "name": n} for i, n in ((1, "cat"), (5, "dog"), (90, "fox"))]
    for split, count in (("train", 8), ("val", 4)):
        images, annotations = [], []
        for i in range(count):
            name = f"{split}{i}.jpg"
            Image.new("RGB", (64, 64), (30 * i, 90, 150)).save(root / "images" / name)
            images.append({"id": 100 + i, "file_name": name, "width": 64, "height": 64})
            for j, category in enumerate(((1, 5), (5, 90), (90, 1))[i % 3]):  # every class in both splits
                annotations.append({"id": len(annotations) + 1, "image_id": 100 + i, "category_id": category,
                                    "bbox": [4 + 28 * j, 8, 24, 30], "area": 720, "iscrowd": 0})
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations, "categories": categories}))
    return root


@pytest.mark.slow
def test_val_json_and_checkpoint_use_the_datasets_category_ids(tmp_path, capsys):
    data = _write_coco(tmp_path / "coco")
    result = train(data=str(data), epochs=1, project=str(tmp_path / "runs"), **{**TINY, "batch_size": 2})
    best = result.run_dir / "weights" / "last.pt"
    assert ssd.load_checkpoint(best)["category_ids"] == [1, 5, 90]
    out = tmp_path / "dets.json"
    assert main(["val", "--weights", str(best), "--data", str(data), "--device", "cpu", "--conf", "0",
                 "--save-json", str(out)]) == 0
    entries = json.loads(out.read_text())
    assert entries and {e["category_id"] for e in entries} == {1, 5, 90}
    assert {e["image_id"] for e in entries} == {100, 101, 102, 103}


# ------------------------------------------------------------------------------------------ names of derived files
@pytest.mark.slow
def test_train_on_249_character_image_names_and_a_mathtext_class_name_finishes_with_its_figures(tmp_path):
    data = make_dataset("yolo", tmp_path / "data")
    data.write_text(data.read_text().replace("names: [a, b,", r"names: ['$\frac{a}{$', b,"))  # not math to draw
    for i in range(4):  # legal 249-character stems: "NNN_<stem>.jpg" would pass NAME_MAX as they are
        for folder, suffix in (("images", ".jpg"), ("labels", ".txt")):
            (data.parent / folder / "val" / f"img{i}{suffix}").rename(
                data.parent / folder / "val" / f"{'x' * 245}img{i}{suffix}")
    result = train(data=str(data), epochs=1, project=str(tmp_path / "runs"), **{**TINY, "num_plot_images": 4})
    assert result.model.class_names[0] == "$\\frac{a}{$"
    assert (result.run_dir / "labels.png").is_file() and (result.run_dir / "pr_curves.png").is_file()
    drawn = sorted(p.name for p in (result.run_dir / "val_predictions").iterdir())
    assert drawn == [f"{'x' * 245}img{i}.jpg" for i in range(4)]  # 253 bytes: they fit as they are
    worst = [p.name for p in (result.run_dir / "val_report" / "worst").iterdir()]
    assert worst and all(re.fullmatch(r"\d{3}_x+~[0-9a-f]{12}\.jpg", n) and len(n) == 255 for n in worst)

"""Training settings are checked by type and range where they enter (command line and --config alike): one line
naming the option, exit code 2, before any run directory exists."""

import pytest

from ssd.cli import main
from ssd.errors import ConfigError
from ssd.training.config import TrainConfig


@pytest.mark.parametrize("options, message", [
    ({"epochs": "ten"}, "epochs='ten' is invalid: must be a whole number (--epochs)"),
    ({"batch_size": [4]}, "batch_size=[4] is invalid: must be a whole number (--batch-size)"),
    ({"epochs": True}, "epochs=True is invalid: must be a whole number (--epochs)"),
    ({"warmup_epochs": float("inf")}, "warmup_epochs=inf is invalid: must be a finite number (--warmup-epochs)"),
    ({"lr": float("nan")}, "lr=nan is invalid: must be a finite number (--lr)"),
    ({"seed": 10**30}, "seed=1000000000000000000000000000000 is invalid: must be in [0, 2**63) (--seed)"),
    ({"warmup_iters": -5}, "warmup_iters=-5 is invalid: must be >= 0 (--warmup-iters)"),
    ({"score_threshold": 5}, "score_threshold=5 is invalid: must be a number in [0, 1] (--conf)"),
    ({"iou_threshold": -0.1}, "iou_threshold=-0.1 is invalid: must be a number in [0, 1] (--iou)"),
    ({"amp": "yes"}, "amp='yes' is invalid: must be true or false (--amp)"),
    ({"milestones": [10, "x"]}, "milestones=[10, 'x'] is invalid: must be a list of whole numbers (--milestones)"),
    ({"val_fraction": 1.5}, "val_fraction=1.5 is invalid: must be in (0, 1), e.g. 0.1 (--val-fraction)"),
    ({"name": "../../x"}, "name='../../x' is invalid: must be one folder name inside --project (no '/', no '..', "),
    ({"name": "/tmp/x"}, "name='/tmp/x' is invalid: must be one folder name inside --project"),
    ({"name": ".."}, "name='..' is invalid: must be one folder name inside --project"),
    ({"image_size": 100000}, "image_size=100000 is invalid: must be at least 32 and at most 4096 on each side"),
    ({"image_size": "32x100000"}, "image_size='32x100000' is invalid: must be at least 32 and at most 4096"),
    ({"lr": 1e308}, "lr=1e+308 is invalid: must be in (0, 10] (--lr)"),
    ({"weight_decay": 5.0}, "weight_decay=5.0 is invalid: must be in [0, 1] (--weight-decay)"),
    ({"gamma": 1e300}, "gamma=1e+300 is invalid: must be in [0, 1] (the lr is multiplied by it at each milestone)"),
    ({"warmup_epochs": 1e308}, "warmup_epochs=1e+308 is invalid: must be at most 100000 epochs "
                               "(ssd.limits.MAX_EPOCHS) (--warmup-epochs)"),
    ({"epochs": 10**9}, "epochs=1000000000 is invalid: must be at most 100000 epochs"),
    ({"workers": 100_000}, "workers=100000 is invalid: must be at most 64 processes (ssd.limits.MAX_WORKERS) "
                           "(--workers)"),
])
def test_config_file_value_of_wrong_type_or_range_names_the_option(tmp_path, options, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig.from_dict(options)
    assert str(info.value).startswith(message)


def test_valid_values_pass_unchanged():
    config = TrainConfig.from_dict({"epochs": 3, "lr": 1, "milestones": (2, 3), "seed": 2**63 - 1,
                                    "warmup_iters": 0, "image_size": "512x288", "data": "d.yaml"})
    assert (config.epochs, config.lr, config.milestones, config.seed, config.image_size) == (3, 1, [2, 3],
                                                                                              2**63 - 1, "512x288")


@pytest.mark.parametrize("argv, option", [
    (["--warmup-epochs", "inf"], "--warmup-epochs"),
    (["--seed", str(10**30)], "--seed"),
    (["--warmup-iters", "-5"], "--warmup-iters"),
    (["--conf", "5"], "--conf"),
    (["--image-size", "32x100000"], "--image-size"),
    (["--name", "../../x"], "--name"),
])
def test_train_option_out_of_range_exits_2_before_a_run_directory(tmp_path, capsys, argv, option):
    project = tmp_path / "runs"
    assert main(["train", "--data", str(tmp_path / "d.yaml"), "--project", str(project), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ssd train: ") and option in err[0]
    assert not project.exists()


@pytest.mark.parametrize("text, option", [("epochs: ten\n", "--epochs"), ("batch_size: [4]\n", "--batch-size")])
def test_config_file_of_wrong_types_exits_2(tmp_path, capsys, text, option):
    (tmp_path / "config.yaml").write_text(text)
    project = tmp_path / "runs"
    assert main(["train", "--config", str(tmp_path / "config.yaml"), "--project", str(project)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and option in err[0] and "Traceback" not in err[0]
    assert not project.exists()


@pytest.mark.parametrize("size", ["100000", "32x100000"])
def test_check_image_size_beyond_the_bound_is_a_usage_error_before_building(tmp_path, capsys, size):
    assert main(["check", str(tmp_path), "--model", "ssd_tiny", "--image-size", size]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: ssd check: argument --image-size: image_size={size!r} is "
                   "invalid: must be at least 32 and at most 4096 on each side (--image-size; the bound is "
                   "ssd.limits.MAX_INPUT_SIDE)"]


@pytest.mark.parametrize("command", [["val", "--weights", "w.pt", "--data", "d"], ["predict", "--weights", "w.pt",
                                                                                  "--source", "s"]])
@pytest.mark.parametrize("workers", ["100000", "-1", "two"])
def test_val_and_predict_workers_beyond_the_bound_exit_2_before_anything_starts(capsys, command, workers):
    assert main([*command, "--workers", workers]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: ssd {command[0]}: argument --workers: must be a whole number from 0 to 64 "
                   f"(ssd.limits.MAX_WORKERS), got {workers!r}")

"""Training settings are checked by type and range where they enter (command line and --config alike): one line
naming the option, exit code 2, before any run directory exists."""

import dataclasses
from pathlib import Path

import pytest

from ssd.cli import main
from ssd.cli.parsers import build_parser, parse
from ssd.errors import ConfigError
from ssd.schemas import BenchmarkConfig, ExportConfig, PredictConfig, ServeConfig, ValConfig, option_flag
from ssd.training.config import TrainConfig


@pytest.mark.parametrize("options, message", [
    ({"epochs": "ten"}, "epochs='ten' is invalid: must be a whole number (--epochs)"),
    ({"batch_size": [4]}, "batch_size=[4] is invalid: must be a whole number (--batch-size)"),
    ({"epochs": True}, "epochs=True is invalid: must be a whole number (--epochs)"),
    ({"warmup_epochs": float("inf")}, "warmup_epochs=inf is invalid: must be a finite number (--warmup-epochs)"),
    ({"lr": float("nan")}, "lr=nan is invalid: must be a finite number (--lr)"),
    ({"seed": 10**30}, "seed=1000000000000000000000000000000 is invalid: must be in [0, 2**63) (--seed)"),
    ({"warmup_iters": -5}, "warmup_iters=-5 is invalid: must be >= 0 (--warmup-iters)"),
    ({"score_threshold": 5}, "score_threshold (--conf) must be a number in [0, 1], got 5"),
    ({"iou_threshold": -0.1}, "iou_threshold (--iou) must be a number in [0, 1], got -0.1"),
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
    expected = {"two": "argument --workers: invalid int value: 'two'"}.get(
        workers, f"--workers must be a whole number from 0 to 64 (ssd.limits.MAX_WORKERS), got {workers}")
    assert err == f"error: ssd {command[0]}: {expected}"


# Every option `ssd val|predict|serve|export|benchmark` had before their schemas, with its default then (git show
# f1643fa:src/ssd/cli/parsers.py): each still parses, and the schema (ssd.schemas) holds the same default.
_BEFORE = {
    "val": (["--weights", "w.pt", "--data", "d"], dict(
        split="val", metric="voc07", batch_size=16, workers=0, recheck=False, device="auto", score_threshold=0.01,
        iou_threshold=0.45, max_detections=200, save_json=None, project=Path("runs/val"), name="exp", save=True,
        tile=None, tile_overlap=0.2)),
    "predict": (["--weights", "w.pt", "--source", "s"], dict(
        score_threshold=None, iou_threshold=0.45, max_detections=100, batch_size=8, device="auto", half=False,
        exist_ok=False, fmt="json", save_images=True, save_txt=False, save_conf=False, save_crop=False, classes=None,
        workers=2, track=False, tracker=None, show=False, tile=None, tile_overlap=0.2)),
    "serve": (["--weights", "w.pt"], dict(
        weights=Path("w.pt"), host="127.0.0.1", port=8000, device="cpu", half=False, score_threshold=None,
        iou_threshold=0.45, max_detections=100, max_batch=8, max_wait_ms=5.0, samples=None, threads=1)),
    "export": (["--weights", "w.pt"], dict(
        fmt="onnx", output=None, opset=18, dynamic_batch=False, nms=False, score_threshold=0.25, iou_threshold=0.45,
        max_detections=100, int8=False, data=None, calib_images=None, check=True, exist_ok=False)),
    "benchmark": (["--weights", "w.pt", "--data", "d"], dict(
        formats=None, artifacts=(), batch_sizes=(1, 8), floor=None, device="cpu", calib_images=None, runs=30,
        skip_invalid=False, project=Path("runs/benchmark"), name="exp")),
}
_OLD_FLAGS = {
    "val": ["--weights", "--detections", "--data", "--split", "--metric", "--batch-size", "--workers", "--recheck",
            "--device", "--conf", "--iou", "--max-det", "--save-json", "--project", "--name", "--no-save", "--tile",
            "--tile-overlap", "--quiet"],
    "predict": ["--weights", "--source", "--conf", "--iou", "--max-det", "--batch-size", "--device", "--half",
                "--save-dir", "--exist-ok", "--format", "--no-save-images", "--save-txt", "--save-conf", "--save-crop",
                "--classes", "--workers", "--track", "--tracker", "--show", "--tile", "--tile-overlap", "--quiet"],
    "serve": ["--weights", "--host", "--port", "--device", "--half", "--conf", "--iou", "--max-det", "--max-batch",
              "--max-wait-ms", "--samples", "--threads", "--quiet"],
    "export": ["--weights", "--format", "--output", "--opset", "--dynamic-batch", "--nms", "--conf", "--iou",
               "--max-det", "--int8", "--data", "--calib-images", "--no-check", "--exist-ok", "--quiet"],
    "benchmark": ["--weights", "--data", "--formats", "--artifacts", "--batch-sizes", "--floor", "--device",
                  "--calib-images", "--runs", "--skip-invalid", "--project", "--name", "--quiet"],
}
_SCHEMAS = {"val": ValConfig, "predict": PredictConfig, "serve": ServeConfig, "export": ExportConfig,
            "benchmark": BenchmarkConfig}


def _schema(argv: list[str]):
    """The schema ``ssd ARGV`` builds, parsed only (nothing runs)."""
    args = parse(build_parser(), argv)
    return _SCHEMAS[args.command].from_options(vars(args))


@pytest.mark.parametrize("command", sorted(_BEFORE))
def test_command_options_are_their_schema_fields_with_the_defaults_they_had(command):
    required, defaults = _BEFORE[command]
    config = _schema([command, *required])
    assert {k: v for k, v in config.values().items() if k in defaults} == defaults
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    flags = {option_flag(f): f.name for f in dataclasses.fields(_SCHEMAS[command])}
    assert {a.dest: s for a in sub._actions for s in a.option_strings if s in flags} == {
        name: flag for flag, name in flags.items()}  # one option per field, spelled by option_flag
    assert set(_OLD_FLAGS[command]) <= set(sub._option_string_actions)


def test_lists_take_space_or_comma_separated_values_and_booleans_their_old_negations():
    assert _schema(["benchmark", "--weights", "w", "--data", "d", "--batch-sizes", "1,4", "16"]).batch_sizes == [1, 4,
                                                                                                              16]
    assert _schema(["export", "--weights", "w", "--no-check"]).check is False
    predict = _schema(["predict", "--weights", "w", "--source", "s", "--no-save-images", "--classes", "a", "1"])
    assert (predict.save_images, predict.classes) == (False, ["a", "1"])
    assert _schema(["val", "--weights", "w", "--data", "d", "--no-save"]).save is False


@pytest.mark.parametrize("argv", [["val", "--weights", "w", "--data", "d"], ["predict", "--weights", "w", "--source",
                                  "s"], ["export", "--weights", "w", "--nms"], ["serve", "--weights", "w"]])
def test_conf_1_is_accepted_and_above_1_refused_alike_on_every_command(argv):
    _schema([*argv, "--conf", "1"])
    with pytest.raises(ConfigError, match=r"--conf must be a number in \[0, 1\], got 1.01"):
        _schema([*argv, "--conf", "1.01"])
    assert TrainConfig(score_threshold=1).score_threshold == 1
    with pytest.raises(ConfigError, match=r"^score_threshold \(--conf\) must be a number in \[0, 1\], got 1.01$"):
        TrainConfig(score_threshold=1.01)


@pytest.mark.parametrize("argv, message", [
    (["val", "--weights", "w", "--data", "d", "--tile", "8"], "--tile must be 'auto', a side N or 'HxW'"),
    (["val", "--weights", "w", "--data", "d", "--tile-overlap", "1"], "--tile-overlap must be a number in [0, 1)"),
    (["predict", "--weights", "w", "--source", "s", "--name", "../x"], "--name must be one folder name inside"),
    (["predict", "--weights", "w", "--source", "s", "--save-dir", "o", "--name", "x"],
     "--save-dir is --project and --name in one path"),
    (["export", "--weights", "w", "--opset", "0"], "--opset must be a positive integer, got 0"),
    (["benchmark", "--weights", "w", "--data", "d", "--runs", "0"], "--runs must be a positive integer, got 0"),
    (["benchmark", "--weights", "w", "--data", "d", "--floor", "nan"], "--floor must be mAP50 points in [0, 100]"),
    (["benchmark", "--weights", "w", "--data", "d", "--batch-sizes", "0"], "--batch-sizes must be positive integers"),
    (["serve", "--weights", "w", "--port", "65536"], "--port must be in 0..65535 (0: a free port), got 65536"),
    (["serve", "--weights", "w", "--max-batch", "0"], "--max-batch must be a positive integer, got 0"),
    (["serve", "--weights", "w", "--max-wait-ms", "-1"], "--max-wait-ms must be in [0, 10000] milliseconds, got -1.0"),
    (["serve", "--weights", "w", "--max-wait-ms", "nan"], "--max-wait-ms must be in [0, 10000] milliseconds, got nan"),
    (["serve", "--weights", "w", "--threads", "-1"], "--threads must be a whole number, 0 or more (0: one per core), "
                                                     "got -1"),
])
def test_schema_errors_name_the_flag_and_exit_2(capsys, argv, message):
    with pytest.raises(ConfigError) as info:
        _schema(argv)
    assert str(info.value).startswith(message)
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"error: ssd {argv[0]}: {message}")


def test_serve_and_predict_source_take_their_schema_which_checks_before_any_work():
    import inspect

    from ssd.inference.sources import predict_source
    from ssd.serve.server import serve

    assert list(inspect.signature(serve).parameters) == ["config"]  # no copy of ServeConfig's fields
    assert list(inspect.signature(predict_source).parameters) == ["config", "detector", "progress"]
    with pytest.raises(ConfigError, match=r"^predict_source needs a model: give config.weights, or a detector$"):
        predict_source(PredictConfig(source="nowhere"))  # --weights is required on the command line only
    with pytest.raises(ConfigError, match=r"^--port must be in 0..65535 \(0: a free port\), got -1$"):
        ServeConfig(weights="w", port=-1)  # before the model is opened or a port taken
    assert ServeConfig(weights="w", threads=None).threads is None  # the Python spelling of --threads 0


def test_predict_save_dir_is_project_and_name_in_one_path():
    assert _schema(["predict", "--weights", "w", "--source", "s"]).run_dir == Path("runs/predict/exp")
    assert _schema(["predict", "--weights", "w", "--source", "s", "--project", "p", "--name", "n"]).run_dir == Path(
        "p/n")
    assert _schema(["predict", "--weights", "w", "--source", "s", "--save-dir", "p/n"]).run_dir == Path("p/n")


def test_schema_choices_are_the_ones_the_library_implements():
    import typing

    from ssd.artifacts import EXPORT_FORMATS
    from ssd.evaluation.evaluator import METRICS
    from ssd.inference.result_files import FORMATS

    assert typing.get_args(typing.get_type_hints(ValConfig)["metric"]) == tuple(METRICS)
    assert typing.get_args(typing.get_type_hints(PredictConfig)["fmt"]) == tuple(FORMATS)
    assert {f.name: f.metadata.get("choices") for f in dataclasses.fields(ExportConfig)}["fmt"] == EXPORT_FORMATS

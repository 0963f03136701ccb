"""The `ssd` command line: grammar, help, suggestions and exit codes; every subcommand parsed and run once."""

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from builders import biased_model, make_yolo_folder
from ssd import errors
from ssd.cli import main
from ssd.cli.commands import COMMANDS
from ssd.weights.checkpoint import load_checkpoint, save_checkpoint


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", biased_model("ssd_tiny"))


def test_version(capsys):
    import ssd

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == ssd.__version__


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: ssd {command}" in out


def test_train_help_lists_config_fields(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    out = capsys.readouterr().out
    for flag in ("--data", "--model", "--epochs", "--batch-size", "--lr", "--device", "--amp", "--resume"):
        assert flag in out


def test_unknown_option_suggests_closest(capsys):
    assert main(["train", "--data", "x", "--epoch", "3"]) == 2
    err = capsys.readouterr().err
    assert "unknown option '--epoch'" in err
    assert "--epochs" in err


def test_missing_required_option_is_a_usage_error(capsys):
    assert main(["val", "--data", "x"]) == 2
    assert "--weights" in capsys.readouterr().err


def test_no_command_prints_help(capsys):
    assert main([]) == 2
    assert "train" in capsys.readouterr().out


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "ssd", "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip()


@pytest.mark.slow
def test_import_and_help_do_not_load_torch():
    """`import ssd` and `ssd --help` stay light: the package names its API lazily (PEP 562), and `ssd.export`
    imports an exporter (and ONNX, OpenVINO) only when `export` is called."""
    code = ("import sys, ssd, ssd.export, contextlib, io\n"
            "from ssd.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()): main([])\n"
            "assert ssd.__version__ and 'train' in dir(ssd)\n"
            "print(sorted(m for m in ('torch', 'torchvision', 'matplotlib', 'onnx') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    loaded = subprocess.run([sys.executable, "-c", "import ssd, sys; ssd.MultiBoxLoss; print('torch' in sys.modules)"],
                            capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "True"  # a name is imported on first use


def test_check_exit_codes_and_json(synthetic_voc, tmp_path, capsys):
    assert main(["check", str(synthetic_voc), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["errors"] == []
    bad = tmp_path / "bad"
    (bad / "images").mkdir(parents=True)
    (bad / "labels").mkdir()
    Image.new("RGB", (64, 64)).save(bad / "images" / "a.jpg")
    (bad / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n2 0.5 0.5 0.2 0.2\n")
    (bad / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [cat, dog]\n")
    assert main(["check", str(bad / "data.yaml")]) == 1
    out = capsys.readouterr().out
    assert "labels/a.txt:2: label 2 is out of range" in out and "background class is added internally" in out


@pytest.mark.slow
def test_train_then_val_from_the_command_line(synthetic_voc, tmp_path, capsys):
    args = ["train", "--data", str(synthetic_voc), "--model", "ssd_tiny", "--epochs", "1", "--image-size", "128",
            "--batch-size", "8", "--workers", "0", "--device", "cpu", "--augment", "none", "--quiet",
            "--project", str(tmp_path), "--name", "cli"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"run directory: {tmp_path / 'cli'}" in out
    config = (tmp_path / "cli" / "config.yaml").read_text()
    assert "epochs: 1" in config and "image_size: 128" in config
    best = tmp_path / "cli" / "weights" / "best.pt"
    assert main(["val", "--weights", str(best), "--data", str(synthetic_voc), "--device", "cpu",
                 "--project", str(tmp_path / "val")]) == 0
    table = capsys.readouterr().out
    assert "circle" in table and "mAP" in table
    # the saved config reproduces the run: --config reads it, the command line wins
    assert main(["train", "--config", str(tmp_path / "cli" / "config.yaml"), "--name", "again", "--epochs", "1"]) == 0
    assert (tmp_path / "again" / "weights" / "last.pt").is_file()


def test_errors_are_one_line_not_tracebacks(tmp_path, capsys):
    assert main(["val", "--weights", str(tmp_path / "missing.pt"), "--data", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err


def test_predict_writes_detections_and_refuses_a_corrupt_png(weights, tmp_path, capsys):
    """A PNG whose pixel data is broken is named and skipped, not read as a black picture with 0 detections."""
    good, corrupt = tmp_path / "good.png", tmp_path / "corrupt.png"
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (48, 64, 3)).astype(np.uint8)).save(good)
    data = bytearray(good.read_bytes())
    start = data.index(b"IDAT") + 4
    data[start + 20:start + 40] = bytes(20)
    corrupt.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert main(["predict", "--weights", str(weights), "--source", str(good), "--save-dir", str(out),
                 "--device", "cpu", "--conf", "0.2"]) == 0
    (entry,) = json.loads((out / "predictions.json").read_text())["images"]
    assert entry["file"].endswith("good.png") and len(entry["detections"]) > 0
    capsys.readouterr()
    assert main(["predict", "--weights", str(weights), "--source", str(corrupt), "--save-dir", str(tmp_path / "o2"),
                 "--device", "cpu"]) == 1
    captured = capsys.readouterr()
    assert f"skipped {corrupt}: image does not decode (OSError: broken data stream" in captured.err  # the log
    assert captured.err.splitlines()[-1] == "error: none of the 1 inputs could be read"  # after the progress bar


def test_predict_project_name_and_save_dir_follow_one_run_directory_rule(weights, tmp_path):
    image = tmp_path / "in" / "a.png"
    image.parent.mkdir()
    Image.new("RGB", (32, 32)).save(image)
    runs = tmp_path / "runs"
    base = ["predict", "--weights", str(weights), "--source", str(image), "--device", "cpu", "--no-save-images"]
    assert main([*base, "--project", str(runs), "--name", "n"]) == 0
    assert main([*base, "--save-dir", str(runs / "n")]) == 0  # the same folder in one path: taken, so n2
    assert main([*base, "--project", str(runs), "--name", "n", "--exist-ok"]) == 0  # n again
    assert sorted(p.name for p in runs.iterdir()) == ["n", "n2"]


@pytest.mark.slow
def test_export_writes_an_onnx_file_and_names_the_missing_extra(weights, tmp_path, capsys, monkeypatch):
    onnx_file = tmp_path / "tiny.onnx"
    assert main(["export", "--weights", str(weights), "--output", str(onnx_file)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"exported: {onnx_file}") and onnx_file.stat().st_size > 0
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if the [export] extra were not installed
    assert main(["export", "--weights", str(weights), "--output", str(tmp_path / "again.onnx")]) == 1
    assert capsys.readouterr().err == ("error: ONNX export needs onnx, from the optional 'export' dependencies: "
                                       "pip install 'ssd-detect[export]'\n")
    assert not (tmp_path / "again.onnx").exists()


def test_demo_passes_its_options_to_the_demo_run(tmp_path, monkeypatch):
    import ssd.training.demo

    calls = []
    monkeypatch.setattr(ssd.training.demo, "run_demo", lambda **kwargs: calls.append(kwargs))
    assert main(["demo", "--project", str(tmp_path), "--epochs", "2", "--device", "cpu", "--quiet", "--name", "a",
                 "--exist-ok"]) == 0
    assert main(["demo"]) == 0
    assert calls == [dict(project=tmp_path, name="a", epochs=2, device="cpu", quiet=True, exist_ok=True),
                     dict(device="auto", quiet=False, exist_ok=False)]


@pytest.mark.slow
def test_import_converts_a_torchvision_detector_and_refuses_a_text_file(tmp_path, capsys):
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    torch.manual_seed(0)
    source = tmp_path / "ssdlite.pth"
    torch.save(ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).state_dict(), source)
    out = tmp_path / "ssdlite.pt"
    assert main(["import", str(source), "--output", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote {out} (ssdlite320_mobilenet_v3_large, 80 classes)")
    assert load_checkpoint(out)["config"]["name"] == "ssdlite320_mobilenet_v3_large"
    text = tmp_path / "notes.pth"
    text.write_text("not weights")
    assert main(["import", str(text), "--output", str(tmp_path / "x.pt")]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {text}") and err.count("\n") == 1 and not (tmp_path / "x.pt").exists()


def test_check_reports_malformed_exif_as_one_warning_line(tmp_path, capsys):
    """Pillow's raw "Tag data larger than file" warning becomes one line of the library's, naming the image."""
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    exif = Image.Exif()
    exif[0x010E] = "x" * 100
    Image.new("RGB", (64, 48), (9, 9, 9)).save(tmp_path / "images" / "a.jpg", exif=exif.tobytes()[:-60])
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: images\nval: images\nnames: [cat]\n")
    assert main(["check", str(tmp_path / "data.yaml")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "a.jpg" in line]
    assert warned == [f"warning: {tmp_path / 'images' / 'a.jpg'}: malformed metadata, the unreadable entries are "
                      "ignored (Tag data larger than file. Skipping tag 270)"]


@pytest.mark.parametrize(("command", "defaults", "use"), [
    ("val", "EVALUATE", ""), ("predict", "PREDICT", ""), ("export", "PREDICT", "with --nms: "),
    ("train", "EVALUATE", "validation "),
])
def test_thresholds_are_spelled_alike_and_show_the_settings_defaults(command, defaults, use, capsys):
    from ssd import settings

    table = getattr(settings, defaults)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    conf_default = (f"the model's best-F1 confidence, else {table.score_threshold}" if command == "predict"
                    else table.score_threshold)
    assert f"--conf CONF {use}score threshold in [0, 1] (default: {conf_default})" in out
    assert f"--iou IOU {use}NMS IoU threshold in [0, 1] (default: {table.iou_threshold})" in out
    assert "--score-threshold" not in out and "--iou-threshold" not in out
    assert ("--max-det N" in out) == (command != "train")


def test_train_conf_and_iou_set_the_config_fields(monkeypatch):
    import ssd.training.trainer

    seen = {}

    def fake_train(config, **overrides):
        seen.update(overrides)
        return SimpleNamespace(run_dir="runs/exp")

    monkeypatch.setattr(ssd.training.trainer, "train", fake_train)
    assert main(["train", "--data", "x", "--conf", "0.2", "--iou", "0.6"]) == 0
    assert seen == {"data": "x", "score_threshold": 0.2, "iou_threshold": 0.6}
    from ssd.errors import ConfigError
    from ssd.training.config import TrainConfig

    with pytest.raises(ConfigError, match=r"^score_threshold \(--conf\) must be a number in \[0, 1\], got 1.5$"):
        TrainConfig().update(score_threshold=1.5)


@pytest.mark.parametrize(("option", "message"), [
    (["--conf", "1.5"], "ssd val: --conf must be a number in [0, 1], got 1.5"),
    (["--iou", "nan"], "ssd val: --iou must be a number in [0, 1], got nan"),
    (["--max-det", "0"], "ssd val: --max-det must be a positive integer, got 0"),
    (["--batch-size", "0"], "ssd val: --batch-size must be a positive integer, got 0"),
])
def test_val_option_errors_name_the_flag_and_are_usage_errors(option, message, tmp_path, capsys):
    assert main(["val", "--weights", str(tmp_path / "w.pt"), "--data", str(tmp_path), *option]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"


@pytest.mark.slow
def test_val_loads_no_plotting_library():
    code = ("import sys\nimport ssd.cli, ssd.evaluation.evaluator, ssd.inference.backends.onnx\n"
            "import ssd.inference.backends.pytorch\n"
            "print('matplotlib' in sys.modules, 'ssd.training' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_val_run_directories_exp_exp2_exist_ok_and_the_same_files_as_the_python_api(shapes, tmp_path, capsys):
    from ssd.evaluation.results import evaluate_detections

    results = tmp_path / "none.json"
    results.write_text("[]")
    args = ["val", "--detections", str(results), "--data", str(shapes), "--project", str(tmp_path / "val")]
    assert main(args) == 0 and main(args) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {tmp_path / 'val' / 'exp2' / 'report.html'}"
    cli_files = sorted(p.name for p in (tmp_path / "val" / "exp2").iterdir())
    (tmp_path / "val" / "exp" / "report.html").write_text("stale")
    assert main([*args, "--exist-ok"]) == 0  # into exp again (the first free name is not taken), rewritten
    assert capsys.readouterr().out.splitlines()[-1] == f"report: {tmp_path / 'val' / 'exp' / 'report.html'}"
    assert (tmp_path / "val" / "exp" / "report.html").read_text() != "stale"
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["exp", "exp2"]
    for path in (tmp_path / "val" / "exp").iterdir():
        path.unlink() if path.is_file() else shutil.rmtree(path)
    written = evaluate_detections(results, shapes, project=tmp_path / "val", exist_ok=True)["run_dir"]
    assert written == tmp_path / "val" / "exp"  # exp again, no exp3
    assert sorted(p.name for p in written.iterdir()) == cli_files  # what ssd val writes


@pytest.mark.slow
def test_check_piped_into_a_closed_reader_exits_quietly(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    data = make_yolo_folder(tmp_path / "data", 2)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    read, write = os.pipe()
    os.close(read)  # `| head -0`: nobody reads what check prints
    with os.fdopen(write, "w") as closed:
        done = subprocess.run([sys.executable, "-m", "ssd", "check", str(data)], stdout=closed,
                              stderr=subprocess.PIPE, text=True, env=env)
    assert done.returncode == 141 and done.stderr == ""


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_of_ssd_errors_is_one_error_line(name, monkeypatch, capsys):
    error = getattr(errors, name)

    def fail(args):
        raise error(f"{name} message", *([503] if error is errors.ServerError else []))

    monkeypatch.setitem(COMMANDS, "check", fail)
    assert main(["check", "data"]) == (2 if error is errors.UsageError else 1)
    assert capsys.readouterr().err == f"error: {name} message\n"


@pytest.mark.parametrize("bug", [ValueError("int() of a bad literal"), KeyError("boxes"), OSError("no path")])
def test_an_internal_bug_shows_its_traceback_not_an_error_line(bug, monkeypatch):
    """Only the project's own errors (and the system refusing a path) become one `error:` line: a bug's ValueError
    reaches the user with its traceback instead of passing for a mistake of theirs."""

    def fail(args):
        raise bug

    monkeypatch.setitem(COMMANDS, "check", fail)
    with pytest.raises(type(bug)):
        main(["check", "data"])


def test_the_system_refusing_a_users_path_is_one_line(monkeypatch, capsys):
    def fail(args):
        return Path("/nonexistent-folder/x.txt").read_text()

    monkeypatch.setitem(COMMANDS, "check", fail)
    assert main(["check", "data"]) == 1
    assert capsys.readouterr().err == "error: No such file or directory: /nonexistent-folder/x.txt\n"


def test_every_project_error_is_an_ssd_error_and_keeps_its_builtin_type():
    """`except SSDError` catches them all; `except ValueError` callers of old still catch theirs."""
    for name in errors.__all__:
        assert issubclass(getattr(errors, name), errors.SSDError), name
    assert issubclass(errors.ConfigError, ValueError) and issubclass(errors.MissingInputError, FileNotFoundError)
    assert issubclass(errors.MissingDependencyError, ImportError) and issubclass(errors.CallbackError, TypeError)


def test_src_raises_no_bare_builtin_error_for_a_user():
    """Every `raise ValueError / FileNotFoundError / RuntimeError(...)` in src is a project error, save the few that
    are caught where they are raised (a parse step's reason) or mark a bug ("internal error")."""
    import ast
    from pathlib import Path

    caught_inside = {"jsonfile.py", "voc.py", "cvat.py", "index_file.py", "disk_cache.py", "hub.py", "importers.py"}
    found = []
    paths = sorted((Path(__file__).parents[1] / "src" / "ssd").rglob("*.py"))
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name)
                    and node.exc.func.id in ("ValueError", "FileNotFoundError", "RuntimeError")):
                found.append(f"{path.name}:{node.lineno}")
    assert [f for f in found if f.split(":")[0] not in caught_inside] == []
    assert {f.split(":")[0] for f in found} == caught_inside & {p.name for p in paths}  # no stale name

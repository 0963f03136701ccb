"""The `ssd` command line: grammar, help, suggestions and exit codes."""

import subprocess
import sys

import pytest

from ssd.cli import main


def test_version(capsys):
    import ssd

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == ssd.__version__


@pytest.mark.parametrize("command", ["train", "val", "predict", "export", "check", "demo"])
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

"""``ssd runs``: several run directories read into one table (exact numbers, the options that differ) and one
figure; a folder that is no run, or a results.csv cell that is no number, is refused by name."""

import csv

import pytest

from ssd.cli import main
from ssd.errors import ConfigError
from ssd.training.config import TrainConfig
from ssd.training.outputs import write_results_csv
from ssd.training.runs import compare_runs, read_run, write_comparison


def make_run(path, maps, lr, losses=None, seconds=30.0):
    rows = [{"epoch": i + 1, "train/loss": (losses or [2.0] * len(maps))[i], "lr": lr, "time": seconds * (i + 1),
             **({} if m is None else {"val/mAP": m})} for i, m in enumerate(maps)]
    write_results_csv(path / "results.csv", rows)
    TrainConfig(data="d.yaml", model="ssd_tiny", lr=lr, name=path.name).to_yaml(path / "config.yaml")
    return path


@pytest.fixture
def two_runs(tmp_path):
    return [make_run(tmp_path / "a", [0.1, 0.5, 0.4], 0.01, [3.0, 2.0, 1.5]),
            make_run(tmp_path / "b", [None, 0.25], 0.001, seconds=90.0)]


def test_the_table_has_each_runs_numbers_and_the_options_that_differ(two_runs):
    header, rows = compare_runs([read_run(path) for path in two_runs])
    assert header == ["run", "best mAP", "best epoch", "last mAP", "epochs", "minutes", "train loss", "lr"]
    assert rows == [[str(two_runs[0]), 0.5, 2, 0.4, 3, 1.5, 1.5, 0.01],
                    [str(two_runs[1]), 0.25, 2, 0.25, 2, 3.0, 2.0, 0.001]]  # name differs too, but says nothing


def test_a_run_without_validation_has_empty_cells(tmp_path):
    run = read_run(make_run(tmp_path / "c", [None], 0.01))
    assert run.summary() == {"run": str(tmp_path / "c"), "best mAP": None, "best epoch": None, "last mAP": None,
                             "epochs": 1, "minutes": 0.5, "train loss": 2.0}


def test_cli_writes_the_table_and_the_figure(two_runs, tmp_path, capsys):
    out = tmp_path / "compare"
    assert main(["runs", *map(str, two_runs), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "best mAP" in printed and "0.5000" in printed and f"written: {out / 'runs.csv'}" in printed
    with open(out / "runs.csv", newline="") as f:
        table = list(csv.reader(f))
    assert table[0][-1] == "lr" and table[1][1:4] == ["0.5", "2", "0.4"] and table[2][1:4] == ["0.25", "2", "0.25"]
    assert (out / "runs.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_folder_that_is_no_run_is_refused_by_name(two_runs, tmp_path, capsys):
    assert main(["runs", str(two_runs[0]), str(tmp_path / "nothing"), "--output", str(tmp_path / "o")]) == 1
    assert f"{tmp_path / 'nothing'}: not a training run directory (no results.csv" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing written before every run was read


def test_a_cell_that_is_no_number_is_refused_with_its_line(two_runs):
    path = two_runs[0] / "results.csv"
    path.write_text(path.read_text().replace("0.4", "zero point four"))
    with pytest.raises(ConfigError, match=r"results.csv, line 4: val/mAP is 'zero point four', not a number"):
        read_run(two_runs[0])


def test_an_output_over_a_runs_file_is_refused(two_runs):
    (two_runs[0] / "runs.csv").symlink_to(two_runs[0] / "results.csv")
    with pytest.raises(ValueError, match="results.csv"):
        write_comparison([read_run(path) for path in two_runs], two_runs[0])

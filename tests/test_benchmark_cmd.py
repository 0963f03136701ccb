"""``ssd benchmark`` on a tiny model: a row per format with the right status (a format made to fail at export, one
made to fail at validation), the CSV and JSON beside the table, a new run directory each time, the --floor gate."""

import csv
import json
import re
from pathlib import Path

import pytest
import torch

import ssd.export.benchmark as benchmark
from ssd.cli import main
from ssd.errors import ConfigError
from ssd.inference.backends import open_backend
from ssd.schemas import BenchmarkConfig


def failing_export(*_args):
    raise ValueError("calibration went wrong")


def failing_open(path, device):
    raise RuntimeError(f"cannot run {path.name} here")


@pytest.fixture
def broken_formats(monkeypatch):
    """``onnx-int8`` fails to export, ``opencv`` exports (the shared ONNX file) but fails to run."""
    monkeypatch.setitem(benchmark._ARTIFACTS, "onnx-int8", failing_export)
    monkeypatch.setitem(benchmark.RUNTIMES, "opencv", ("onnx", failing_open))


@pytest.mark.slow
def test_benchmark_writes_a_row_per_format_with_its_status(tiny_checkpoint, synthetic_voc, tmp_path, broken_formats,
                                                          capsys):
    args = ["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--formats",
            "onnx,onnx-int8,opencv", "--runs", "2", "--batch-sizes", "1,2", "--project", str(tmp_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    table = [line.split() for line in out.splitlines()]
    assert table[0][:2] == ["format", "status"]
    rows = {r["format"]: r for r in json.loads((tmp_path / "exp" / "benchmark.json").read_text())}
    assert list(rows) == ["pytorch", "onnx", "onnx-int8", "opencv"]
    assert [(r["status"], r["reason"]) for r in rows.values()] == [
        ("ok", ""), ("ok", ""), ("export failed", "calibration went wrong"),
        ("exported but validation failed", "cannot run model.onnx here")]
    assert rows["onnx"]["map50"] == pytest.approx(rows["pytorch"]["map50"], abs=0.01) and rows["onnx"]["map50"] > 0
    assert rows["onnx"]["change_vs_eager"] == pytest.approx(0.0, abs=0.01)
    assert rows["onnx"]["size_mb"] == pytest.approx((tmp_path / "exp" / "model.onnx").stat().st_size / 1e6, abs=1e-3)
    stages = ("pre_ms", "network_ms", "post_ms")
    assert all(rows[f][k] > 0 for f in ("pytorch", "onnx") for k in ("p50_ms", "p90_ms", "images_per_s", *stages))
    assert all(rows[f][k] < rows[f]["p90_ms"] for f in ("pytorch", "onnx") for k in stages)
    assert table[0][-6:] == ["pre", "ms", "network", "ms", "post", "ms"]
    assert rows["onnx-int8"]["map50"] is None and rows["opencv"]["size_mb"] == rows["onnx"]["size_mb"]
    assert "onnx-int8: calibration went wrong" in out and "opencv: cannot run model.onnx here" in out
    with open(tmp_path / "exp" / "benchmark.csv", newline="") as f:
        assert [r["status"] for r in csv.DictReader(f)] == [r["status"] for r in rows.values()]

    assert main(args + ["--floor", "0"]) == 1  # failed formats count as below any floor
    assert "error: below the mAP50 floor of 0.0: onnx-int8, opencv" in capsys.readouterr().err
    assert (tmp_path / "exp2" / "benchmark.json").is_file()  # a new run directory, the first one kept
    assert json.loads((tmp_path / "exp" / "benchmark.json").read_text())[0]["format"] == "pytorch"


@pytest.mark.slow
def test_benchmark_floor_passes_when_every_format_scores_above_it(tiny_checkpoint, synthetic_voc, tmp_path, capsys):
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--formats",
                 "pt2", "--runs", "2", "--batch-sizes", "1", "--project", str(tmp_path), "--floor",
                 "0"]) == 0
    assert "pt2" in capsys.readouterr().out


@pytest.mark.parametrize("floor", ["nan", "inf", "-1", "1e308"])
def test_benchmark_floor_of_nan_or_out_of_range_exits_2_before_any_folder_is_made(tmp_path, capsys, floor):
    assert main(["benchmark", "--weights", "w.pt", "--data", "d", "--project", str(tmp_path / "runs"), "--floor",
                 floor]) == 2
    assert f"--floor must be mAP50 points in [0, 100], got {float(floor)!r}" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("floor", [True, 10**400])  # a bool, and an int no float holds (no OverflowError)
def test_benchmark_floor_refuses_a_bool_like_every_numeric_option(floor):
    with pytest.raises(ConfigError, match=re.escape("--floor must be mAP50 points in [0, 100], got ")):
        BenchmarkConfig(weights=Path("w.pt"), data="d", floor=floor)


@pytest.mark.parametrize("sizes", [(), (0,), (1, True), (2.0,)])
def test_batch_sizes_rule_is_one_for_the_schema_and_the_api(sizes, tmp_path):
    message = re.escape(f"--batch-sizes must be positive integers, such as 1,8, got {list(sizes)!r}")
    with pytest.raises(ConfigError, match=message):
        BenchmarkConfig(weights=Path("w.pt"), data="d", batch_sizes=sizes)
    with pytest.raises(ConfigError, match=message):
        benchmark.run_benchmark("w.pt", "d", tmp_path / "out", batch_sizes=sizes)
    assert not (tmp_path / "out").exists()


def test_benchmark_unknown_format_names_the_closest_before_any_folder_is_made(tiny_checkpoint, synthetic_voc,
                                                                               tmp_path, capsys):
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--formats",
                 "onnx,openvino-int9", "--project", str(tmp_path / "runs")]) == 1
    err = capsys.readouterr().err
    assert "unknown benchmark format 'openvino-int9'" in err and "openvino-int8" in err
    assert not (tmp_path / "runs").exists()


def test_benchmark_missing_weights_or_data_is_refused_before_any_folder_is_made(tiny_checkpoint, synthetic_voc,
                                                                               tmp_path, capsys):
    runs = tmp_path / "runs"
    assert main(["benchmark", "--weights", str(tmp_path / "missing.pt"), "--data", str(synthetic_voc),
                 "--project", str(runs)]) == 1
    assert "missing.pt does not exist" in capsys.readouterr().err
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(tmp_path / "nodata"),
                 "--project", str(runs)]) == 1
    assert "dataset " + str(tmp_path / "nodata") + " does not exist" in capsys.readouterr().err
    assert not runs.exists()


@pytest.mark.slow
@pytest.mark.parametrize("native", [True, False])
def test_benchmark_eager_bfloat16_row_runs_where_the_cpu_has_native_bfloat16_else_says_why_it_is_skipped(
        tiny_checkpoint, synthetic_voc, tmp_path, monkeypatch, capsys, native):
    monkeypatch.setattr(benchmark, "amp_dtype", lambda device: torch.bfloat16 if native else None)
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--formats",
                 "pytorch-bf16", "--runs", "2", "--batch-sizes", "1", "--project", str(tmp_path), "--floor",
                 "0"]) == 0  # a skipped row is not below the floor
    eager, bf16 = json.loads((tmp_path / "exp" / "benchmark.json").read_text())
    if native:
        assert bf16["status"] == "ok" and bf16["map50"] == pytest.approx(eager["map50"], abs=5) and bf16["p50_ms"] > 0
    else:
        assert (bf16["status"], bf16["map50"], bf16["p50_ms"]) == ("skipped", None, None)
        assert bf16["reason"].startswith("cpu has no native bfloat16")
        assert "pytorch-bf16: cpu has no native bfloat16" in capsys.readouterr().out


@pytest.mark.slow
def test_eager_bfloat16_runs_the_network_in_bfloat16_and_returns_float32(tiny_checkpoint):
    eager = open_backend(tiny_checkpoint, "cpu")
    batch = torch.rand(2, 3, 128, 128)
    loc, logits = eager(batch)
    loc16, logits16 = benchmark._Bfloat16Backend(eager)(batch)
    assert loc16.dtype == logits16.dtype == torch.float32
    assert not torch.equal(logits16, logits) and torch.allclose(logits16, logits, atol=0.2)
    assert torch.allclose(loc16, loc, atol=0.2)


@pytest.mark.slow
def test_benchmark_takes_ready_made_artifacts_as_they_are_without_exporting_again(tiny_checkpoint, synthetic_voc,
                                                                                  tmp_path):
    from ssd.export import export

    onnx_file = export(tiny_checkpoint, "onnx", tmp_path / "given" / "detector.onnx")
    program = export(tiny_checkpoint, "pt2", tmp_path / "given" / "detector.pt2")
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--artifacts",
                 str(onnx_file), str(program), "--runs", "2", "--batch-sizes", "1", "--project",
                 str(tmp_path / "runs")]) == 0
    rows = json.loads((tmp_path / "runs" / "exp" / "benchmark.json").read_text())
    assert [(r["format"], r["status"], r["artifact"]) for r in rows] == [
        ("pytorch", "ok", str(tiny_checkpoint)), ("onnx:detector.onnx", "ok", str(onnx_file)),
        ("pt2:detector.pt2", "ok", str(program))]
    assert all(r["change_vs_eager"] == pytest.approx(0.0, abs=0.01) and r["p50_ms"] > 0 for r in rows)
    assert sorted(p.name for p in (tmp_path / "runs" / "exp").iterdir()) == [
        "benchmark.csv", "benchmark.json", "benchmark.txt"]  # nothing exported again


def test_benchmark_missing_artifact_is_refused_before_any_folder_is_made(tiny_checkpoint, synthetic_voc, tmp_path,
                                                                         capsys):
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--artifacts",
                 str(tmp_path / "gone.onnx"), "--project", str(tmp_path / "runs")]) == 1
    assert f"error: artifact {tmp_path / 'gone.onnx'} does not exist" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_artifacts_with_the_same_file_name_are_named_by_their_paths(tmp_path):
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.onnx").write_bytes(b"")
    (tmp_path / "ir").mkdir()
    (tmp_path / "ir" / "model.xml").write_text("")
    assert benchmark.artifact_rows([tmp_path / "ir"]) == {"openvino:ir": tmp_path / "ir"}
    assert list(benchmark.artifact_rows([tmp_path / "a" / "model.onnx", tmp_path / "b" / "model.onnx"])) == [
        f"onnx:{tmp_path / 'a' / 'model.onnx'}", f"onnx:{tmp_path / 'b' / 'model.onnx'}"]


def test_benchmark_calib_images_0_is_refused_before_any_folder_is_made(tiny_checkpoint, synthetic_voc, tmp_path,
                                                                      capsys):
    assert main(["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--calib-images", "0",
                 "--project", str(tmp_path / "runs")]) == 2
    assert "ssd benchmark: --calib-images must be a positive integer, got 0" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_benchmark_exist_ok_writes_into_its_run_directory_again(tiny_checkpoint, synthetic_voc, tmp_path, capsys):
    args = ["benchmark", "--weights", str(tiny_checkpoint), "--data", str(synthetic_voc), "--formats",
            "pytorch", "--runs", "1", "--batch-sizes", "1", "--project", str(tmp_path)]
    assert main(args) == 0 and main([*args, "--exist-ok"]) == 0  # exp again, its files replaced
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exp"]
    assert [r["format"] for r in json.loads((tmp_path / "exp" / "benchmark.json").read_text())] == ["pytorch"]

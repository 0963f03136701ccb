"""``run_demo`` end to end on a reduced dataset: generates, trains, evaluates, draws, says where everything is."""

from __future__ import annotations

import json
import math

import pytest

from ssd.training.demo import DEMO_DATA, demo_dataset, run_demo

SMALL = {"num_train": 24, "num_val": 8, "image_size": 128}


@pytest.mark.slow
def test_demo_small_end_to_end(tmp_path, capsys):
    result = run_demo(tmp_path, device="cpu", quiet=True, epochs=1, batch_size=8, workers=0, data=SMALL,
                      image_size=128)
    out = capsys.readouterr().out
    assert result.run_dir == tmp_path / "exp"
    assert math.isfinite(result.metrics["map"])
    assert f"run directory:  {result.run_dir}" in out and "validation mAP@0.5" in out
    assert list((result.run_dir / "val_predictions").glob("*.jpg"))
    assert (result.run_dir / "weights" / "best.pt").is_file()
    assert json.loads((tmp_path / "data" / "demo.json").read_text()) == {**DEMO_DATA, **SMALL}


def test_demo_dataset_reused_when_identical(tmp_path):
    root = demo_dataset(tmp_path / "d", **SMALL)
    first = (root / "JPEGImages" / "synth_000000.jpg").stat().st_mtime_ns
    demo_dataset(tmp_path / "d", **SMALL)
    assert (root / "JPEGImages" / "synth_000000.jpg").stat().st_mtime_ns == first


@pytest.mark.parametrize("argv, words", [(["--epochs", "0"], "epochs=0 is invalid: must be at least 1 (--epochs)"),
                                         (["--epochs", "-1"], "epochs=-1 is invalid: must be at least 1"),
                                         (["--device", "gpu"], "device 'gpu' is not a valid device")])
def test_demo_options_are_refused_before_any_image_is_generated(tmp_path, capsys, argv, words):
    from ssd.cli import main

    assert main(["demo", "--project", str(tmp_path / "runs"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ssd demo: ") and words in err[0]
    assert not (tmp_path / "runs" / "demo_data").exists()

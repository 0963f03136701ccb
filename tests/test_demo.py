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

"""The model card: one type for what an artifact is. Files written before it (a checkpoint and two ONNX exports
made with ssd 0772225, tests/data/legacy*) still load and give the detections they gave then."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from ssd.inference.pipeline import load

DATA = Path(__file__).parent / "data"
LEGACY = ["legacy.pt", "legacy.onnx", "legacy_nms.onnx"]


def legacy_file(name: str, folder: Path) -> Path:
    """``tests/data/<name>.gz`` unpacked into ``folder``: the file as the old code wrote it."""
    path = folder / name
    path.write_bytes(gzip.decompress((DATA / f"{name}.gz").read_bytes()))
    return path


def legacy_image() -> torch.Tensor:
    return torch.randint(0, 256, (3, 48, 80), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", LEGACY)
def test_files_written_before_the_card_load_and_detect_as_they_did(name, tmp_path):
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime")
    expected = json.loads((DATA / "legacy.json").read_text())[name]
    result = load(legacy_file(name, tmp_path)).predict([legacy_image()])[0]
    assert result.labels.tolist() == expected["labels"]
    assert result.scores.tolist() == pytest.approx(expected["scores"], abs=1e-5)
    assert torch.allclose(result.boxes, torch.tensor(expected["boxes"]), atol=1e-3, rtol=0)

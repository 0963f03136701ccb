"""Shared fixtures: the real datasets folder and a small synthetic VOC dataset."""

import os
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (set SSD_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def synthetic_voc(tmp_path_factory) -> Path:
    from ssd.data.synthetic import generate_synthetic

    root = tmp_path_factory.mktemp("synthetic")
    return generate_synthetic(root, num_train=48, num_val=16, image_size=128, num_classes=3, seed=0)

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


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """``best.pt`` of an ssd_tiny (the 3 classes of ``synthetic_voc``, 128 px input, seeded random weights) whose
    class logits are biased towards objects, so that it detects something: what the deployment tests export."""
    from torch import nn

    from ssd.models import build_model
    from ssd.weights.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build_model("ssd_tiny", class_names=["circle", "square", "triangle"], image_size=128).eval()
    with torch.no_grad():
        for head in model.heads:
            conv = [m for m in head.cls.modules() if isinstance(m, nn.Conv2d)][-1]
            conv.bias.view(-1, 4)[:, 1:] += torch.linspace(1.5, 0.5, 3)  # [A, K+1], index 0 background
    return save_checkpoint(tmp_path_factory.mktemp("tiny") / "best.pt", model)

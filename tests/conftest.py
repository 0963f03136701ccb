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


def jittered_detections(ground_truths: list[dict], num_classes: int, seed: int = 0) -> list[dict]:
    """Synthetic detections of per-image ground truths (no model needed): each object found once with its box
    jittered by up to 20% of its size, some with a wrong label, plus one random false positive per image; scores
    uniform in [0, 1] so every threshold and IoU level of a metric is exercised."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for truth in ground_truths:
        boxes = truth["boxes"].float()
        n = boxes.shape[0]
        size = (boxes[:, 2:] - boxes[:, :2]).repeat(1, 2)
        jittered = boxes + (torch.rand(n, 4, generator=g) - 0.5) * 0.4 * size
        relabel = torch.rand(n, generator=g) < 0.1
        labels = torch.where(relabel, torch.randint(0, num_classes, (n,), generator=g), truth["labels"])
        h, w = truth.get("image_size", (512, 512))
        corner = torch.rand(1, 2, generator=g) * torch.tensor([w, h]) * 0.8
        false_positive = torch.cat([corner, corner + torch.tensor([w, h]) * 0.1], dim=1)
        out.append({"boxes": torch.cat([jittered, false_positive]),
                    "labels": torch.cat([labels, torch.randint(0, num_classes, (1,), generator=g)]),
                    "scores": torch.rand(n + 1, generator=g)})
    return out

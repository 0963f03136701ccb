"""Shared fixtures and helpers: the real datasets folder, small synthetic VOC datasets (built by
``builders.make_dataset``), random-init models that detect something, and random images."""

import logging
import os
from pathlib import Path

import pytest
import torch
from torch import nn

from builders import make_dataset

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("SSD_SHARED_DATA", REPO.parent / "shared" / "data"))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="session", autouse=True)
def dataset_cache(tmp_path_factory) -> Path:
    """The dataset indexes of the session (``SSD_CACHE_DIR``, inherited by subprocesses): never the user's cache."""
    folder = tmp_path_factory.mktemp("ssd-cache")
    previous, os.environ["SSD_CACHE_DIR"] = os.environ.get("SSD_CACHE_DIR"), str(folder)
    yield folder
    if previous is None:
        del os.environ["SSD_CACHE_DIR"]
    else:
        os.environ["SSD_CACHE_DIR"] = previous


@pytest.fixture
def ssd_messages(caplog):
    """A callable returning the messages logged on the ``ssd`` logger (INFO and above) so far in the test."""
    caplog.set_level(logging.INFO, logger="ssd")
    return lambda: [r.getMessage() for r in caplog.records if r.name == "ssd"]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real datasets not found at {SHARED_DATA} (set SSD_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def synthetic_voc(tmp_path_factory) -> Path:
    return make_dataset("voc", tmp_path_factory.mktemp("synthetic"), train=48, val=16, size=128, classes=3)


@pytest.fixture(scope="session")
def shapes(tmp_path_factory) -> Path:
    """16 train / 8 val synthetic VOC images of 64 px, 2 classes: what TINY_TRAIN trains on in seconds."""
    return make_dataset("voc", tmp_path_factory.mktemp("shapes"), train=16, val=8, size=64, classes=2)


def biased_model(name: str, num_classes: int = 3, seed: int = 0, **options) -> nn.Module:
    """A random-init model whose class logits are biased towards objects, so that it detects something."""
    from ssd.models import build_model

    torch.manual_seed(seed)
    model = build_model(name, num_classes=num_classes, **options).eval()
    with torch.no_grad():
        for head in model.heads:
            conv = [m for m in head.cls.modules() if isinstance(m, nn.Conv2d)][-1]
            bias = conv.bias.view(-1, num_classes + 1)  # [A, K+1], index 0 background
            bias[:, 1:] += torch.linspace(1.5, 0.5, num_classes)
    return model


def random_images(count: int, seed: int = 1) -> list[torch.Tensor]:
    """``count`` seeded random ``uint8 [3, H, W]`` images of four sizes in turn."""
    generator = torch.Generator().manual_seed(seed)
    sizes = [(120, 160), (90, 70), (64, 64), (100, 130)]
    return [torch.randint(0, 256, (3, *sizes[i % 4]), dtype=torch.uint8, generator=generator) for i in range(count)]


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

"""Shared fixtures: the real datasets folder, small synthetic VOC datasets, a tiny checkpoint that detects
something, the session's dataset cache and the ssd logger's messages. What they build comes from builders.py."""

import logging
import os
from pathlib import Path

import pytest
import torch

from builders import biased_model, make_dataset

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


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """``best.pt`` of an ssd_tiny (the 3 classes of ``synthetic_voc``, 128 px input, seeded random weights) whose
    class logits are biased towards objects, so that it detects something: what the deployment tests export."""
    from ssd.weights.checkpoint import save_checkpoint

    model = biased_model("ssd_tiny", class_names=["circle", "square", "triangle"], image_size=128)
    return save_checkpoint(tmp_path_factory.mktemp("tiny") / "best.pt", model)

"""Reproduce the original SSD numerics stored in ../shared/reference (see its README.md)."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from ssd.loss import MultiBoxLoss
from ssd.matching import match
from ssd.priors import PRIOR_CONFIGS

REFERENCE = Path(
    os.environ.get("SSD_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
).parent / "reference"


def load(name):
    path = REFERENCE / name
    if not path.is_file():
        pytest.skip(f"reference file not found: {path} (set SSD_SHARED_DATA to <shared>/data)")
    with np.load(path) as data:
        return {key: torch.from_numpy(data[key]) for key in data.files}


@pytest.fixture(scope="module")
def batch():
    return load("loss_batch.npz")


@pytest.fixture(scope="module")
def priors():
    return PRIOR_CONFIGS["ssd300"].boxes(300)


def test_ssd300_priors_exact(priors):
    assert torch.equal(priors, load("priors_ssd300.npz")["priors"])


def reference_labels(batch):
    """The reference pads with label -1, our convention; its num_obj must agree."""
    labels = batch["labels"]
    assert torch.equal((labels >= 0).sum(dim=1), batch["num_obj"])
    return labels


def test_matching_exact(batch, priors):
    _, cls_t = match(batch["truths"], reference_labels(batch), priors)
    assert torch.equal(cls_t, batch["conf_t"])
    assert torch.equal(cls_t > 0, batch["pos"])
    assert torch.equal((cls_t > 0).sum(dim=1), batch["num_pos"])


def test_hard_negatives_exact(batch, priors):
    fn = MultiBoxLoss()
    positive = batch["pos"]
    negative = fn._hard_negatives(batch["conf_data"], positive, positive.sum(dim=1))
    assert torch.equal(negative, batch["neg"])


def run_loss(batch, priors, device):
    loc = batch["loc_data"].to(device).requires_grad_()
    logits = batch["conf_data"].to(device).requires_grad_()
    args = (priors.to(device), batch["truths"].to(device), reference_labels(batch).to(device))
    loc_loss, cls_loss = MultiBoxLoss(neg_pos_ratio=3, iou_threshold=0.5, variances=(0.1, 0.2))(loc, logits, *args)
    (loc_loss + cls_loss).backward()
    return loc_loss, cls_loss, loc.grad, logits.grad


def check(batch, loc_loss, cls_loss, grad_loc, grad_conf):
    torch.testing.assert_close(loc_loss.cpu(), batch["loss_l"], rtol=1e-5, atol=0)
    torch.testing.assert_close(cls_loss.cpu(), batch["loss_c"], rtol=1e-5, atol=0)
    torch.testing.assert_close(grad_loc.cpu(), batch["grad_loc"], rtol=0, atol=1e-6)
    torch.testing.assert_close(grad_conf.cpu(), batch["grad_conf"], rtol=0, atol=1e-6)


def test_loss_and_gradients(batch, priors):
    check(batch, *run_loss(batch, priors, "cpu"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_loss_and_gradients_cuda(batch, priors):
    check(batch, *run_loss(batch, priors, "cuda"))

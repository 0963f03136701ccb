"""--class-weights auto: the weights from hand-counted objects, the weighted cross-entropy of MultiBoxLoss computed by
hand, and the option wired from TrainConfig to the run's loss."""

import math
from pathlib import Path

import pytest
import torch

from builders import TINY_TRAIN
from ssd.data.balance import class_counts, class_weights
from ssd.data.load import load_dataset
from ssd.data.records import ImageRecord, ObjectRecord
from ssd.data.table import RecordTable
from ssd.errors import ConfigError
from ssd.loss import MultiBoxLoss
from ssd.training.config import TrainConfig


def test_weights_are_the_capped_inverse_frequency_with_background_one():
    # N = 9 objects of K' = 3 classes: 9 / (3 * 6) = 0.5, 9 / (3 * 2) = 1.5, 9 / (3 * 1) = 3
    assert class_weights([6, 2, 1]) == [1.0, 0.5, 1.5, 3.0]
    assert class_weights([6, 2, 1], cap=2.0) == [1.0, 0.5, 1.5, 2.0]
    assert class_weights([4, 0, 4]) == [1.0, 1.0, 1.0, 1.0]  # 8 / (2 * 4); the absent class keeps 1
    assert class_weights([1, 999]) == [1.0, 10.0, 0.5005005005005005]  # 1000 / 2 capped at 10; 1000 / 1998


def test_counts_leave_out_difficult_and_crowd_objects_as_training_does():
    def obj(label, **flags):
        return ObjectRecord((0.0, 0.0, 4.0, 4.0), label, "ab"[label], **flags)

    records = [ImageRecord(Path("a.jpg"), None, [obj(0), obj(1), obj(1, difficult=True)], 8, 8),
               ImageRecord(Path("b.jpg"), None, [obj(1), obj(0, iscrowd=True)], 8, 8),
               ImageRecord(Path("c.jpg"), None, [], 8, 8)]
    assert class_counts(records, 2).tolist() == [1, 2]
    assert class_counts(RecordTable.from_records(records), 2).tolist() == [1, 2]


def test_weighted_cross_entropy_by_hand():
    """Two priors: the first is the ground truth's box (a positive of class 1, logit index 2), the second its only
    hard negative. Zero logits: each cross-entropy is log 3; weights [1, 5, 0.5] make it 0.5 log 3 + 1 log 3."""
    priors = torch.tensor([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5]])
    loc, logits = torch.zeros(1, 2, 4), torch.zeros(1, 2, 3)
    boxes, labels = torch.tensor([[[0.0, 0.0, 0.5, 0.5]]]), torch.tensor([[1]])
    _, plain = MultiBoxLoss()(loc, logits, priors, boxes, labels)
    _, weighted = MultiBoxLoss(class_weights=[1.0, 5.0, 0.5])(loc, logits, priors, boxes, labels)
    assert plain.item() == pytest.approx(2 * math.log(3), abs=1e-6)
    assert weighted.item() == pytest.approx(1.5 * math.log(3), abs=1e-6)
    with pytest.raises(ValueError, match=r"class_weights has shape \(2,\), the classifier 3 outputs"):
        MultiBoxLoss(class_weights=[1.0, 2.0])(loc, logits, priors, boxes, labels)


@pytest.mark.slow
def test_the_option_is_checked_and_reaches_the_runs_loss(shapes, tmp_path, ssd_messages):
    from ssd.training.trainer import train

    with pytest.raises(ConfigError, match="class_weights"):
        TrainConfig(class_weights="yes")
    counts = class_counts(load_dataset(shapes).records("train"), 2)
    expected = class_weights(counts)
    train(data=str(shapes), epochs=1, project=str(tmp_path), class_weights="auto", **TINY_TRAIN)
    shown = next(m for m in ssd_messages() if m.startswith("class weights: "))
    names = load_dataset(shapes).class_names
    assert shown == "class weights: " + ", ".join(f"{n} {w:.3g}" for n, w in zip(names, expected[1:]))

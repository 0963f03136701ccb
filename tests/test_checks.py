"""validate_targets: every bad input gives a ValueError naming image, object, value and rule."""

import re

import pytest
import torch

from ssd.checks import validate_predictions, validate_targets

BOX = [0.1, 0.1, 0.5, 0.5]


def targets(labels, boxes=None):
    labels = torch.tensor(labels, dtype=torch.int64)
    if boxes is None:
        boxes = torch.tensor(BOX).expand(*labels.shape, 4).clone()
    return torch.as_tensor(boxes, dtype=torch.float32), labels


def test_valid_targets_pass():
    validate_targets(*targets([[0, 5, -1], [-1, -1, -1]]), num_classes=6)
    validate_targets(torch.zeros(3, 0, 4), torch.zeros(3, 0, dtype=torch.long), num_classes=2)
    validate_targets(torch.zeros(0, 4, 4), torch.zeros(0, 4, dtype=torch.long), num_classes=2)


def test_label_equal_to_num_classes_explains_background():
    boxes, labels = targets([[0, 1, 2], [3, 4, 5]])
    labels[1, 2] = 6
    message = (
        "label 6 in image 1, object 2 is out of range for num_classes=6 "
        "(labels must be 0..5; the background class is added internally, do not count it)"
    )
    with pytest.raises(ValueError, match=re.escape(message) + "$"):
        validate_targets(boxes, labels, num_classes=6)


def test_label_above_num_classes_and_count_of_bad_objects():
    boxes, labels = targets([[0, 9, 7], [1, 1, 8]])
    with pytest.raises(ValueError) as err:
        validate_targets(boxes, labels, num_classes=3)
    assert str(err.value) == (
        "label 9 in image 0, object 1 is out of range for num_classes=3 (labels must be 0..2)"
        " (2 more invalid objects in this batch)"
    )


def test_negative_label_other_than_padding():
    boxes, labels = targets([[0, -1], [-2, 1]])
    with pytest.raises(ValueError, match=re.escape("label -2 in image 1, object 0 is negative (labels must be 0..4;")):
        validate_targets(boxes, labels, num_classes=5)
    with pytest.raises(ValueError, match="label -2 in image 1, object 0 is negative"):
        validate_targets(boxes, labels, num_classes=None)


def test_range_check_skipped_without_num_classes():
    validate_targets(*targets([[0, 1000]]), num_classes=None)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_box(bad):
    boxes, labels = targets([[0, 1], [2, 0]])
    boxes[1, 1, 3] = bad
    with pytest.raises(ValueError, match=r"box \[0\.1, 0\.1, 0\.5, (nan|inf|-inf)\] in image 1, object 1 \(label 0\)"):
        validate_targets(boxes, labels, num_classes=3)


def test_padding_rows_are_not_checked():
    boxes, labels = targets([[0, -1]])
    boxes[0, 1] = float("nan")
    validate_targets(boxes, labels, num_classes=1)


@pytest.mark.parametrize("box", [[0.5, 0.1, 0.5, 0.4], [0.5, 0.1, 0.4, 0.4], [0.1, 0.4, 0.5, 0.3]])
def test_empty_or_inverted_box(box):
    boxes, labels = targets([[0, 0]])
    boxes[0, 1] = torch.tensor(box)
    message = r"in image 0, object 1 \(label 0\) is empty or inverted .*x2 > x1 and y2 > y1"
    with pytest.raises(ValueError, match=message):
        validate_targets(boxes, labels, num_classes=1)


@pytest.mark.parametrize(
    ("boxes", "labels", "message"),
    [
        (torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), r"gt_boxes must have shape \[B, G, 4\].*got \[2, 4\]"),
        (torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long), r"got \[2, 3, 5\]"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long), r"gt_labels must have shape \[B, G\] = \[2, 3\]"),
        (torch.zeros(2, 3, 4), torch.zeros(2, 3), "gt_labels must be an integer tensor"),
        (torch.zeros(2, 3, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), "must be a floating point"),
        ([[BOX]], torch.zeros(1, 1, dtype=torch.long), "must be tensors, got list"),
    ],
)
def test_wrong_shapes_and_dtypes(boxes, labels, message):
    with pytest.raises(ValueError, match=message):
        validate_targets(boxes, labels, num_classes=3)


def test_num_classes_must_be_positive():
    with pytest.raises(ValueError, match="num_classes must be at least 1"):
        validate_targets(*targets([[0]]), num_classes=0)


def test_validate_predictions():
    priors = torch.rand(10, 4)
    assert validate_predictions(torch.zeros(2, 10, 4), torch.zeros(2, 10, 7), priors) == 6
    with pytest.raises(ValueError, match="need K\\+1 >= 2"):
        validate_predictions(torch.zeros(2, 10, 4), torch.zeros(2, 10, 1), priors)
    with pytest.raises(ValueError, match="11 boxes per image but there are 10 priors"):
        validate_predictions(torch.zeros(2, 11, 4), torch.zeros(2, 11, 3), priors)
    with pytest.raises(ValueError, match=r"logits must have shape \[B, P, K\+1\]"):
        validate_predictions(torch.zeros(2, 10, 4), torch.zeros(2, 9, 3), priors)
    with pytest.raises(ValueError, match=r"loc must have shape"):
        validate_predictions(torch.zeros(2, 10, 3), torch.zeros(2, 10, 3), priors)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_raises_value_error_not_device_assert():
    boxes, labels = targets([[0, 1, 2], [3, 4, 6]])
    with pytest.raises(ValueError, match="label 6 in image 1, object 2 is out of range for num_classes=6"):
        validate_targets(boxes.cuda(), labels.cuda(), num_classes=6)
    torch.cuda.synchronize()  # no pending device-side assert

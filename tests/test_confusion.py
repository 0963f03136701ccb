"""Confusion matrix with a background row and column, at a stated confidence and IoU."""

import numpy as np
import pytest
import torch

from ssd.evaluation.confusion import confusion_matrix


def _image(boxes, labels, scores=None, difficult=None):
    out = {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "labels": torch.tensor(labels)}
    if scores is not None:
        out["scores"] = torch.tensor(scores)
    else:
        out["difficult"] = torch.tensor(difficult or [False] * len(labels))
    return out


def test_counts_of_hits_confusions_misses_and_false_positives():
    """Image 1: fish A found; shark B taken for a fish; fish C detected only below the confidence (missed); a
    shark detection on nothing. Image 2: shark D found twice (the second, lower IoU, is a background FP)."""
    truths = [_image([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10]], [0, 1, 0]), _image([[0, 0, 20, 20]], [1])]
    detections = [_image([[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [70, 70, 80, 80]], [0, 0, 0, 1],
                         scores=[0.9, 0.8, 0.1, 0.5]),
                  _image([[0, 0, 20, 20], [0, 0, 20, 14]], [1, 1], scores=[0.7, 0.6])]
    result = confusion_matrix(detections, truths, 2, ["fish", "shark"], confidence=0.25, iou_threshold=0.5)
    assert result["names"] == ["fish", "shark", "background"]
    assert result["counts"].tolist() == [[1, 0, 1], [1, 1, 0], [0, 2, 0]]
    assert result["normalized"] == pytest.approx(np.array([[0.5, 0, 0.5], [0.5, 0.5, 0], [0, 1, 0]]))
    assert (result["confidence"], result["match_iou_threshold"]) == (0.25, 0.5)
    # at confidence 0.05 fish C is found
    low = confusion_matrix(detections, truths, 2, ["fish", "shark"], confidence=0.05)
    assert low["counts"].tolist() == [[2, 0, 0], [1, 1, 0], [0, 2, 0]]
    # a score equal to the confidence is not above it (as in predict): fish C at exactly 0.1 stays missed
    at = confusion_matrix(detections, truths, 2, ["fish", "shark"], confidence=0.1)
    assert at["counts"].tolist() == [[1, 0, 1], [1, 1, 0], [0, 2, 0]]


def test_difficult_objects_are_neither_hits_nor_misses_and_empty_rows_stay_zero():
    truths = [_image([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 0], difficult=[True, True])]
    detections = [_image([[0, 0, 10, 10]], [0], scores=[0.9])]
    result = confusion_matrix(detections, truths, 2)
    assert result["counts"].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 0]]
    assert result["normalized"].tolist() == [[0, 0, 0], [0, 0, 0], [0, 0, 0]]

"""Precision / recall / F1 against confidence and the confidence of the best F1."""

import pytest
import torch

from ssd.evaluation.curves import operating_point


def _truth(boxes, labels, difficult=None):
    n = len(labels)
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "labels": torch.tensor(labels),
            "difficult": torch.tensor(difficult or [False] * n)}


def _detections(boxes, labels, scores):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4), "labels": torch.tensor(labels),
            "scores": torch.tensor(scores)}


# Four objects of class 0 in one image; detections scored 0.9 TP, 0.8 TP, 0.7 FP, 0.6 TP, 0.3 FP.
# Kept: scores strictly above c (as every score_threshold):
#   c < 0.3: P 3/5 R 3/4 F1 2/3 | [0.3, 0.6): P 3/4 R 3/4 F1 3/4 | [0.6, 0.7): P 2/3 R 1/2 F1 4/7
#   [0.7, 0.8): P 1 R 1/2 F1 2/3 | [0.8, 0.9): P 1 R 1/4 F1 2/5 | 0.9 and above: nothing kept, F1 0.
OBJECTS = [[0, 0, 10, 10], [20, 0, 30, 10], [40, 0, 50, 10], [60, 0, 70, 10]]
FOUND = [[0, 0, 10, 10], [20, 0, 30, 10], [80, 80, 90, 90], [40, 0, 50, 10], [100, 100, 110, 110]]
SCORES = [0.9, 0.8, 0.7, 0.6, 0.3]


def test_f1_curve_peaks_at_the_weakest_detection_that_keeps_it_best():
    result = operating_point([_detections(FOUND, [0] * 5, SCORES)], [_truth(OBJECTS, [0] * 4)], 1, ["fish"],
                             steps=100)
    curve = result["per_class"]["fish"]
    confidence = result["confidence"]
    at = {c: round(c * 100) for c in (0.0, 0.3, 0.31, 0.6, 0.61, 0.7, 0.75, 0.85, 0.95)}
    assert [float(curve["f1"][at[c]]) for c in at] == pytest.approx(
        [2 / 3, 3 / 4, 3 / 4, 4 / 7, 4 / 7, 2 / 3, 2 / 3, 2 / 5, 0.0], abs=1e-6)
    assert curve["precision"][at[0.95]] == 1.0 and curve["recall"][at[0.95]] == 0.0
    # the highest grid confidence that keeps the 0.6 detection: used as --conf, it keeps exactly these
    assert curve["best"] == pytest.approx({"confidence": 0.59, "precision": 0.75, "recall": 0.75, "f1": 0.75})
    assert confidence[at[0.6]] == pytest.approx(0.6)
    assert result["overall"]["best"] == curve["best"]  # one class: the mean is that class


def test_overall_curve_is_the_mean_over_classes_with_objects_and_absent_classes_say_so():
    """Class 0 as above; class 1: one object found at 0.5 (F1 1 up to 0.5, then 0); class 2 has no objects.
    Mean F1 below 0.5: (3/4 + 1) / 2 = 7/8, at 0.5: (3/4 + 0) / 2: the best overall confidence is 0.49."""
    detections = _detections(FOUND + [[0, 50, 10, 60]], [0] * 5 + [1], SCORES + [0.5])
    truths = _truth(OBJECTS + [[0, 50, 10, 60]], [0] * 4 + [1])
    result = operating_point([detections], [truths], 3, ["fish", "shark", "ray"], steps=100)
    assert result["per_class"]["shark"]["best"] == pytest.approx(
        {"confidence": 0.49, "precision": 1.0, "recall": 1.0, "f1": 1.0})
    assert result["overall"]["best"] == pytest.approx(
        {"confidence": 0.49, "precision": 7 / 8, "recall": 7 / 8, "f1": 7 / 8})
    ray = result["per_class"]["ray"]
    assert ray["absent"] and ray["best"] is None and ray["num_gt"] == 0 and ray["f1"].size == 0


def test_detections_on_difficult_objects_do_not_count():
    truths = _truth([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 0], difficult=[False, True])
    detections = _detections([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 0], [0.9, 0.95])
    best = operating_point([detections], [truths], 1, steps=10)["overall"]["best"]
    assert best == pytest.approx({"confidence": 0.8, "precision": 1.0, "recall": 1.0, "f1": 1.0})


def test_a_split_without_objects_has_no_operating_point():
    result = operating_point([_detections([[0, 0, 1, 1]], [0], [0.5])], [_truth([], [])], 1, steps=10)
    assert result["overall"]["best"] is None and result["per_class"]["class0"]["absent"]

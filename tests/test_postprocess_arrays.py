"""Post-processing in numpy (:func:`ssd.arrays.postprocess_arrays`, the runtime without PyTorch): the detections
of :func:`ssd.postprocess.postprocess_detections` on random head outputs (equal scores and boxes included), and a
case computed by hand."""

import math

import numpy as np
import pytest
import torch

from ssd.arrays import object_scores, postprocess_arrays
from ssd.errors import InputError
from ssd.postprocess import postprocess_detections

VARIANCES = (0.1, 0.2)


def head_outputs(seed: int, ties: bool, batch: int = 3, num_priors: int = 300, num_classes: int = 4):
    """``(loc, logits, priors)``. With ``ties``: logits 0 or -200 (exp -200 is 0 in float32, so every softmax is
    1/n, the same bits in numpy and PyTorch: many equal scores), offsets in steps of 0.5 and the second half of
    the priors a copy of the first (equal boxes)."""
    rng = np.random.default_rng(seed)
    shape = (batch, num_priors, num_classes + 1)
    if ties:
        logits = np.where(rng.random(shape) < 0.4, 0, -200).astype(np.float32)
        loc = (rng.integers(-2, 3, (batch, num_priors, 4)) * 0.5).astype(np.float32)
    else:
        logits = rng.normal(0, 2, shape).astype(np.float32)
        loc = rng.normal(0, 1, (batch, num_priors, 4)).astype(np.float32)
    priors = rng.uniform(0.05, 0.9, (num_priors, 4)).astype(np.float32)  # boxes past the borders: clipped
    if ties:
        priors[num_priors // 2:] = priors[:num_priors - num_priors // 2]
    return loc, logits, priors


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("options", [
    dict(score_threshold=0.1, iou_threshold=0.5, max_detections=30, candidates_per_class=20),
    dict(score_threshold=0.3, iou_threshold=0.45, max_detections=500, candidates_per_class=400),
    dict(score_threshold=0.6, iou_threshold=0.3, max_detections=3, candidates_per_class=7, classes=[0, 2, 3]),
    dict(score_threshold=0.05, iou_threshold=0.6, max_detections=50, candidates_per_class=10, classes=[1]),
])
def test_numpy_post_processing_gives_the_detections_of_pytorch(options, ties):
    loc, logits, priors = head_outputs(seed=len(str(options)), ties=ties)
    got = postprocess_arrays(loc, object_scores(logits), priors, variances=VARIANCES, **options)
    expected = postprocess_detections(torch.from_numpy(loc), torch.from_numpy(logits), torch.from_numpy(priors),
                                      variances=VARIANCES, **options)
    assert len(got) == 3 and sum(len(d["labels"]) for d in got) > 5
    for a, b in zip(got, expected):
        assert a["labels"].dtype == np.int64 and a["scores"].dtype == a["boxes"].dtype == np.float32
        assert a["labels"].tolist() == b["labels"].tolist()  # same order, equal scores by label then prior
        np.testing.assert_allclose(a["scores"], b["scores"].numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(a["boxes"], b["boxes"].numpy(), rtol=0, atol=1e-6)


def hand_case():
    """Three priors of one image, two classes. Prior 1 overlaps prior 0 by IoU 0.036 / 0.044 = 0.82; prior 2's
    offsets move its centre by 1 x 0.1 x 0.1 and double its width (log 2 / 0.2)."""
    priors = np.array([[0.5, 0.5, 0.2, 0.2], [0.52, 0.5, 0.2, 0.2], [0.2, 0.2, 0.1, 0.1]], np.float32)
    loc = np.zeros((1, 3, 4), np.float32)
    loc[0, 2] = [1, 0, math.log(2) / 0.2, 0]
    scores = np.array([[[0.9, 0.05], [0.6, 0.3], [0.2, 0.7]]], np.float32)
    return loc, scores, priors


BOX = {0: [0.4, 0.4, 0.6, 0.6], 1: [0.42, 0.4, 0.62, 0.6], 2: [0.11, 0.15, 0.31, 0.25]}


@pytest.mark.parametrize("classes, max_detections, expected", [
    # class 0: prior 1 (0.6) drowned by prior 0 (0.9); class 1: prior 0's 0.05 below the threshold
    (None, 10, [(0.9, 0, 0), (0.7, 1, 2), (0.3, 1, 1), (0.2, 0, 2)]),
    (None, 3, [(0.9, 0, 0), (0.7, 1, 2), (0.3, 1, 1)]),
    ([1], 10, [(0.7, 1, 2), (0.3, 1, 1)]),
    ([1], 1, [(0.7, 1, 2)]),  # the filter before the cut: class 0's 0.9 takes no place
    ([0], 1, [(0.9, 0, 0)]),
])
def test_numpy_post_processing_of_a_case_computed_by_hand(classes, max_detections, expected):
    (got,) = postprocess_arrays(*hand_case(), score_threshold=0.1, iou_threshold=0.5, max_detections=max_detections,
                                variances=VARIANCES, classes=classes)
    assert got["scores"].tolist() == [np.float32(score) for score, _, _ in expected]
    assert got["labels"].tolist() == [label for _, label, _ in expected]
    np.testing.assert_allclose(got["boxes"], [BOX[prior] for _, _, prior in expected], rtol=0, atol=1e-7)


def test_a_crowd_of_equal_boxes_widens_the_candidates_that_enter_nms():
    """Ten copies of one box (scores 0.9 to 0.45) before another box (0.4): the best 2 x max_detections = 4
    candidates leave one detection, so the image's candidates are widened until the other box is reached."""
    priors = np.array([[0.3, 0.3, 0.2, 0.2]] * 10 + [[0.7, 0.7, 0.2, 0.2]], np.float32)
    scores = np.array([0.9 - 0.05 * i for i in range(10)] + [0.4], np.float32).reshape(1, 11, 1)
    (got,) = postprocess_arrays(np.zeros((1, 11, 4), np.float32), scores, priors, score_threshold=0.1,
                                iou_threshold=0.5, max_detections=2, variances=VARIANCES)
    assert got["scores"].tolist() == [np.float32(0.9), np.float32(0.4)] and got["labels"].tolist() == [0, 0]
    np.testing.assert_allclose(got["boxes"], [[0.2, 0.2, 0.4, 0.4], [0.6, 0.6, 0.8, 0.8]], rtol=0, atol=1e-7)


def test_no_score_above_the_threshold_gives_empty_arrays():
    got = postprocess_arrays(*hand_case(), score_threshold=0.95, iou_threshold=0.5, max_detections=10,
                             variances=VARIANCES)
    assert got[0]["boxes"].shape == (0, 4) and got[0]["scores"].shape == got[0]["labels"].shape == (0,)


def test_head_outputs_that_disagree_are_refused():
    loc, scores, priors = hand_case()
    with pytest.raises(InputError, match=r"^head outputs loc \[1, 3, 4\], scores \[1, 3, 2\] and priors \[2, 4\] do "
                                         r"not agree: loc \[B, P, 4\], scores \[B, P, K\], priors \[P, 4\]$"):
        postprocess_arrays(loc, scores, priors[:2], score_threshold=0.1, iou_threshold=0.5, max_detections=10,
                           variances=VARIANCES)

"""VOC and COCO metrics against hand-computed values."""

import math

import numpy as np
import pytest
import torch

from ssd.evaluation.coco import evaluate_coco
from ssd.evaluation.metrics import evaluate_voc, voc_ap
from ssd.inference.coco_results import to_coco_detections


def _t(rows, dtype=torch.float32):
    return torch.tensor(rows, dtype=dtype)


# Two images, classes A (0), B (1), C (2).
# Image 0: A g1 [0,0,10,10]; A g2 [20,20,30,30] difficult; A g3 [40,40,50,50].
# Image 1: A g4 [0,0,10,10]; A g5 [20,0,30,10]; B g6 [50,50,90,90].
GROUND_TRUTHS = [
    {"boxes": _t([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]), "labels": _t([0, 0, 0], torch.int64),
     "difficult": _t([False, True, False], torch.bool)},
    {"boxes": _t([[0, 0, 10, 10], [20, 0, 30, 10], [50, 50, 90, 90]]), "labels": _t([0, 0, 1], torch.int64),
     "difficult": _t([False, False, False], torch.bool)},
]
# Class A, by score: d1 .9 on g1 (TP); d2 .8 on g1 again (duplicate: FP); d3 .7 on difficult g2 (ignored);
# d4 .6 on g4 (TP); d5 .5 [25,0,35,10] vs g5: IoU 50/150 = 1/3 < .5 (FP); d6 .4 on g3 (TP); g5 missed.
# Class B: .95 on image 0 where there is no B (FP); .3 on g6 (TP).  Class C: one detection, no ground truth.
DETECTIONS = [
    {"boxes": _t([[0, 0, 10, 10], [0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50], [0, 0, 10, 10],
                  [60, 60, 70, 70]]),
     "scores": _t([0.9, 0.8, 0.7, 0.4, 0.95, 0.2]), "labels": _t([0, 0, 0, 0, 1, 2], torch.int64)},
    {"boxes": _t([[0, 0, 10, 10], [25, 0, 35, 10], [50, 50, 90, 90]]), "scores": _t([0.6, 0.5, 0.3]),
     "labels": _t([0, 0, 1], torch.int64)},
]
# A (4 non-difficult objects), ranked without d3: TP FP TP FP TP
#   recall    .25  .25  .5   .5   .75
#   precision 1    1/2  2/3  1/2  3/5      envelope: 1, 2/3, 2/3, 3/5, 3/5
#   VOC2010+: .25*1 + .25*2/3 + .25*3/5 = 17/30
#   VOC2007: t=0,.1,.2 -> 1; t=.3,.4,.5 -> 2/3; t=.6,.7 -> 3/5; t=.8,.9,1 -> 0: (3 + 2 + 1.2) / 11 = 6.2/11
# B (1 object): FP TP -> recall 0, 1; precision 0, 1/2 -> AP 1/2 in both variants.
# C: no ground truth -> AP nan, left out of the mean.
AP_A_12, AP_A_07, AP_B = 17 / 30, 6.2 / 11, 0.5


def test_voc2012_hand_computed():
    result = evaluate_voc(DETECTIONS, GROUND_TRUTHS, 3, ["A", "B", "C"], use_07_metric=False)
    a, b, c = (result["per_class"][n] for n in "ABC")
    assert a["ap"] == pytest.approx(AP_A_12)
    np.testing.assert_allclose(a["recall"], [0.25, 0.25, 0.5, 0.5, 0.75])
    np.testing.assert_allclose(a["precision"], [1, 1 / 2, 2 / 3, 1 / 2, 3 / 5])
    assert (a["num_gt"], a["num_det"]) == (4, 6)
    assert b["ap"] == pytest.approx(AP_B) and (b["num_gt"], b["num_det"]) == (1, 2)
    assert math.isnan(c["ap"]) and (c["num_gt"], c["num_det"]) == (0, 1)
    assert result["map"] == pytest.approx((AP_A_12 + AP_B) / 2)


def test_voc2007_hand_computed():
    result = evaluate_voc(DETECTIONS, GROUND_TRUTHS, 3, ["A", "B", "C"], use_07_metric=True)
    assert result["per_class"]["A"]["ap"] == pytest.approx(AP_A_07)
    assert result["per_class"]["B"]["ap"] == pytest.approx(AP_B)
    assert result["map"] == pytest.approx((AP_A_07 + AP_B) / 2)


def test_voc_ap_curves():
    recall, precision = [0.25, 0.25, 0.5, 0.5, 0.75], [1, 1 / 2, 2 / 3, 1 / 2, 3 / 5]
    assert voc_ap(recall, precision, use_07_metric=False) == pytest.approx(AP_A_12)
    assert voc_ap(recall, precision, use_07_metric=True) == pytest.approx(AP_A_07)
    assert voc_ap([], [], True) == 0.0
    assert voc_ap([1.0], [1.0], False) == 1.0
    with pytest.raises(ValueError, match="same length"):
        voc_ap([0.5, 1.0], [1.0], False)
    with pytest.raises(ValueError, match="non-decreasing"):
        voc_ap([0.5, 0.25], [1.0, 1.0], False)


def test_duplicate_goes_to_the_best_overlap_even_if_taken():
    # Devkit rule: each detection takes the object it overlaps most; if that one is taken it is a FP even when
    # another object overlaps it enough. Objects [0,0,10,10] and [0,1,10,11]; both detections on [0,0,10,10].
    gts = [{"boxes": _t([[0, 0, 10, 10], [0, 1, 10, 11]]), "labels": _t([0, 0], torch.int64)}]
    dets = [{"boxes": _t([[0, 0, 10, 10], [0, 0, 10, 10]]), "scores": _t([0.9, 0.8]),
             "labels": _t([0, 0], torch.int64)}]
    row = evaluate_voc(dets, gts, 1)["per_class"]["class0"]
    np.testing.assert_allclose(row["precision"], [1, 0.5])
    np.testing.assert_allclose(row["recall"], [0.5, 0.5])


def _perfect(seed=0, images=4, classes=3):
    g = torch.Generator().manual_seed(seed)
    gts, dets = [], []
    for _ in range(images):
        n = int(torch.randint(1, 6, (1,), generator=g))
        xy = torch.rand(n, 2, generator=g) * 300
        boxes = torch.cat([xy, xy + 20 + torch.rand(n, 2, generator=g) * 150], 1)
        labels = torch.randint(0, classes, (n,), generator=g)
        gts.append({"boxes": boxes, "labels": labels, "difficult": torch.zeros(n, dtype=torch.bool)})
        dets.append({"boxes": boxes.clone(), "labels": labels.clone(), "scores": torch.rand(n, generator=g)})
    return dets, gts


@pytest.mark.parametrize("use_07", [True, False])
def test_perfect_predictions_voc(use_07):
    dets, gts = _perfect()
    assert evaluate_voc(dets, gts, 3, use_07_metric=use_07)["map"] == pytest.approx(1.0)


def test_perfect_predictions_coco():
    dets, gts = _perfect()
    result = evaluate_coco(dets, gts, 3)
    for key in ("map", "AP", "AP50", "AP75"):
        assert result[key] == pytest.approx(1.0)


def test_coco_known_values():
    # One object [0,0,10,10] (area 100: small), one detection [0,0,10,8.2]: IoU .82 passes the thresholds
    # .50 .. .80 (7 of 10), each with precision 1 at every recall -> AP 7/10, AP50 = AP75 = 1; APm/APl undefined.
    gts = [{"boxes": _t([[0, 0, 10, 10]]), "labels": _t([0], torch.int64)}]
    dets = [{"boxes": _t([[0, 0, 10, 8.2]]), "scores": _t([0.9]), "labels": _t([0], torch.int64)}]
    result = evaluate_coco(dets, gts, 1)
    assert result["AP"] == pytest.approx(0.7)
    assert result["AP50"] == pytest.approx(1.0) and result["AP75"] == pytest.approx(1.0)
    assert result["APs"] == pytest.approx(0.7) and math.isnan(result["APm"]) and math.isnan(result["APl"])
    # Two objects, one found: precision 1 up to recall .5 -> 51 of the 101 recall points.
    gts = [{"boxes": _t([[0, 0, 10, 10], [20, 20, 30, 30]]), "labels": _t([0, 0], torch.int64)}]
    dets = [{"boxes": _t([[0, 0, 10, 10]]), "scores": _t([0.9]), "labels": _t([0], torch.int64)}]
    result = evaluate_coco(dets, gts, 1, ["thing"])
    assert result["AP50"] == pytest.approx(51 / 101)
    assert result["per_class"]["thing"]["ap"] == pytest.approx(51 / 101)
    np.testing.assert_allclose(result["per_class"]["thing"]["precision"], [1.0] * 51 + [0.0] * 50, atol=1e-12)


def test_coco_difficult_is_an_ignore_region():
    # The highest-scoring detection sits on a difficult object: ignored, so the other one gives AP 1.
    gts = [{"boxes": _t([[0, 0, 40, 40], [50, 50, 90, 90]]), "labels": _t([0, 0], torch.int64),
            "difficult": _t([False, True], torch.bool)}]
    dets = [{"boxes": _t([[50, 50, 90, 90], [0, 0, 40, 40]]), "scores": _t([0.9, 0.8]),
             "labels": _t([0, 0], torch.int64)}]
    assert evaluate_coco(dets, gts, 1)["AP"] == pytest.approx(1.0)
    assert evaluate_voc(dets, gts, 1)["map"] == pytest.approx(1.0)


def test_empty_detections_give_zero():
    _, gts = _perfect()
    empty = [{"boxes": torch.zeros(0, 4), "scores": torch.zeros(0), "labels": torch.zeros(0, dtype=torch.int64)}] * 4
    assert evaluate_voc(empty, gts, 3)["map"] == 0.0
    assert evaluate_voc(empty, gts, 3, use_07_metric=True)["map"] == 0.0
    assert evaluate_coco(empty, gts, 3)["map"] == 0.0


def test_classes_without_ground_truth_are_left_out():
    dets, gts = _perfect(classes=2)
    result = evaluate_voc(dets, gts, 5)  # classes 2..4 have no objects
    assert result["map"] == pytest.approx(1.0)
    assert all(math.isnan(result["per_class"][f"class{k}"]["ap"]) for k in (2, 3, 4))
    no_objects = [{"boxes": [], "labels": []}]
    assert math.isnan(evaluate_voc([{"boxes": [], "scores": [], "labels": []}], no_objects, 2)["map"])
    one = [{"boxes": [[0, 0, 5, 5]], "scores": [0.5], "labels": [1]}]
    assert math.isnan(evaluate_voc(one, no_objects, 2)["map"])
    assert math.isnan(evaluate_coco(one, no_objects, 2)["map"])


def test_bad_inputs_are_named():
    dets, gts = _perfect()
    with pytest.raises(ValueError, match="4 detection entries but 3 ground-truth"):
        evaluate_voc(dets, gts[:3], 3)
    bad = [dict(g) for g in gts]
    bad[2]["labels"] = bad[2]["labels"].clone()
    bad[2]["labels"][0] = 3
    with pytest.raises(ValueError, match="ground truths of image 2, object 0: label 3 is out of range for num_classes"):
        evaluate_voc(dets, bad, 3)
    with pytest.raises(ValueError, match="2 class names for num_classes=3"):
        evaluate_coco(dets, gts, 3, ["a", "b"])


def test_to_coco_detections():
    dets = [{"boxes": _t([[10, 20, 40, 60]]), "scores": _t([0.5]), "labels": _t([1], torch.int64),
             "image_id": "img7"}]
    assert to_coco_detections(dets) == [{"image_id": "img7", "category_id": 1, "bbox": [10.0, 20.0, 30.0, 40.0],
                                         "score": 0.5}]
    out = to_coco_detections(dets, image_ids=[42], category_ids={1: 18})
    assert (out[0]["image_id"], out[0]["category_id"]) == (42, 18)
    assert to_coco_detections(dets, category_ids=[5, 9])[0]["category_id"] == 9

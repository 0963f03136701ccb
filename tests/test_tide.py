"""Error breakdown in the TIDE classes: counts and dAP on a hand-built detection set, and against tidecv."""

import pytest
import torch

from builders import jittered_detections
from ssd.data import load_dataset
from ssd.evaluation.results import ground_truths_from_records
from ssd.evaluation.tide import DETECTION_TYPES, OBJECT_STATES, error_breakdown


def _rows(boxes, labels, **extra):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels),
            **{k: torch.tensor(v) for k, v in extra.items()}}


# One image, classes cat (0) and dog (1). Objects: G1 cat, G2 dog, G3 cat, G4 cat (nothing near it), G5 cat.
OBJECTS = [[0, 0, 20, 20], [50, 0, 70, 20], [100, 0, 120, 20], [0, 100, 20, 120], [0, 50, 20, 70]]
OBJECT_LABELS = [0, 1, 0, 0, 0]
# D1 cat on G1 (TP), D2 cat on G1 again (duplicate), D3 cat on dog G2 (classification), D4 cat on G3 at IoU 0.4
# (localization), D5 dog on cat G3 at IoU 0.4 (both), D6 cat on nothing (background), D7 cat on G5 (TP).
DETECTIONS = [[0, 0, 20, 20], [0, 0, 20, 20], [50, 0, 70, 20], [100, 0, 120, 8], [100, 0, 120, 8],
              [150, 150, 170, 170], [0, 50, 20, 70]]
DETECTION_LABELS = [0, 0, 0, 0, 1, 0, 0]
SCORES = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]


def test_one_error_of_each_kind_with_hand_computed_dap():
    """VOC area AP at IoU 0.5, mAP over cat and dog. As is: cat ranks TP FP FP FP FP TP over 4 objects -> AP 1/4 +
    1/4 * 1/3 = 1/3; dog: one FP -> 0; mAP 1/6. Fixing: duplicate or background (one FP fewer before the last TP):
    cat 1/4 + 1/4 * 2/5 = 0.35 -> dAP 1/120 each; both: dog has still nothing -> 0; classification: D3 becomes the
    dog TP (dog AP 1) and leaves cat's ranking (0.35) -> mAP 0.675, dAP 61/120; localization: D4 a TP at rank 4 ->
    cat 1/4 + 1/4 * 1/2 + 1/4 * 1/2 = 1/2, dAP 1/12; missed: G4 removed -> cat 1/3 + 1/3 * 1/3 = 4/9, dAP 1/18."""
    truths = [_rows(OBJECTS, OBJECT_LABELS, difficult=[False] * 5)]
    detections = [_rows(DETECTIONS, DETECTION_LABELS, scores=SCORES)]
    result = error_breakdown(detections, truths, 2, ["cat", "dog"])
    assert result["map"] == pytest.approx(1 / 6)
    assert {k: v["count"] for k, v in result["errors"].items()} == {
        "classification": 1, "localization": 1, "both": 1, "duplicate": 1, "background": 1, "missed": 1}
    assert {k: v["dap"] for k, v in result["errors"].items()} == pytest.approx({
        "classification": 61 / 120, "localization": 1 / 12, "both": 0.0, "duplicate": 1 / 120,
        "background": 1 / 120, "missed": 1 / 18})
    assert [DETECTION_TYPES[c] for c in result["detection_type"][0].tolist()] == [
        "true_positive", "duplicate", "classification", "localization", "both", "background", "true_positive"]
    assert [OBJECT_STATES[c] for c in result["object_state"][0].tolist()] == [
        "found", "mistaken", "mistaken", "missed", "found"]
    assert result["localization_targets"][0].tolist() == [False, False, True, False, False]


def test_only_the_best_error_of_an_untaken_object_is_turned_into_a_hit():
    """Two localization errors on one cat: fixing makes the higher-scoring one the TP and removes the other:
    AP 1 (one object, found first)."""
    truths = [_rows([[0, 0, 20, 20]], [0], difficult=[False])]
    detections = [_rows([[0, 0, 20, 8], [0, 0, 8, 20]], [0, 0], scores=[0.6, 0.7])]
    result = error_breakdown(detections, truths, 1)
    assert result["errors"]["localization"] == {"count": 2, "dap": pytest.approx(1.0)}
    assert result["errors"]["missed"]["count"] == 0


def test_detections_on_difficult_objects_are_no_errors():
    truths = [_rows([[0, 0, 20, 20]], [0], difficult=[True])]
    detections = [_rows([[0, 0, 20, 20], [0, 0, 20, 9]], [0, 0], scores=[0.9, 0.8])]
    result = error_breakdown(detections, truths, 1)
    assert [DETECTION_TYPES[c] for c in result["detection_type"][0].tolist()] == ["ignored", "background"]
    assert result["object_state"][0].tolist() == [OBJECT_STATES.index("ignored")]


def _tidecv_breakdown(truths, detections):
    """Counts and dAP (fractions) of the reference implementation, tidecv (boxes xyxy, as tidecv-light takes)."""
    tidecv = pytest.importorskip("tidecv", reason="tidecv not installed (pip install tidecv-light)")
    from tidecv.errors import main_errors as kinds

    names = {kinds.ClassError: "classification", kinds.BoxError: "localization", kinds.OtherError: "both",
             kinds.DuplicateError: "duplicate", kinds.BackgroundError: "background", kinds.MissedError: "missed"}
    gt, pred = tidecv.Data("gt"), tidecv.Data("pred")
    for i, (truth, found) in enumerate(zip(truths, detections)):
        for box, label in zip(truth["boxes"].tolist(), truth["labels"].tolist()):
            gt.add_ground_truth(i, label, box)
        for box, label, score in zip(found["boxes"].tolist(), found["labels"].tolist(), found["scores"].tolist()):
            pred.add_detection(i, label, score, box)
    run = tidecv.TIDE().evaluate(gt, pred, mode=tidecv.TIDE.BOX)
    fixed = run.fix_main_errors()
    return {name: {"count": len(run.error_dict[kind]), "dap": fixed[kind] / 100} for kind, name in names.items()}


def test_hand_built_errors_agree_with_tidecv():
    truths = [_rows(OBJECTS, OBJECT_LABELS, difficult=[False] * 5)]
    detections = [_rows(DETECTIONS, DETECTION_LABELS, scores=SCORES)]
    reference = _tidecv_breakdown(truths, detections)
    ours = error_breakdown(detections, truths, 2)["errors"]
    assert {k: v["count"] for k, v in ours.items()} == {k: v["count"] for k, v in reference.items()}


def test_errors_on_aquarium_agree_with_tidecv(shared_data):
    """Synthetic detections of Aquarium's val split: the same count of every error type as tidecv; dAP within 0.5
    mAP points (TIDE interpolates AP at 101 recall points, the library integrates the VOC area)."""
    spec = load_dataset(shared_data / "aquarium", split="val")
    truths = ground_truths_from_records(spec.splits["val"])
    detections = jittered_detections(truths, len(spec.class_names), seed=3)
    reference = _tidecv_breakdown(truths, detections)
    ours = error_breakdown(detections, truths, len(spec.class_names))["errors"]
    assert {k: v["count"] for k, v in ours.items()} == {k: v["count"] for k, v in reference.items()}
    assert ours["classification"]["count"] > 50 and ours["background"]["count"] > 50
    for name in ours:
        assert ours[name]["dap"] == pytest.approx(reference[name]["dap"], abs=0.005), name

"""The operating point kept with the model: training's validation computes the best-F1 confidence, checkpoints and
exported artifacts carry it, and predict uses it as its default confidence (an explicit one wins)."""

import json

import pytest
import torch

from builders import biased_model, random_images
from ssd.cli import main
from ssd.errors import CheckpointError
from ssd.export.onnx import export_onnx
from ssd.export.pt2 import export_pt2
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.detector import Detector, load
from ssd.models.load import model_from_checkpoint
from ssd.settings import PREDICT
from ssd.training.state import validation_operating_point
from ssd.weights.checkpoint import check_operating_point, load_checkpoint, save_checkpoint

POINT = {"score_threshold": 0.31, "precision": 0.8, "recall": 0.6, "f1": 0.685, "split": "val"}
FROM_MODEL = "the model's best-F1 confidence on its val split"


@pytest.fixture(scope="module")
def tiny():
    return biased_model("ssd_tiny")


@pytest.fixture(scope="module")
def weights(tiny, tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("point") / "best.pt", tiny, operating_point=POINT)


def test_validation_operating_point_of_one_hit_and_one_false_positive():
    """One object found at 0.9 and a false positive at 0.6: F1 is 1 for thresholds from 0.6 up to (not including)
    0.9, so the best point is the last grid confidence below 0.9, 0.899, with P = R = F1 = 1: used as a threshold
    (scores strictly above it kept), it keeps the hit and drops the false positive."""
    detections = [{"boxes": torch.tensor([[10.0, 10, 50, 50], [60, 60, 90, 90]]), "scores": torch.tensor([0.9, 0.6]),
                   "labels": torch.tensor([0, 0])}]
    truths = [{"boxes": torch.tensor([[10.0, 10, 50, 50]]), "labels": torch.tensor([0]),
               "difficult": torch.tensor([False])}]
    point = validation_operating_point({"detections": detections, "ground_truths": truths}, ["cat"])
    assert point == {"score_threshold": 0.899, "precision": 1.0, "recall": 1.0, "f1": 1.0, "split": "val"}
    assert (detections[0]["scores"] > point["score_threshold"]).tolist() == [True, False]
    empty = [{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.long),
              "difficult": torch.zeros(0, dtype=torch.bool)}]
    assert validation_operating_point({"detections": detections, "ground_truths": empty}, ["cat"]) is None
    elsewhere = [{"boxes": torch.tensor([[100.0, 100, 120, 120]]), "labels": torch.tensor([0]),
                  "difficult": torch.tensor([False])}]  # no detection hits it: F1 is 0 at every confidence
    assert validation_operating_point({"detections": detections, "ground_truths": elsewhere}, ["cat"]) is None


@pytest.mark.parametrize("value, shown", [
    ({**POINT, "score_threshold": 1.0}, "1.0"),
    ({**POINT, "recall": -0.1}, "-0.1"),
    ({**POINT, "split": 3}, "'split': 3"),
    ({k: v for k, v in POINT.items() if k != "f1"}, "'recall': 0.6, 'split'"),
    (0.31, "got 0.31"),
])
def test_a_bad_operating_point_is_refused_naming_the_rule(value, shown):
    with pytest.raises(CheckpointError, match=r"^best\.pt: operating_point must be a dict of score_threshold in "
                                              r"\[0, 1\), precision, recall, f1 in \[0, 1\] and split") as error:
        check_operating_point(value, "best.pt")
    assert shown in str(error.value)


def test_checkpoint_operating_point_is_the_detector_default(tiny, weights):
    assert load_checkpoint(weights)["operating_point"] == POINT
    detector = load(weights)
    assert detector.backend.card.operating_point == POINT
    assert detector.confidence() == (0.31, FROM_MODEL)
    assert detector.confidence(0.5, "--conf") == (0.5, "--conf")
    images = random_images(2)
    stored = detector.predict(images)
    explicit = detector.predict(images, score_threshold=0.31)
    assert [r.scores.tolist() for r in stored] == [r.scores.tolist() for r in explicit]
    assert min(s for r in stored for s in r.scores.tolist()) > 0.31
    higher = detector.predict(images, score_threshold=0.513)  # an explicit threshold wins
    assert sum(len(r.scores) for r in higher) < sum(len(r.scores) for r in stored)
    assert min(s for r in higher for s in r.scores.tolist()) > 0.513

    plain = Detector(tiny)  # no stored point: the settings default
    assert plain.backend.card.operating_point is None
    assert plain.confidence() == (PREDICT.score_threshold, "default")


def test_ssd_predict_and_detector_predict_give_the_same_detections_on_one_checkpoint(weights):
    """Both read the default confidence from the model card: the checkpoint's operating point."""
    model = model_from_checkpoint(weights)
    assert model.card.operating_point == POINT and model.card.confidence() == (0.31, FROM_MODEL)
    images = random_images(3)
    ours, theirs = model.predict(images), load(weights).predict(images)
    assert sum(len(d["scores"]) for d in ours) > 0
    for a, b in zip(ours, theirs):
        assert torch.equal(a["labels"], b.labels) and a["names"] == b.names
        torch.testing.assert_close(a["scores"], b.scores)
        torch.testing.assert_close(a["boxes"], b.boxes)
    assert min(s for d in ours for s in d["scores"].tolist()) > 0.31


@pytest.mark.slow
def test_onnx_and_pt2_exports_carry_the_operating_point(weights, tmp_path):
    onnx_path = export_onnx(weights, tmp_path / "best.onnx", check=False)
    backend = OnnxBackend(onnx_path)
    assert backend.card.operating_point == POINT
    assert load(onnx_path).confidence() == (0.31, FROM_MODEL)
    assert load(export_pt2(weights, tmp_path / "best.pt2")).backend.card.operating_point == POINT

    unpointed = export_onnx(biased_model("ssd_tiny"), tmp_path / "plain.onnx", check=False)
    assert OnnxBackend(unpointed).card.operating_point is None


def test_predict_prints_the_threshold_and_where_it_came_from(tiny, weights, tmp_path, capsys):
    from PIL import Image

    image = tmp_path / "a.png"
    Image.fromarray(random_images(1)[0].permute(1, 2, 0).numpy()).save(image)
    run = ["predict", "--weights", str(weights), "--source", str(image), "--device", "cpu"]
    assert main([*run, "--save-dir", str(tmp_path / "p1")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"conf 0.31 ({FROM_MODEL})"
    assert main([*run, "--save-dir", str(tmp_path / "p2"), "--conf", "0.4"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "conf 0.4 (--conf)"
    scores = [d["score"] for d in json.loads((tmp_path / "p2" / "predictions.json").read_text())["images"][0]
              ["detections"]]
    assert scores and min(scores) > 0.4

    plain = save_checkpoint(tmp_path / "plain.pt", tiny)
    assert main(["predict", "--weights", str(plain), "--source", str(image), "--device", "cpu",
                 "--save-dir", str(tmp_path / "p3")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"conf {PREDICT.score_threshold:g} (default)"


@pytest.mark.slow
def test_opencv_and_openvino_backends_read_the_operating_point(weights, tmp_path):
    pytest.importorskip("openvino", reason="the OpenVINO backend needs the openvino package")
    from ssd.export import export
    from ssd.inference.backends.opencv import OpenCvBackend
    from ssd.inference.backends.openvino import OpenVinoBackend

    onnx_path = export(weights, "onnx", out_path=tmp_path / "best.onnx")
    assert OpenCvBackend(onnx_path).card.operating_point == POINT
    folder = export(weights, "openvino", out_path=tmp_path / "best_openvino")
    assert OpenVinoBackend(folder).card.operating_point == POINT
    assert load(folder).confidence() == (0.31, FROM_MODEL)


@pytest.mark.slow
def test_an_nms_export_defaults_to_the_higher_of_its_graph_threshold_and_the_models(tiny, tmp_path):
    low = save_checkpoint(tmp_path / "low.pt", tiny, operating_point={**POINT, "score_threshold": 0.1})
    graph = load(export_onnx(low, tmp_path / "low_nms.onnx", nms=True, check=False, score_threshold=0.2))
    assert graph.backend.card.operating_point["score_threshold"] == 0.1
    assert graph.confidence() == (0.2, "the NMS graph's threshold, above the model's 0.1")
    assert len(graph.predict(random_images(1))[0].scores) > 0

    high = save_checkpoint(tmp_path / "high.pt", tiny, operating_point=POINT)
    graph = load(export_onnx(high, tmp_path / "high_nms.onnx", nms=True, check=False, score_threshold=0.2))
    assert graph.confidence() == (0.31, FROM_MODEL)
    assert min(graph.predict(random_images(1))[0].scores.tolist()) > 0.31

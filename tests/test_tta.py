"""Test-time augmentation: views made and undone exactly (a mirrored image's box lands back where it belongs, a
shrunk view's box is divided by its scale), weighted box fusion by hand and against ``ensemble-boxes``, and
``--tta`` on ``ssd val`` / ``ssd predict`` / ``Detector.predict``."""

import json

import pytest
import torch
from PIL import Image

from builders import biased_model
from ssd.card import ModelCard
from ssd.cli import main
from ssd.data.synthetic import SHAPE_NAMES
from ssd.detect import detect_batch
from ssd.errors import ConfigError
from ssd.evaluation.evaluator import evaluate
from ssd.inference.detector import Detector, load
from ssd.inference.tta import TTA_VIEWS, detect_tta, fuse_boxes, view_batch
from ssd.preprocess import preprocess
from ssd.schemas import ValConfig
from ssd.weights.checkpoint import save_checkpoint

FIXED = (0.25, 0.125, 0.5, 0.625)  # xyxy normalized to the network input; exact in binary floating point


class FixedBox:
    """A backend with one prior, ``FIXED``, scored as class 1 with zero offsets: every input yields that box."""

    def __init__(self, size: int = 64):
        x0, y0, x1, y1 = FIXED
        self.priors = torch.tensor([[(x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0]])
        self.card = ModelCard(None, ("a", "b"), (size, size), (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), (0.1, 0.2))
        self.device = torch.device("cpu")

    def __call__(self, batch):
        logits = torch.tensor([[[-9.0, -9.0, 9.0]]]).expand(len(batch), 1, 3)
        return torch.zeros(len(batch), 1, 4), logits


OPTIONS = dict(score_threshold=0.1, iou_threshold=0.45, max_detections=10)


def run_views(views, width=200, height=80):
    backend = FixedBox()
    batch, sizes = preprocess([torch.zeros(3, height, width, dtype=torch.uint8)], 64, (0, 0, 0), (1, 1, 1))
    return detect_tta(lambda b, s: detect_batch(backend, b, s, **OPTIONS), batch, sizes, views=views, **OPTIONS)[0]


def test_views_are_mirrored_and_shrunk_into_the_top_left():
    batch = torch.arange(2 * 3 * 4 * 4, dtype=torch.float32).reshape(2, 3, 4, 4)
    mirrored, scale = view_batch(batch, 1.0, True)
    assert scale == (1.0, 1.0) and torch.equal(mirrored, batch[..., [3, 2, 1, 0]])
    shrunk, scale = view_batch(torch.ones(1, 3, 8, 10), 0.5, False)
    assert scale == (0.5, 0.5) and shrunk.shape == (1, 3, 8, 10)
    assert torch.equal(shrunk[..., :4, :5], torch.ones(1, 3, 4, 5)) and shrunk.sum() == 3 * 4 * 5  # the rest: zero
    assert view_batch(torch.ones(1, 3, 64, 64), 0.8, False)[1] == (51 / 64, 51 / 64)  # whole pixels: 51.2 -> 51


def test_a_mirrored_views_box_is_mirrored_back_onto_the_image():
    # the network sees the mirror image and finds FIXED there: x 50..100 of 200 mirrored is 100..150 of the image
    found = run_views([(1.0, True)])
    assert found["boxes"].tolist() == [[100.0, 10.0, 150.0, 50.0]] and found["labels"].tolist() == [1]
    assert found["scores"].tolist() == pytest.approx([1.0])  # one view of one: its own score


def test_a_shrunk_views_box_is_divided_by_its_scale_and_clipped():
    # half the input: FIXED / 0.5 = (0.5, 0.25, 1.0, 1.25) of the image, clipped at its bottom border
    assert run_views([(0.5, False)])["boxes"].tolist() == [[100.0, 20.0, 200.0, 80.0]]


def test_the_default_views_give_three_boxes_each_a_third_as_sure():
    """Plain (50, 10, 100, 50), mirrored back (100, 10, 150, 50), shrunk to 51/64: FIXED * 64/51 of the image; none
    overlaps another above 0.45, so each is its own cluster, found by one view of three."""
    found = run_views(TTA_VIEWS)
    shrunk = [v * 64 / 51 * side for v, side in zip(FIXED, (200, 80, 200, 80))]
    torch.testing.assert_close(found["boxes"], torch.tensor([[50.0, 10.0, 100.0, 50.0], [100.0, 10.0, 150.0, 50.0],
                                                             shrunk]))
    torch.testing.assert_close(found["scores"], torch.full((3,), 1 / 3))


def test_a_box_symmetric_about_the_middle_fuses_with_its_mirror():
    found = run_views([(1.0, False), (1.0, True)], width=128, height=80)  # FIXED mirrored on 128: x 64..96
    assert found["boxes"].tolist() == [[32.0, 10.0, 64.0, 50.0], [64.0, 10.0, 96.0, 50.0]]
    symmetric = run_views([(1.0, False), (1.0, True)], width=96, height=80)  # plain 24..48, mirrored 48..72
    assert len(symmetric["boxes"]) == 2  # IoU 0: two clusters
    assert symmetric["scores"].tolist() == pytest.approx([0.5, 0.5])


BOXES = torch.tensor([[0.0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 10]])
SCORES = torch.tensor([0.9, 0.6, 0.3, 0.8])
LABELS = torch.tensor([0, 0, 0, 1])
OWNER = torch.tensor([0, 0, 0, 1])


def test_weighted_box_fusion_by_hand():
    """Image 0: boxes 0 and 1 overlap with IoU 90/110 > 0.5: one box, x0 = (0.9*0 + 0.6*1)/1.5 = 0.4,
    x1 = (0.9*10 + 0.6*11)/1.5 = 10.4, scored 1.5/2 * min(2, 2)/2 = 0.75; box 2 alone: 0.3 * 1/2 = 0.15, below
    the threshold 0.2. Image 1: its one box at 0.8 / 2 = 0.4."""
    fused = fuse_boxes(BOXES, SCORES, LABELS, OWNER, num_images=3, num_views=2, score_threshold=0.2,
                       iou_threshold=0.5, max_detections=5)
    torch.testing.assert_close(fused[0]["boxes"], torch.tensor([[0.4, 0.0, 10.4, 10.0]]))
    torch.testing.assert_close(fused[0]["scores"], torch.tensor([0.75]))
    assert fused[1]["boxes"].tolist() == [[0.0, 0.0, 10.0, 10.0]] and fused[1]["labels"].tolist() == [1]
    torch.testing.assert_close(fused[1]["scores"], torch.tensor([0.4]))
    assert [len(f["boxes"]) for f in fused] == [1, 1, 0]
    low = fuse_boxes(BOXES, SCORES, LABELS, OWNER, num_images=2, num_views=2, score_threshold=0.1,
                     iou_threshold=0.5, max_detections=1)
    assert low[0]["scores"].tolist() == pytest.approx([0.75])  # 0.15 kept at 0.1, then cut by max_detections 1
    apart = fuse_boxes(BOXES, SCORES, LABELS, OWNER, num_images=2, num_views=2, score_threshold=0.0,
                       iou_threshold=0.9, max_detections=5)  # IoU 0.82 is not above 0.9: no fusion
    assert apart[0]["scores"].tolist() == pytest.approx([0.45, 0.3, 0.15])


def test_a_box_joins_the_best_leader_it_overlaps_not_the_closest():
    """Leaders 0 (0.9) and 1 (0.8) overlap 10/190; box 2 overlaps leader 0 by 50/150 and leader 1 by 60/140, both
    above 0.3: it joins leader 0, the one that suppressed it (greedy NMS's cluster)."""
    boxes = torch.tensor([[0.0, 0, 10, 10], [0, 9, 10, 19], [0, 5, 10, 15]])
    fused = fuse_boxes(boxes, torch.tensor([0.9, 0.8, 0.5]), torch.zeros(3, dtype=torch.int64),
                       torch.zeros(3, dtype=torch.int64), num_images=1, num_views=3, score_threshold=0.0,
                       iou_threshold=0.3, max_detections=5)[0]
    torch.testing.assert_close(fused["boxes"], torch.tensor([[0.0, 5 * 0.5 / 1.4, 10, (0.9 * 10 + 0.5 * 15) / 1.4],
                                                            [0.0, 9, 10, 19]]))
    torch.testing.assert_close(fused["scores"], torch.tensor([0.7 * 2 / 3, 0.8 / 3]))


def test_fusion_agrees_with_ensemble_boxes_where_clusters_are_unambiguous():
    wbf = pytest.importorskip("ensemble_boxes").weighted_boxes_fusion
    mine = fuse_boxes(BOXES[:3] / 100, SCORES[:3], LABELS[:3], OWNER[:3], num_images=1, num_views=2,
                      score_threshold=0.0, iou_threshold=0.5, max_detections=5)[0]
    boxes, scores, labels = wbf([(BOXES[[0, 2]] / 100).tolist(), (BOXES[[1]] / 100).tolist()],
                                [[0.9, 0.3], [0.6]], [[0, 0], [0]], iou_thr=0.5, skip_box_thr=0.0)
    torch.testing.assert_close(mine["boxes"], torch.tensor(boxes, dtype=torch.float32))
    torch.testing.assert_close(mine["scores"], torch.tensor(scores, dtype=torch.float32))
    assert mine["labels"].tolist() == labels.astype(int).tolist()


def test_nothing_found_gives_empty_results():
    empty = fuse_boxes(torch.zeros(0, 4), torch.zeros(0), torch.zeros(0, dtype=torch.int64),
                       torch.zeros(0, dtype=torch.int64), num_images=2, num_views=3, **OPTIONS)
    assert [len(e["boxes"]) for e in empty] == [0, 0]


def test_detector_predict_with_tta_matches_the_views_by_hand():
    detector = Detector(FixedBox())
    image = torch.zeros(3, 80, 200, dtype=torch.uint8)
    plain, augmented = (detector.predict([image, image], score_threshold=0.1, tta=tta) for tta in (False, True))
    assert plain[0].boxes.tolist() == [[50.0, 10.0, 100.0, 50.0]]
    for result in augmented:
        torch.testing.assert_close(result.boxes, run_views(TTA_VIEWS)["boxes"])
        assert result.names == ["b", "b", "b"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    model = biased_model("ssd_tiny", class_names=list(SHAPE_NAMES[:3]))
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", model)


@pytest.mark.slow
def test_val_and_predict_take_tta(weights, synthetic_voc, tmp_path):
    plain = evaluate(weights, synthetic_voc, device="cpu")
    augmented = evaluate(weights, synthetic_voc, device="cpu", tta=True)
    assert 0 <= augmented["map"] <= 1 and len(augmented["detections"]) == len(plain["detections"]) == 16
    assert any(a["boxes"].shape != p["boxes"].shape or not torch.equal(a["boxes"], p["boxes"])
               for a, p in zip(augmented["detections"], plain["detections"]))
    image = tmp_path / "image.png"
    Image.fromarray(torch.randint(0, 256, (90, 120, 3), dtype=torch.uint8).numpy()).save(image)
    args = ["predict", "--weights", str(weights), "--source", str(image), "--device", "cpu", "--save-dir",
            str(tmp_path / "out"), "--no-save-images", "--conf", "0.3", "--tta"]
    assert main(args) == 0
    written = json.loads((tmp_path / "out" / "predictions.json").read_text())["images"][0]["detections"]
    api = load(weights, device="cpu").predict(str(image), score_threshold=0.3, tta=True)[0]
    torch.testing.assert_close(torch.tensor([d["box"] for d in written]).reshape(-1, 4), api.boxes)


def test_cli_val_passes_tta_on(monkeypatch):
    import ssd.evaluation.evaluator
    import ssd.evaluation.report

    calls = []
    monkeypatch.setattr(ssd.evaluation.evaluator, "evaluate", lambda *args, **kwargs: calls.append(kwargs) or {
        "map": 0.5, "per_class": {"a": {"ap": 0.5, "num_gt": 2, "num_det": 3}}, "metric": "voc07",
        "class_names": ["a"], "report": {}})
    monkeypatch.setattr(ssd.evaluation.report, "format_report", lambda report: "")
    assert main(["val", "--weights", "w.pt", "--data", "d", "--tta", "--no-save"]) == 0
    assert main(["val", "--weights", "w.pt", "--data", "d", "--no-save"]) == 0
    assert [call["tta"] for call in calls] == [True, False]


def test_tta_with_a_file_of_detections_is_refused():
    with pytest.raises(ConfigError, match="--tta augments a model's input"):
        ValConfig(detections="d.json", data="d", tta=True)

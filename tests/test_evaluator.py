"""evaluate_split with a fake detector whose priors are the ground-truth boxes (zero offsets decode onto them);
evaluate on a checkpoint, its run directory and its ONNX export."""

import json
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from builders import biased_model
from ssd.boxes import xyxy_to_cxcywh
from ssd.data.synthetic import SHAPE_NAMES
from ssd.evaluation.evaluator import (
    evaluate,
    evaluate_split,
    format_table,
    save_coco_json,
    score_detections,
)
from ssd.evaluation.gather import gather_on_main, merge_results, pack_results, unpack_results
from ssd.export.onnx import export_onnx
from ssd.settings import EVALUATE
from ssd.weights.checkpoint import save_checkpoint

CLASS_NAMES = ["cat", "dog"]
# Two images (orig (h, w) = (100, 200) and (50, 50)), boxes normalized xyxy; the last object of image 1 is difficult
# and never detected, the last row of image 0 is padding.
GT_BOXES = torch.tensor([[[0.1, 0.2, 0.5, 0.6], [0.6, 0.1, 0.9, 0.5], [0, 0, 0, 0]],
                         [[0.2, 0.2, 0.8, 0.8], [0.0, 0.0, 0.3, 0.3], [0.5, 0.5, 0.7, 0.9]]])
GT_LABELS = torch.tensor([[0, 1, -1], [1, 0, 0]])
DIFFICULT = torch.tensor([[False, False, False], [False, False, True]])
ORIG_SIZES = torch.tensor([[100, 200], [50, 50]])


class FakeDetector(nn.Module):
    """Priors = every detected object's box; image ``i`` (its pixels hold ``i``) scores its own objects' priors
    as their class and everything else as background."""

    def __init__(self):
        super().__init__()
        keep = (GT_LABELS >= 0) & ~DIFFICULT
        self.register_buffer("priors", xyxy_to_cxcywh(GT_BOXES[keep]))
        owner = keep.nonzero()[:, 0]
        logits = torch.full((2, len(owner), 3), -10.0)
        logits[..., 0] = 10.0
        logits[owner, torch.arange(len(owner)), 0] = -10.0
        logits[owner, torch.arange(len(owner)), GT_LABELS[keep] + 1] = 10.0
        self.register_buffer("table", logits)
        self.class_names = CLASS_NAMES
        self.config = SimpleNamespace(variances=(0.1, 0.2))

    def forward(self, images):
        index = images[:, 0, 0, 0].long()
        return self.priors.new_zeros(len(images), self.priors.shape[0], 4), self.table[index]


def _loader(batch_size):
    images = torch.arange(2.0)[:, None, None, None].expand(2, 3, 8, 8)
    return [{"images": images[i:i + batch_size], "boxes": GT_BOXES[i:i + batch_size],
             "labels": GT_LABELS[i:i + batch_size], "difficult": DIFFICULT[i:i + batch_size],
             "orig_sizes": ORIG_SIZES[i:i + batch_size], "paths": [f"img{j}.jpg" for j in range(i, i + batch_size)],
             "image_ids": [f"img{j}" for j in range(i, i + batch_size)]} for i in range(0, 2, batch_size)]


@pytest.mark.parametrize("metric", ["voc07", "voc", "coco"])
@pytest.mark.parametrize("batch_size", [1, 2])
def test_perfect_fake_model(metric, batch_size):
    model = FakeDetector().train()
    result = evaluate_split(model, _loader(batch_size), metric=metric, progress=False)
    assert model.training  # mode restored
    assert result["metric"] == metric
    assert result["map"] == pytest.approx(1.0)
    assert {n: result["per_class"][n]["num_gt"] for n in CLASS_NAMES} == {"cat": 2, "dog": 2}
    assert {n: result["per_class"][n]["num_det"] for n in CLASS_NAMES} == {"cat": 2, "dog": 2}


def test_pixels_and_raw_detections():
    result = evaluate_split(FakeDetector(), _loader(2), progress=False)
    first, second = result["detections"]
    # image 0 is 200 wide, 100 high: [0.1, 0.2, 0.5, 0.6] -> [20, 20, 100, 60]
    order = first["labels"].argsort()
    torch.testing.assert_close(first["boxes"][order], torch.tensor([[20.0, 20, 100, 60], [120, 10, 180, 50]]))
    assert (first["image_id"], first["path"]) == ("img0", "img0.jpg")
    assert sorted(second["labels"].tolist()) == [0, 1]
    gt = result["ground_truths"][1]
    torch.testing.assert_close(gt["boxes"][2], torch.tensor([25.0, 25, 35, 45]))
    assert gt["difficult"].tolist() == [False, False, True]
    assert result["ground_truths"][0]["labels"].tolist() == [0, 1]  # padding removed


def test_merge_results_and_scoring_split_ranks():
    result = evaluate_split(FakeDetector(), _loader(1), progress=False)
    dets, gts = result["detections"], result["ground_truths"]
    # rank r of 2 holds images r, r + 2, ...: merged back one of each rank in turn, the split's order
    assert merge_results([[0, 2, 4], [1, 3]]) == [0, 1, 2, 3, 4]
    merged_d = merge_results([dets[0::2], dets[1::2]])
    merged_g = merge_results([gts[0::2], gts[1::2]])
    assert [d["path"] for d in merged_d] == [d["path"] for d in dets]
    assert score_detections(merged_d, merged_g, CLASS_NAMES, "voc")["map"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="unknown metric 'map50'"):
        score_detections(merged_d, merged_g, CLASS_NAMES, "map50")


def test_packing_into_tensors_and_back_gives_the_same_results():
    result = evaluate_split(FakeDetector(), _loader(1), progress=False)
    dets, gts = result["detections"], result["ground_truths"]
    packed = pack_results(dets, gts)
    assert packed["counts"].tolist() == [[2, 2, 100, 200], [2, 3, 50, 50]]
    assert packed["gt_difficult"].tolist() == [False, False, False, False, True]
    got_d, got_g = unpack_results(packed, [(d["image_id"], d["path"]) for d in dets])
    for got, want in zip(got_d + got_g, dets + gts):
        assert got.keys() == want.keys()
        for key in want:
            if isinstance(want[key], torch.Tensor):
                assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key])
            else:
                assert got[key] == want[key]
    assert unpack_results(pack_results([], []), []) == ([], [])


def test_without_a_process_group_the_results_are_returned_as_they_are():
    result = evaluate_split(FakeDetector(), _loader(1), progress=False)
    dets, gts = result["detections"], result["ground_truths"]
    got_d, got_g = gather_on_main(dets, gts)
    assert got_d is dets and got_g is gts


def test_format_table_and_coco_json(tmp_path):
    result = evaluate_split(FakeDetector(), _loader(2), metric="coco", progress=False)
    table = format_table(result, CLASS_NAMES)
    lines = table.splitlines()
    assert lines[0].split() == ["class", "AP", "num", "gt", "num", "det"]
    assert lines[1].split() == ["cat", "1.0000", "2", "2"]
    assert lines[3].split() == ["all", "1.0000", "4", "4"]
    assert "AP50 1.0000" in table
    path = save_coco_json(result, tmp_path / "out" / "detections.json")
    entries = json.loads(path.read_text())
    assert len(entries) == 4
    assert {e["image_id"] for e in entries} == {"img0", "img1"}
    cat0 = next(e for e in entries if e["image_id"] == "img0" and e["category_id"] == 0)
    assert cat0["bbox"] == pytest.approx([20.0, 20.0, 80.0, 40.0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_model_cpu_results():
    result = evaluate_split(FakeDetector().cuda(), _loader(2), metric="voc", device="cuda", progress=False)
    assert result["map"] == pytest.approx(1.0)
    assert all(d["boxes"].device.type == "cpu" for d in result["detections"])


def test_nms_and_matching_iou_thresholds_are_reported_apart():
    result = evaluate_split(FakeDetector(), _loader(2), metric="voc", iou_threshold=0.3, progress=False)
    assert (result["nms_iou_threshold"], result["match_iou_threshold"]) == (0.3, 0.5)
    assert (result["score_threshold"], result["max_detections"]) == (EVALUATE.score_threshold,
                                                                     EVALUATE.max_detections)


@pytest.mark.slow
def test_val_on_the_onnx_export_and_the_run_directory_equals_the_checkpoint(synthetic_voc, tmp_path):
    model = biased_model("ssd_tiny", class_names=list(SHAPE_NAMES[:3]), image_size=128)
    checkpoint = save_checkpoint(tmp_path / "run" / "weights" / "best.pt", model)
    onnx_path = export_onnx(checkpoint, tmp_path / "model.onnx", dynamic_batch=True, check=False)
    options = dict(metric="voc", device="cpu", batch_size=8, iou_threshold=0.5, max_detections=50)
    expected = evaluate(checkpoint, synthetic_voc, **options)
    assert sum(c["num_det"] for c in expected["per_class"].values()) > 0
    for weights in (tmp_path / "run", onnx_path):
        got = evaluate(weights, synthetic_voc, **options)
        assert got["class_names"] == expected["class_names"] == list(SHAPE_NAMES[:3])
        assert got["nms_iou_threshold"] == 0.5 and got["max_detections"] == 50
        assert got["map"] == pytest.approx(expected["map"], abs=1e-4)
        for name, per_class in expected["per_class"].items():
            assert got["per_class"][name]["num_det"] == per_class["num_det"]
            assert got["per_class"][name]["ap"] == pytest.approx(per_class["ap"], abs=1e-4, nan_ok=True)

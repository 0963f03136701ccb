"""The twelve COCO statistics, per class and per size bucket, with faster-coco-eval and pycocotools."""

import json
import math

import pytest
import torch

from builders import jittered_detections
from ssd.data import load_dataset
from ssd.data.records import ImageRecord, ObjectRecord
from ssd.errors import DetectionsError
from ssd.evaluation import results as results_module
from ssd.evaluation.coco import COCO_STATS, evaluate_coco
from ssd.evaluation.results import detections_from_coco_results, ground_truths_from_records
from ssd.inference.coco_results import to_coco_detections


def _one_image(boxes, labels, image_size=(100, 100)):
    return {"boxes": torch.tensor(boxes, dtype=torch.float32), "labels": torch.tensor(labels),
            "difficult": torch.zeros(len(labels), dtype=torch.bool), "image_size": image_size}


def test_faster_coco_eval_equals_pycocotools_on_aquarium(shared_data):
    pytest.importorskip("faster_coco_eval", reason="faster-coco-eval not installed (pip install ssd-detect[eval])")
    spec = load_dataset(shared_data / "aquarium", split="val")
    truths = ground_truths_from_records(spec.splits["val"])
    detections = jittered_detections(truths, len(spec.class_names), seed=3)
    fast = evaluate_coco(detections, truths, len(spec.class_names), spec.class_names, backend="faster-coco-eval")
    reference = evaluate_coco(detections, truths, len(spec.class_names), spec.class_names, backend="pycocotools")
    for key in COCO_STATS:
        assert fast[key] == pytest.approx(reference[key], abs=1e-4), key
    assert 0.2 < reference["AP"] < 0.8 and reference["AR100"] > reference["AR1"]
    for name in spec.class_names:
        for key in ("ap", "ap50", "ap75"):
            assert fast["per_class"][name][key] == pytest.approx(reference["per_class"][name][key], abs=1e-4)
    for ours, theirs in zip(fast["by_size"], reference["by_size"]):
        assert ours["name"] == theirs["name"] and ours["num_gt"] == theirs["num_gt"]
        for key in ("AP", "AP50", "AR100"):
            assert ours[key] == pytest.approx(theirs[key], abs=1e-4, nan_ok=True)
    assert sum(bucket["num_gt"] for bucket in reference["by_size"]) == 909


@pytest.mark.parametrize("backend", ["pycocotools", "faster-coco-eval"])
def test_one_hit_one_miss_gives_known_statistics(backend):
    """Image 100x100: a small object (20x20) found exactly, a large one (60x60) missed; one false positive in
    the corner scored below the hit. AP50 of the only class: recall reaches 0.5 at precision 1 -> 0.5 (51 of the
    101 recall points); AR100 = 0.5. COCO pixel areas: 20² is small (AP 1), 60² medium (AP 0), nothing large.
    Relative sizes (SIZE_BUCKETS): 0.2 is 'medium' (AP 1), 0.6 'large' (AP 0), nothing 'small'."""
    if backend == "faster-coco-eval":
        pytest.importorskip("faster_coco_eval", reason="faster-coco-eval not installed")
    truths = [_one_image([[10, 10, 30, 30], [30, 30, 90, 90]], [0, 0])]
    detections = [{"boxes": torch.tensor([[10.0, 10, 30, 30], [0, 0, 5, 5]]), "labels": torch.tensor([0, 0]),
                   "scores": torch.tensor([0.9, 0.5])}]
    result = evaluate_coco(detections, truths, 2, ["thing", "other"], backend=backend)
    assert result["backend"] == backend
    assert result["AP50"] == pytest.approx(51 / 101) and result["AP"] == pytest.approx(51 / 101)
    assert result["AR1"] == result["AR100"] == pytest.approx(0.5)
    assert result["APs"] == pytest.approx(1.0) and result["APm"] == 0.0 and math.isnan(result["APl"])
    assert result["per_class"]["thing"]["ap50"] == pytest.approx(51 / 101)
    other = result["per_class"]["other"]
    assert other["num_gt"] == 0 and math.isnan(other["ap"]) and other["precision"].size == 0
    buckets = {b["name"]: b for b in result["by_size"]}
    assert [b["name"] for b in result["by_size"]] == ["small", "medium", "large"]
    assert buckets["medium"]["num_gt"] == 1 and buckets["medium"]["AP"] == pytest.approx(1.0)
    assert buckets["large"]["num_gt"] == 1 and buckets["large"]["AP"] == 0.0
    assert buckets["small"]["num_gt"] == 0 and math.isnan(buckets["small"]["AP"])


def test_size_buckets_need_every_image_size():
    truths = [_one_image([[10, 10, 30, 30]], [0])]
    del truths[0]["image_size"]
    detections = [{"boxes": torch.tensor([[10.0, 10, 30, 30]]), "labels": torch.tensor([0]),
                   "scores": torch.tensor([0.9])}]
    result = evaluate_coco(detections, truths, 1, backend="pycocotools")
    assert result["by_size"] is None and result["AP"] == pytest.approx(1.0)


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="unknown COCO backend 'cocoapi'; choose one of faster-coco-eval, pyco"):
        evaluate_coco([{"boxes": torch.zeros(0, 4), "labels": torch.zeros(0, dtype=torch.int64),
                        "scores": torch.zeros(0)}], [_one_image([[0, 0, 1, 1]], [0])], 1, backend="cocoapi")


def _records(tmp_path, ids):
    return [ImageRecord(path=tmp_path / f"{i}.jpg", annotation=None, width=100, height=80, image_id=i,
                        objects=[ObjectRecord(box=(10.0, 10.0, 30.0, 40.0), label=0, name="cat")]) for i in ids]


def test_results_file_round_trip_with_the_datasets_category_ids(tmp_path):
    records = _records(tmp_path, [7, 9])
    found = [{"boxes": torch.tensor([[10.0, 10, 30, 40]]), "labels": torch.tensor([1]), "scores": torch.tensor([0.5]),
              "image_id": 9}]
    path = tmp_path / "detections.json"
    path.write_text(json.dumps(to_coco_detections(found, category_ids=[3, 5])))
    back = detections_from_coco_results(path, records, 2, category_ids=[3, 5])
    assert [d["image_id"] for d in back] == [7, 9] and len(back[0]["labels"]) == 0
    assert back[1]["boxes"].tolist() == [[10.0, 10.0, 30.0, 40.0]] and back[1]["labels"].tolist() == [1]


def test_results_with_foreign_image_or_category_ids_name_the_first_mismatches(tmp_path):
    records = _records(tmp_path, [7, 9])
    results = [{"image_id": i, "category_id": 3, "bbox": [0, 0, 1, 1], "score": 0.5} for i in (7, 11, 12)]
    with pytest.raises(ValueError, match=r"detections: 2 image id\(s\) are not images of the split: 11, 12 \(the "
                                         r"split's ids look like 7, 9\)"):
        detections_from_coco_results(results, records, 2, category_ids=[3, 5])
    results = [{"image_id": 7, "category_id": c, "bbox": [0, 0, 1, 1], "score": 0.5} for c in (3, 4, 90)]
    with pytest.raises(ValueError, match=r"category id\(s\) 4, 90 are not the dataset's \(3, 5\)"):
        detections_from_coco_results(results, records, 2, category_ids=[3, 5])
    with pytest.raises(ValueError, match=r"category id\(s\) 3, 4, 90 are not the dataset's \(0..1\)"):
        detections_from_coco_results(results, records, 2)
    with pytest.raises(ValueError, match=r"detections: detection 1: \{'image_id': 7\} is not a COCO result "
                                         r"dict\(image_id, category_id, bbox=\[x, y, width, height\], score\)"):
        detections_from_coco_results([results[0], {"image_id": 7}], records, 2, category_ids=[3, 5])


# ------------------------------------------------------------------------------- a detections file a user hands over
DETECTION = '{"image_id": 7, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5}'


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000 + "]" * 100_000, "a COCO results file is nested too deeply"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [[1, 2], [3, 4]], "score": 0.5}}]',
     "detection 1: bbox [[1, 2], [3, 4]] must be a list of exactly 4 finite numbers [x, y, width, height]"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, 3], "score": 0.5}}]',
     "detection 1: bbox [1, 2, 3] must be a list of exactly 4 finite numbers"),
    (f'[{DETECTION}, {DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, NaN, 4], "score": 0.5}}]',
     "NaN is not a JSON number"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, 1e999, 4], "score": 0.5}}]',
     "detection 1: bbox [1.0, 2.0, inf, 4.0], score 0.5: bbox and score must be finite numbers"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, 1{"0" * 400}, 4], "score": 0.5}}]',
     "detection 1: bbox [1, 2, 100000000000000000...0000000000000000000, 4] must be a list of exactly 4 finite "
     "numbers"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, -3, 4], "score": 0.5}}]',
     "detection 1: bbox [1.0, 2.0, -3.0, 4.0], score 0.5: bbox width and height must be >= 0"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 1.5}}]',
     "detection 1: bbox [1.0, 2.0, 3.0, 4.0], score 1.5: score must be in [0, 1]"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": true, "bbox": [1, 2, 3, 4], "score": 0.5}}]',
     "detection 1: category_id True must be an integer"),
    (f'[{DETECTION}, {{"image_id": [7], "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5}}]',
     "detection 1: image_id [7] must be an integer or a string"),
    (f'[{DETECTION}, {{"image_id": 7, "category_id": 4, "bbox": [1, 2, 3, 4], "score": 0.5}}]',
     "detection 1: category id(s) 4 are not the dataset's (3, 5)"),
    ('{"annotations": []}', "a COCO results file must be a JSON list [...]"),
    (f'[{{"image_id": 1{"0" * 5000}, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5}}]',
     "Exceeds the limit (4300 digits) for integer string conversion"),
    (f'[{DETECTION},', "not valid JSON at line 1, column 72: Expecting value"),
])
def test_bad_detections_file_is_one_error_naming_the_file_and_the_detection(tmp_path, text, message):
    path = tmp_path / "detections.json"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        detections_from_coco_results(path, _records(tmp_path, [7, 9]), 2, category_ids=[3, 5])
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value), str(info.value)


def test_missing_detections_file_or_a_folder_is_one_error_naming_it(tmp_path):
    for path, cause in ((tmp_path / "missing.json", "No such file or directory"), (tmp_path, "Is a directory")):
        with pytest.raises(ValueError, match=rf"^cannot read a COCO results file: {cause} while reading {path} "):
            detections_from_coco_results(path, _records(tmp_path, [7]), 2)


def test_detections_file_over_the_size_bound_is_refused_before_it_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(results_module, "MAX_DETECTIONS_FILE_BYTES", 100)
    path = tmp_path / "detections.json"
    path.write_text(f"[{DETECTION}, {DETECTION}]")
    with pytest.raises(ValueError, match=r"a COCO results file of 142 bytes is over the bound of 100 bytes "
                                         r"\(ssd.limits.MAX_DETECTIONS_FILE_BYTES\)"):
        detections_from_coco_results(path, _records(tmp_path, [7]), 2, category_ids=[3, 5])


def test_more_detections_for_one_image_than_the_bound_are_refused_naming_the_image(tmp_path, monkeypatch):
    monkeypatch.setattr(results_module, "MAX_DETECTIONS_PER_IMAGE", 2)
    found = [{"image_id": i, "category_id": 3, "bbox": [1, 2, 3, 4], "score": 0.5} for i in (7, 9, 9, 9)]
    with pytest.raises(DetectionsError, match=r"detections: image 9 has 3 detections, more than 2 "
                                              r"\(ssd.limits.MAX_DETECTIONS_PER_IMAGE\)"):
        detections_from_coco_results(found, _records(tmp_path, [7, 9]), 2, category_ids=[3, 5])
    back = detections_from_coco_results(found[:3], _records(tmp_path, [7, 9]), 2, category_ids=[5, 3])
    assert [len(d["scores"]) for d in back] == [1, 2] and back[1]["labels"].tolist() == [1, 1]


def test_ssd_val_detections_nested_100000_deep_exits_1_with_one_line(synthetic_voc, tmp_path, capsys):
    from ssd.cli import main

    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert main(["val", "--detections", str(path), "--data", str(synthetic_voc), "--no-save"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: {path}: a COCO results file is nested too deeply to be what it should be"

"""The ``ssd check`` rules, messages, report formats, default-box coverage and the gate's skip_invalid."""

import json
from pathlib import Path

import pytest
from PIL import Image

from builders import make_yolo_folder
from ssd import limits
from ssd.data import check_dataset, load_training_data
from ssd.data.check import screen
from ssd.data.coverage import prior_coverage
from ssd.data.records import DatasetSpec, ImageRecord, ObjectRecord
from ssd.errors import DataError
from ssd.priors import PriorConfig


# Not builders.make_dataset: each test gives the label text whose file and line the check must name.
def _yolo_dataset(root: Path, labels: dict[str, str], names: list[str]) -> Path:
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for stem, text in labels.items():
        Image.new("RGB", (100, 50)).save(root / "images" / f"{stem}.jpg")
        (root / "labels" / f"{stem}.txt").write_text(text)
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nnames: {names}\n")
    return root / "data.yaml"


def test_seed_bug_label_equal_to_num_classes(tmp_path):
    """6 classes named, labels 0..6 used: the check names the file, the line and explains the background rule."""
    names = ["a", "b", "c", "d", "e", "f"]
    data = _yolo_dataset(tmp_path, {"ok": "0 0.5 0.5 0.2 0.2\n5 0.3 0.3 0.1 0.1\n3 0.7 0.7 0.1 0.1\n4 0.2 0.7 0.1 0.1",
                                    "bad": "1 0.5 0.5 0.2 0.2\n2 0.5 0.5 0.4 0.4\n6 0.2 0.2 0.1 0.1\n"}, names)
    report = check_dataset(data)
    assert not report.ok
    (error,) = report.errors
    assert error.code == "label_out_of_range" and error.file == "labels/bad.txt" and error.line == 3
    assert error.message.startswith("labels/bad.txt:3: label 6 is out of range for 6 classes")
    assert "labels must be 0..5; the background class is added internally, do not count it" in error.message
    assert "labels/bad.txt:3" in report.format_table()
    with pytest.raises(DataError, match=r"1 problems in dataset .*\n  labels/bad.txt:3: label 6 is out of range"):
        load_training_data(data)


def test_box_rules_and_messages(tmp_path):
    data = _yolo_dataset(tmp_path, {"img": "\n".join([
        "0 0.5 0.5 0.2 0.2",      # 1 fine
        "0 0.5 0.5 0.2 0.2",      # 2 exact duplicate of line 1
        "0 0.3 0.3 0 0",          # 3 zero area
        "0 0.3 0.3 -0.1 0.1",     # 4 inverted
        "0 nan 0.3 0.1 0.1",      # 5 not finite
        "0 1.5 0.5 0.2 0.2",      # 6 entirely outside
        "0 0.95 0.5 0.2 0.2",     # 7 past the border: warning
        "0 0.2 0.5 0.01 0.5",     # 8 1 px wide: warning
        "0 0.2 0.2",              # 9 malformed
        "x 0.2 0.2 0.1 0.1",      # 10 not numeric
        "1.5 0.2 0.2 0.1 0.1",    # 11 non-integer class
    ])}, ["only"])
    report = check_dataset(data)
    errors = {e.line: e for e in report.errors}
    warnings = {(w.code, w.line) for w in report.warnings}
    assert {line: e.code for line, e in errors.items()} == {
        3: "zero_area", 4: "inverted", 5: "non_finite", 6: "outside_image", 9: "parse_error", 10: "parse_error",
        11: "parse_error", None: "no_valid_images"}  # a label file that does not parse makes its image unusable
    assert errors[3].message == ("labels/img.txt:3: box (30, 15, 30, 15) (written: 0.3 0.3 0 0) has zero area "
                                 "(width 0, height 0; boxes need x2 > x1 and y2 > y1)")
    assert "has 3 values" in errors[9].message and "'x 0.2 0.2 0.1 0.1' is not numeric" in errors[10].message
    assert "class '1.5' is not an integer" in errors[11].message
    assert warnings == {("duplicate_box", 2), ("beyond_border", 7), ("tiny_box", 8)}
    assert errors[None].message == (f"split 'train' ({tmp_path / 'data.yaml'}): none of its 1 images is usable (see "
                                    "the errors about them)")
    assert len(report.errors) == 8 and not report.ok


def test_unknown_voc_name_suggests_closest(tmp_path):
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "JPEGImages").mkdir()
    (tmp_path / "classes.txt").write_text("RBC\nWBC\nPlatelets\n")
    Image.new("RGB", (20, 20)).save(tmp_path / "JPEGImages" / "i.jpg")
    (tmp_path / "Annotations" / "i.xml").write_text(
        "<annotation><object><name>Platelet</name><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax>"
        "</bndbox></object></annotation>")
    report = check_dataset(tmp_path)
    assert [e.code for e in report.errors] == ["unknown_class", "no_objects_in_split"]
    assert report.errors[1].message == "split 'train' (JPEGImages): all 1 objects of its images have errors (see them)"
    error = report.errors[0]
    assert error.code == "unknown_class" and error.message == (
        "Annotations/i.xml object 1 (Platelet): unknown class name 'Platelet' (closest: 'Platelets'); "
        "known names: ['RBC', 'WBC', 'Platelets']")


def _spec(objects_per_image, size=(100, 100), names=("a", "b"), root=Path("/x")):
    """Records of images ``root/<i>.jpg`` (written when ``root`` exists) with label files ``<i>.txt``."""
    records = [ImageRecord(root / f"{i}.jpg", root / f"{i}.txt", [
        ObjectRecord(b, lbl, names[lbl] if 0 <= lbl < len(names) else "?", where=f"{i}.txt:{j + 1}", line=j + 1)
        for j, (b, lbl) in enumerate(objs)], *size) for i, objs in enumerate(objects_per_image)]
    for rec in records if root.is_dir() else []:
        Image.new("RGB", size).save(rec.path)
    return DatasetSpec(root, "yolo", list(names), {"train": records})


def test_screen_skip_invalid_drops_and_reports(tmp_path):
    spec = _spec([[((0, 0, 10, 10), 0), ((5, 5, 5, 5), 1), ((1, 1, 20, 20), 2)], [((0, 0, 50, 50), 1)]],
                 root=tmp_path)
    with pytest.raises(DataError, match="2 problems"):
        screen(spec, ["train"])
    clean, report = screen(spec, ["train"], skip_invalid=True)
    assert [len(r.objects) for r in clean.splits["train"]] == [1, 1]
    assert [len(r.objects) for r in spec.splits["train"]] == [3, 1]  # the input is left as it was
    assert report.dropped["objects"] == 2 and report.dropped["object_locations"] == ["0.txt:2", "0.txt:3"]
    assert "skipped as invalid: 2 objects, 0 images" in report.format_table()
    assert screen(clean, ["train"])[1].ok


def test_skip_invalid_counts_an_object_once_when_its_image_is_in_two_splits(tmp_path):
    # BCCD's ImageSets list each image in train or val and again in trainval: one bad box, one drop reported
    spec = _spec([[((0, 0, 10, 10), 0), ((5, 5, 5, 5), 1)], [((0, 0, 50, 50), 1)]], root=tmp_path)
    spec.splits["trainval"] = list(spec.splits["train"])
    clean, report = screen(spec, ["train"], skip_invalid=True)
    assert report.dropped["objects"] == 1 and report.dropped["object_locations"] == ["0.txt:2"]
    assert [len(r.objects) for r in clean.splits["trainval"]] == [1, 1]  # dropped from every split that lists it


def test_report_dict_is_json_and_counts():
    spec = _spec([[((0, 0, 10, 10), 0), ((20, 20, 40, 40), 0)], [], [((0, 0, 50, 50), 1)]])
    report = check_dataset(spec, decode_images=False)
    d = json.loads(json.dumps(report.to_dict()))
    assert d["ok"] and d["num_classes"] == 2 and d["errors"] == []
    assert d["stats"]["train"] == {"images": 3, "objects": 3, "images_without_objects": 1, "difficult_or_crowd": 0,
                                   "objects_per_class": {"a": 2, "b": 1}, "images_per_class": {"a": 1, "b": 1}}
    assert [w["code"] for w in d["warnings"]] == ["no_objects"]
    table = report.format_table()
    assert "split  images  objects  no objects  a  b" in table and table.endswith("OK: no errors")


def test_prior_coverage_hand_computed():
    # at 100 px, one level of one cell: twice the centred square of side 0.5 -> xyxy (0.25, 0.25, 0.75, 0.75)
    priors = PriorConfig(feature_maps=[1], steps=[100], min_sizes=[50], max_sizes=[50], aspect_ratios=[[]])
    assert priors.boxes(100).tolist() == [[0.5, 0.5, 0.5, 0.5]] * 2
    spec = _spec([[((25, 25, 75, 75), 0),     # IoU 1, medium (sqrt area 0.5 -> large)
                   ((25, 25, 75, 50), 0),     # IoU 0.5 exactly: covered (large)
                   ((25, 25, 35, 35), 1),     # small: IoU 0.04
                   ((0, 0, 100, 10), 1)]])    # wide 10:1, IoU 0
    cov = prior_coverage(spec, priors, 100)
    assert cov["boxes"] == 4 and cov["covered"] == 0.5
    by_size = {b["name"]: (b["boxes"], b["covered"]) for b in cov["by_size"]}
    assert by_size == {"small": (1, 0.0), "medium": (0, 0.0), "large": (3, pytest.approx(2 / 3))}
    by_aspect = {b["name"]: b["boxes"] for b in cov["by_aspect"]}
    assert by_aspect == {"tall": 0, "regular": 3, "wide": 1}
    report = check_dataset(spec, priors=priors, image_size=100, decode_images=False)
    assert report.coverage == cov
    assert "default-box coverage" in report.format_table()


def test_prior_coverage_names_the_worst_sizes():
    priors = PriorConfig(feature_maps=[1], steps=[100], min_sizes=[50], max_sizes=[50], aspect_ratios=[[]])
    spec = _spec([[((25, 25, 75, 75), 0)] * 5 + [((48, 48, 52, 52), 0)] * 6])
    report = check_dataset(spec, priors=priors, image_size=100, decode_images=False)
    assert [w["name"] for w in report.coverage["worst"]] == ["small regular"]
    (warning,) = [w for w in report.warnings if w.code == "low_prior_coverage"]
    assert "worst covered: small regular objects (0% of 6)" in warning.message


def test_unreadable_dataset_is_a_report_error(tmp_path):
    report = check_dataset(tmp_path / "missing")
    (error,) = report.errors
    assert not report.ok and error.code == "unreadable_dataset" and "does not exist" in error.message
    assert "FAILED: 1 errors" in report.format_table()


def test_truncated_image_is_reported(tmp_path):
    data = _yolo_dataset(tmp_path, {"good": "0 0.5 0.5 0.2 0.2\n", "cut": "0 0.5 0.5 0.2 0.2\n"}, ["a"])
    jpg = tmp_path / "images" / "cut.jpg"
    Image.effect_noise((100, 50), 60).convert("RGB").save(jpg, quality=90)
    jpg.write_bytes(jpg.read_bytes()[: len(jpg.read_bytes()) // 2])  # the header still reads
    report = check_dataset(data)
    (error,) = report.errors
    assert error.code == "corrupt_image" and error.file == "images/cut.jpg" and "does not decode" in error.message
    assert check_dataset(data, decode_images=False).ok


def test_check_with_a_model_measures_its_default_boxes_without_building_it(synthetic_voc, monkeypatch):
    import ssd.models.build as build
    from ssd.data.load import load_dataset

    monkeypatch.setattr(build, "_assemble", lambda *args, **kwargs: pytest.fail("a whole model was built"))
    report = check_dataset(synthetic_voc, model="ssd_tiny", image_size=128, decode_images=False)
    spec = load_dataset(synthetic_voc)
    assert report.coverage == prior_coverage(spec, build.default_priors("ssd_tiny", 128), 128)
    assert report.coverage["boxes"] == sum(len(r.objects) for s in spec.splits for r in spec.records(s))
    with pytest.raises(ValueError, match="priors need the image_size their sizes are pixels of"):
        check_dataset(spec, priors=build.default_priors("ssd_tiny"))


# --------------------------------------------------------------------------------------------------- names are data
@pytest.mark.parametrize("name, rule", [
    ("cell\x1b[2J", "holds U+001B (a control character), which would act on the terminal"),
    ("ding\x07", "holds U+0007 (a control character)"),
    ("over\rwrite", "holds U+000D (a control character)"),
    ("evil\u202egnp", "holds U+202E (RIGHT-TO-LEFT OVERRIDE)"),
    ("\ud800", "holds a lone surrogate U+D800, which is not text"),
    ("x" * 201, "is 201 characters long: at most 200 (ssd.limits.MAX_NAME_CHARS)"),
])
def test_class_name_with_esc_bel_cr_or_a_lone_surrogate_is_an_error_of_ssd_check_shown_escaped(tmp_path, capsys,
                                                                                              name, rule):
    from ssd.cli import main

    data = _yolo_dataset(tmp_path / "d", {"a": "0 0.5 0.5 0.2 0.2\n", "b": "1 0.5 0.5 0.2 0.2\n"}, ["ok", "x"])
    data.write_text(data.read_text().replace("names: ['ok', 'x']", f"names: {json.dumps(['ok', name])}"))
    report = check_dataset(data)
    assert [i.code for i in report.errors] == ["invalid_class_name"]
    assert report.errors[0].message.startswith(f"{data}: class name 1 {limits.value_text(name)} {rule}")
    assert main(["check", str(data)]) == 1
    out = capsys.readouterr().out
    assert out.isascii() and out.isprintable() is False and all(line.isprintable() for line in out.splitlines())
    with pytest.raises(DataError, match="invalid_class_name|class name 1"):
        load_training_data(data, splits=("train",))


def test_coco_and_voc_class_names_are_checked_like_yolo_ones(tmp_path):
    voc = tmp_path / "voc"  # XML cannot hold a BEL: classes.txt can
    for folder in ("JPEGImages", "Annotations"):
        (voc / folder).mkdir(parents=True)
    Image.new("RGB", (64, 48)).save(voc / "JPEGImages" / "a.jpg")
    (voc / "Annotations" / "a.xml").write_text(
        "<annotation><filename>a.jpg</filename><size><width>64</width><height>48</height></size><object><name>ok"
        "</name><bndbox><xmin>5</xmin><ymin>5</ymin><xmax>30</xmax><ymax>30</ymax></bndbox></object></annotation>")
    (voc / "classes.txt").write_text("ok\nbell\x07\n")
    coco = tmp_path / "coco"
    (coco / "images").mkdir(parents=True)
    Image.new("RGB", (64, 48)).save(coco / "images" / "a.jpg")
    (coco / "train.json").write_text(json.dumps({
        "images": [{"id": 1, "file_name": "images/a.jpg", "width": 64, "height": 48}],
        "categories": [{"id": 1, "name": "esc\x1b"}],
        "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 20, 20], "iscrowd": 0}]}))
    for data in (voc, coco / "train.json"):
        codes = [i.code for i in check_dataset(data).errors]
        assert "invalid_class_name" in codes, (data, codes)


def test_image_file_name_with_a_control_character_is_an_error_naming_it_escaped(tmp_path):
    data = _yolo_dataset(tmp_path / "d", {"a": "0 0.5 0.5 0.2 0.2\n", "b\x1b[2Jc": "0 0.5 0.5 0.2 0.2\n"}, ["x"])
    errors = check_dataset(data).errors
    assert [(i.code, i.message) for i in errors] == [
        ("invalid_file_name", "images/b\\x1b[2Jc.jpg: the file name holds U+001B (a control character), which would "
         "act on the terminal or the text around it instead of being shown: rename it")]


def write_yolo_boxes(root, lines: list[str]):
    from PIL import Image

    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    Image.new("RGB", (640, 640), (9, 9, 9)).save(root / "images" / "crowd.png")
    (root / "labels" / "crowd.txt").write_text("".join(lines))
    (root / "classes.txt").write_text("cell\n")
    return root


def test_image_with_twenty_thousand_boxes_is_refused_by_name(tmp_path):
    from ssd.data.check import check_dataset

    root = write_yolo_boxes(tmp_path, [f"0 {0.01 + (i % 100) * 0.0098:.4f} {0.01 + (i // 100) * 0.0049:.4f} 0.005 "
                                       "0.004\n" for i in range(20_000)])
    report = check_dataset(root)
    assert [(i.code, i.message) for i in report.errors] == [
        ("too_many_boxes", "labels/crowd.txt: 20,000 objects in one image, more than 10,000 "
                           "(ssd.limits.MAX_BOXES_PER_IMAGE)"),
        ("no_valid_images", "split 'train' (images): none of its 1 images is usable (see the errors about them)")]


def test_duplicate_check_in_chunks_finds_the_same_pairs(monkeypatch):
    import numpy as np
    import torch
    from torchvision.ops import box_iou

    import ssd.data.object_rules as rules

    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10.5], [50, 50, 60, 60], [0, 0, 10, 10], [50, 50, 60, 60.2],
                      [55, 55, 70, 70]], np.float64)
    labels = np.array([0, 0, 1, 1, 1, 1])
    whole = rules.duplicate_pairs(boxes, labels)
    assert [(a, b, round(v, 4)) for a, b, v in whole] == [(0, 1, 0.9524), (2, 4, 0.9804)]
    iou = box_iou(torch.from_numpy(boxes), torch.from_numpy(boxes))  # torchvision's IoU, bit for bit
    assert [v for _, _, v in whole] == [iou[0, 1].item(), iou[2, 4].item()]
    monkeypatch.setattr(rules, "DUPLICATE_CHUNK", 5)  # one row per chunk
    assert rules.duplicate_pairs(boxes, labels) == whole


def test_split_whose_every_image_is_corrupt_says_so_not_no_images(tmp_path):
    from ssd.data.check import check_dataset

    root = make_yolo_folder(tmp_path, 2)
    for image in (root / "train" / "images").iterdir():
        image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    report = check_dataset(root)
    assert [i.message for i in report.errors if i.code in ("no_valid_images", "empty_split")] == [
        f"split 'train' ({root}): none of its 2 images could be read (see the errors about them)"]

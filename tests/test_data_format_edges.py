"""The readers' edge cases: COCO split names and duplicate files or ids, flat VOC folders, empty or case-differing
class lists, YOLO lines run together or short, unreadable folders and symbolic-link loops, each named in the
issue or error it gives."""

import json
from pathlib import Path

import pytest
from PIL import Image

from builders import make_yolo_folder, write_image
from ssd.cli import main
from ssd.data import check_dataset, load_dataset
from ssd.data.coco import split_name
from ssd.data.yolo import GLUED_HINT
from ssd.errors import DataError


def write_coco(path, image_name: str, image_id: int = 1):
    Image.new("RGB", (64, 64), (5, 5, 5)).save(path.parent / image_name)
    path.write_text(json.dumps({
        "images": [{"id": image_id, "file_name": image_name, "width": 64, "height": 64}],
        "annotations": [{"id": 1, "image_id": image_id, "category_id": 1, "bbox": [8, 8, 20, 20], "iscrowd": 0}],
        "categories": [{"id": 1, "name": "cell"}]}))


@pytest.mark.parametrize("name, split", [("instances_val2017.json", "val"), ("valid.json", "val"),
                                         ("image_info_test-dev2017.json", "test"), ("train2017.json", "train"),
                                         ("my_eval.json", "train"), ("interval.json", "train")])
def test_coco_split_names_are_whole_words_of_the_file_name(name, split):
    assert split_name(Path(name)) == split


@pytest.mark.parametrize("first, second, split", [("train_part1.json", "train_part2.json", "train"),
                                                  ("train.json", "my_eval.json", "train")])
def test_two_coco_files_for_one_split_are_refused_by_name(tmp_path, first, second, split):
    write_coco(tmp_path / first, "a.png", 1)
    write_coco(tmp_path / second, "b.png", 2)
    a, b = sorted([first, second])
    with pytest.raises(DataError, match=f"COCO files {a} and {b} in .* are both split '{split}' \\(split names are "
                                        "whole words of the file name"):
        load_dataset(tmp_path)


def voc_xml(name: str, image: str = "a.jpg") -> str:
    return (f"<annotation><filename>{image}</filename><size><width>64</width><height>64</height><depth>3</depth>"
            f"</size><object><name>{name}</name><bndbox><xmin>8</xmin><ymin>8</ymin><xmax>30</xmax><ymax>30</ymax>"
            "</bndbox></object></annotation>")


def flat_voc(root, files: dict[str, str]):
    """A flat VOC folder: ``{"a.jpg": "", "a.xml": "<annotation>..."}`` (images are 64x64)."""
    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if name.lower().endswith((".jpg", ".png")):
            Image.new("RGB", (64, 64), (3, 3, 3)).save(root / name)
        else:
            (root / name).write_text(text)
    return root


def test_upper_case_xml_suffix_is_read(tmp_path):
    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.XML": voc_xml("cell")}))
    assert [(r.path.name, r.annotation.name, [o.name for o in r.objects]) for r in spec.records("train")] == [
        ("a.jpg", "a.XML", ["cell"])]


def test_flat_voc_images_without_xml_are_reported(tmp_path):
    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("cell"), "b.jpg": "", "c.jpg": ""}))
    assert len(spec.records("train")) == 1
    assert [(i.code, i.message) for i in spec.issues] == [
        ("image_without_annotation", ".: 2 image(s) without an XML file beside them are not read: b.jpg, c.jpg")]


def test_two_images_with_one_stem_are_reported(tmp_path):
    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.png": "", "a.xml": voc_xml("cell")}))
    assert [r.path.name for r in spec.records("train")] == ["a.jpg"]
    assert [(i.code, i.message) for i in spec.issues] == [
        ("same_stem", "a.png: shares the name 'a' with a.jpg, whose annotation it would share: a.png is not read "
                      "(rename one)")]


@pytest.mark.parametrize("layout", ["voc", "yolo"])
def test_empty_classes_txt_is_named_as_empty(tmp_path, layout):
    if layout == "voc":
        root = flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("cell")})
    else:
        root = make_yolo_folder(tmp_path, 1)
    (root / "classes.txt").write_text("\n  \n")
    with pytest.raises(DataError, match=r"classes\.txt: the class file is empty: list one class name per line"):
        load_dataset(root)


def test_class_names_differing_only_in_case_are_a_warning(tmp_path):
    root = flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("rbc"), "b.jpg": "", "b.xml": voc_xml("RBC", "b.jpg")})
    report = check_dataset(root)
    assert [(i.code, i.message) for i in report.warnings if i.code == "class_names_differ_in_case"] == [
        ("class_names_differ_in_case", f"{root}: class names 'RBC', 'rbc' differ only in case and are 2 classes; "
                                       "rename them to one name if they are the same class")]


def coco_file(tmp_path, images: list[dict], annotations: list[dict]):
    for img in images:
        if not img["file_name"].startswith(("..", "/")):
            Image.new("RGB", (64, 64), (5, 5, 5)).save(tmp_path / img["file_name"])
    path = tmp_path / "instances_train.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": [{"id": 1, "name": "cell"}]}))
    return path


def box(ann_id: int, image_id: int) -> dict:
    return {"id": ann_id, "image_id": image_id, "category_id": 1, "bbox": [8, 8, 20, 20], "iscrowd": 0}


def test_coco_duplicate_annotation_ids_are_errors(tmp_path):
    spec = load_dataset(coco_file(tmp_path, [{"id": 1, "file_name": "a.png"}], [box(7, 1), box(7, 1)]))
    assert [(i.code, i.message) for i in spec.issues] == [
        ("parse_error", "instances_train.json annotation id 7: id 7 is also annotations[0] (annotation ids must be "
                        "unique)")]
    assert len(spec.records("train")[0].objects) == 1


def test_coco_file_name_outside_the_dataset_folder_is_refused(tmp_path):
    (tmp_path / "data").mkdir()
    Image.new("RGB", (64, 64)).save(tmp_path / "secret.png")
    spec = load_dataset(coco_file(tmp_path / "data", [{"id": 1, "file_name": "../secret.png"}], [box(1, 1)]))
    assert spec.records("train") == []
    assert [(i.code, i.message) for i in spec.issues] == [
        ("outside_root", "instances_train.json image id 1: file_name '../secret.png' leaves the dataset folder "
                         "(absolute or ../): images are read from inside it")]


def test_coco_same_file_under_two_ids_is_counted_once(tmp_path):
    spec = load_dataset(coco_file(tmp_path, [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "a.png"}],
                                  [box(1, 1), box(2, 2)]))
    assert [r.image_id for r in spec.records("train")] == [1]
    assert [(i.code, i.message) for i in spec.issues] == [
        ("duplicate_image", "instances_train.json image id 2: 'a.png' is also image id 1; one file under two ids "
                            "would be counted twice")]


def test_yolo_line_of_seven_values_is_a_warning_not_a_silent_polygon(tmp_path):
    root = make_yolo_folder(tmp_path, 1)
    (root / "train" / "labels" / "train0.txt").write_text("0 0.5 0.5 0.4 0.3 0.9 0.1\n")
    spec = load_dataset(root)
    assert [(i.code, i.message) for i in spec.issues] == [
        ("short_polygon", "train/labels/train0.txt:1: 7 values are read as a 3-point polygon (its bounding box); a "
                          "box line has 5: 'class cx cy w h'")]


def test_yolo_label_files_without_an_image_are_reported(tmp_path):
    root = make_yolo_folder(tmp_path, 2)
    for orphan in ("lost", "gone"):  # their images were deleted
        (root / "train" / "labels" / f"{orphan}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    assert len(load_dataset(root).records("train")) == 2
    spec = load_dataset(root)
    assert [(i.code, i.message) for i in spec.issues] == [
        ("label_without_image", "train/labels: 2 label file(s) without an image are not read: gone.txt, lost.txt")]


def yolo_folder(root, labels: dict[str, str]):
    """``root/images/<stem>.jpg`` (64 x 48) and ``root/labels/<stem>.txt`` holding the given text, one class."""
    for stem, text in labels.items():
        write_image(root / "images" / f"{stem}.jpg", 64, 48)
        (root / "labels").mkdir(parents=True, exist_ok=True)
        (root / "labels" / f"{stem}.txt").write_text(text)
    (root / "classes.txt").write_text("cat\n")
    return root


def test_unreadable_labels_folder_is_one_error_naming_it(tmp_path, monkeypatch, capsys):
    root = yolo_folder(tmp_path / "d", {"a": "0 0.5 0.5 0.2 0.2\n", "b": "0 0.5 0.5 0.2 0.2\n"})
    is_file = Path.is_file

    def denied(path):  # what stat says under a chmod 000 folder (tests run as root, who may read it anyway)
        if path.parent.name == "labels":
            raise PermissionError(13, "Permission denied", str(path))
        return is_file(path)

    monkeypatch.setattr(Path, "is_file", denied)
    report = check_dataset(root)
    assert [(i.code, i.message) for i in report.errors] == [
        *[("unreadable_folder", f"images/{stem}.jpg: its label file labels/{stem}.txt cannot be read: the folder "
           f"labels is not readable (permission denied; give read access: chmod u+rx {root / 'labels'})")
          for stem in "ab"],
        ("no_valid_images", f"split 'train' ({root}): none of its 2 images could be read (see the errors about them)")]
    assert main(["check", str(root)]) == 1
    assert "the folder labels is not readable (permission denied" in capsys.readouterr().out


@pytest.mark.parametrize("text, values", [
    ("0 0.5 0.5 0.2 0.2" + "0 0.3 0.3 0.1 0.1\n", 9),  # one class: the 0 glued to the h before it
    ("0 0.500 0.500 0.200 0.200" + "1 0.300 0.300 0.100 0.100" + "0 0.7 0.7 0.1 0.1\n", 13),
    ("0 0.5 0.5 0.2 0.2" + "0 0.1 0.1 0.2 0.1 0.3 0.3\n", 11),  # a box run into a polygon
    ("0 0.5 0.5 0.2 0.2" + "0 0.1 0.1 0.2\n", 8),  # into a short line: an even count
])
def test_yolo_lines_run_together_by_a_missing_newline_are_malformed_with_the_hint(tmp_path, text, values):
    root = yolo_folder(tmp_path / "d", {"a": "0 0.4 0.4 0.1 0.1\n" + text,
                                        "b": "0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n"})
    (root / "classes.txt").write_text("cat\ndog\n")
    errors = check_dataset(root).errors
    assert [(e.code, e.file, e.line) for e in errors] == [("parse_error", "labels/a.txt", 2)]
    assert errors[0].message == (f"labels/a.txt:2: {text.strip()!r} has {values} values (YOLO lines are 'class cx cy "
                                 f"w h' with an integer class and normalized coordinates) {GLUED_HINT}")
    assert GLUED_HINT.startswith("(two lines run together? a label file missing its final newline")


def test_yolo_four_point_polygon_is_still_read_as_its_bounding_box(tmp_path):
    root = yolo_folder(tmp_path / "d", {"a": "0 0.25 0.25 0.75 0.25 0.75 0.75 0.25 0.75\n"})
    report = check_dataset(root)
    assert report.errors == []
    [record] = load_dataset(root).records("train")
    assert [o.box for o in record.objects] == [(16.0, 12.0, 48.0, 36.0)]


def test_coco_bbox_written_as_xyxy_is_an_error_unless_it_fits_as_xywh(tmp_path, capsys):
    write_image(tmp_path / "images" / "a.jpg", 100, 80)
    annotations = [{"id": 7, "image_id": 1, "category_id": 3, "bbox": [40, 30, 90, 70]},  # x + w = 130 > 100
                   {"id": 8, "image_id": 1, "category_id": 3, "bbox": [10, 10, 50, 40]}]  # fits either way: xywh
    data = {"images": [{"id": 1, "file_name": "a.jpg", "width": 100, "height": 80}], "annotations": annotations,
            "categories": [{"id": 3, "name": "cat"}]}
    (tmp_path / "instances_train.json").write_text(json.dumps(data))
    report = check_dataset(tmp_path / "instances_train.json")
    assert [(e.code, e.line, e.message) for e in report.errors][:1] == [(
        "parse_error", 7, "instances_train.json annotation id 7: bbox [40, 30, 90, 70] passes the 100x80 image as "
        "[x, y, width, height] but fits it as [x1, y1, x2, y2]; COCO bboxes are [x, y, width, height] (write width = "
        "x2 - x1, height = y2 - y1)")]
    assert main(["check", str(tmp_path / "instances_train.json")]) == 1
    assert "annotation id 7: bbox [40, 30, 90, 70] passes the 100x80 image" in capsys.readouterr().out


def test_voc_files_in_a_symlink_loop_are_listed_not_dropped(tmp_path):
    for stem in ["a", "b"]:
        write_image(tmp_path / f"{stem}.jpg", 64, 48)
        (tmp_path / f"{stem}.xml").write_text(
            f"<annotation><filename>{stem}.jpg</filename><size><width>64</width><height>48</height></size><object>"
            "<name>cat</name><bndbox><xmin>10</xmin><ymin>10</ymin><xmax>30</xmax><ymax>30</ymax></bndbox></object>"
            "</annotation>")
    (tmp_path / "l1.xml").symlink_to("l2.xml")
    (tmp_path / "l2.xml").symlink_to("l1.xml")
    (tmp_path / "gone.xml").symlink_to("missing.xml")
    (tmp_path / "b.jpg").unlink()
    (tmp_path / "b.jpg").symlink_to("b.jpg")
    report = check_dataset(tmp_path)
    assert [(e.code, e.message) for e in report.errors] == [
        ("broken_link", "b.jpg: is a symbolic link in a loop, so it cannot be read"),
        ("broken_link", "gone.xml: is a symbolic link to missing.xml, which does not exist, so it cannot be read"),
        ("broken_link", "l1.xml: is a symbolic link in a loop, so it cannot be read"),
        ("broken_link", "l2.xml: is a symbolic link in a loop, so it cannot be read")]
    assert report.stats["train"]["images"] == 1


def test_yolo_images_in_a_symlink_loop_are_listed_not_dropped(tmp_path):
    root = yolo_folder(tmp_path / "d", {"a": "0 0.5 0.5 0.2 0.2\n"})
    (root / "images" / "l1.jpg").symlink_to("l2.jpg")
    (root / "images" / "l2.jpg").symlink_to("l1.jpg")
    assert [(e.code, e.message) for e in check_dataset(root).errors] == [
        ("broken_link", f"images/{name}: is a symbolic link in a loop, so it cannot be read") for name in
        ["l1.jpg", "l2.jpg"]]

"""The last weak cases of the hostile audit: a folder that cannot be listed, links in a loop, YOLO lines glued by a
missing final newline, COCO boxes written as xyxy, and folder sources with subfolders."""

import json
from pathlib import Path

import pytest
from PIL import Image

from builders import biased_model
from ssd.cli import main
from ssd.data.check import check_dataset
from ssd.data.load import load_dataset
from ssd.data.yolo import GLUED_HINT
from ssd.inference.detector import load
from ssd.inference.sources import predict_source
from ssd.weights.checkpoint import save_checkpoint


# Private writers, not builders.make_dataset: the tests give the exact label text and folders to refuse.
def save_image(path, size=(64, 48)):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (90, 120, 150)).save(path)
    return path


def test_folder_source_reads_its_subfolders_sorted_and_mirrors_them(tmp_path):
    source = tmp_path / "photos"
    for name in ["b.png", "a/x.png", "a/deeper/y.jpg", "c/z.png"]:
        save_image(source / name)
    (source / "notes.txt").write_text("not an image")
    (source / "a" / "loop1.png").symlink_to("loop2.png")
    (source / "a" / "loop2.png").symlink_to("loop1.png")
    weights = save_checkpoint(tmp_path / "best.pt", biased_model("ssd_tiny"))
    summary = predict_source(load(weights), source, tmp_path / "out", progress=False)
    assert summary.images == 4
    files = [entry["file"] for entry in json.loads(summary.results_file.read_text())["images"]]
    assert files == [str(source / name) for name in ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]]
    drawn = sorted(str(p.relative_to(tmp_path / "out")) for p in (tmp_path / "out").rglob("*.*g"))
    assert drawn == ["a/deeper/y.jpg", "a/x.png", "b.png", "c/z.png"]
    assert [name for name, _ in summary.skipped] == [str(source / "a" / "loop1.png"), str(source / "a" / "loop2.png")]
    assert all("symbolic links" in reason for _, reason in summary.skipped)


def yolo_folder(root, labels: dict[str, str]):
    """``root/images/<stem>.jpg`` (64 x 48) and ``root/labels/<stem>.txt`` holding the given text, one class."""
    for stem, text in labels.items():
        save_image(root / "images" / f"{stem}.jpg")
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
    save_image(tmp_path / "images" / "a.jpg", (100, 80))
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
        save_image(tmp_path / f"{stem}.jpg")
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

"""`ssd data convert` reads a YOLO data.yaml lazily (records written as they are read, none held): the lazy reader
gives the records and issues of the eager one, and problems met while reading refuse the output (nothing left)."""

import json

import pytest

from builders import write_image
from ssd.data.commands.convert import convert_dataset
from ssd.data.load import load_dataset
from ssd.errors import DataError


@pytest.fixture
def yolo(tmp_path):
    """A YOLO data.yaml dataset: train (a.jpg two boxes, b.jpg none), val (c.jpg one box), names [cat, dog], and
    a flags file for a.jpg's second box."""
    root = tmp_path / "y"
    for split, stem, lines in (("train", "a", "0 0.5 0.5 0.25 0.5\n1 0.25 0.25 0.125 0.25\n"), ("train", "b", ""),
                               ("val", "c", "1 0.5 0.5 0.5 0.5\n")):
        write_image(root / "images" / split / f"{stem}.jpg", 64, 48)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split / f"{stem}.txt").write_text(lines)
    (root / "flags.jsonl").write_text(json.dumps({"file": "labels/train/a.txt", "line": 2, "difficult": True,
                                                  "iscrowd": False, "occluded": True, "z_order": 4}) + "\n")
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [cat, dog]\nflags: flags.jsonl\n")
    return root


def _values(splits):
    return {s: [(r.path, r.annotation, r.width, r.height, r.objects) for r in records] for s, records in splits.items()}


def test_the_lazy_reader_gives_the_eager_records_and_issues(yolo, tmp_path):
    (yolo / "labels" / "val" / "c.txt").write_text("1 0.5 0.5 0.5\n")  # a parse error, met when c is reached
    eager, lazy = load_dataset(yolo), load_dataset(yolo, lazy=True)
    assert not isinstance(lazy.splits["train"], list) and lazy.issues == []  # nothing read yet
    assert _values({s: list(r) for s, r in lazy.splits.items()}) == _values(eager.splits)
    assert lazy.issues == eager.issues and [i.code for i in lazy.issues] == ["parse_error"]
    a = eager.splits["train"][0].objects[1]
    assert (a.difficult, a.iscrowd, a.occluded, a.truncated, a.z_order) == (True, False, True, False, 4)


def test_xml_beside_the_images_is_still_read_lazily(tmp_path):
    """A data.yaml over images with VOC XML beside them (no .txt): the lazy split holds its records until the end,
    then reads the XML as the eager reader does."""
    write_image(tmp_path / "train" / "a.jpg", 64, 48)
    (tmp_path / "train" / "a.xml").write_text("<annotation><object><name>dog</name><bndbox><xmin>11</xmin><ymin>11"
                                              "</ymin><xmax>20</xmax><ymax>20</ymax></bndbox></object></annotation>")
    (tmp_path / "data.yaml").write_text("train: train\nnames: [cat, dog]\n")
    lazy = load_dataset(tmp_path / "data.yaml", lazy=True)
    [a] = list(lazy.splits["train"])
    assert [(o.name, o.label, o.box) for o in a.objects] == [("dog", 1, (10.0, 10.0, 19.0, 19.0))]
    assert lazy.issues == load_dataset(tmp_path / "data.yaml").issues == []


@pytest.mark.parametrize(("label", "flags", "said"), [
    ("0 0.5 0.5 0.5\n", None, r"1 problem\(s\) in the dataset.*labels/val/c.txt:1: '0 0.5 0.5 0.5' has 4 values"),
    ("7 0.5 0.5 0.5 0.5\n", None, r"labels/val/c.txt:1: class 'class 7' is not one of the dataset's 2 classes"),
    ("1 0.5 0.5 0.5 0.5\n", {"file": "labels/val/c.txt", "line": 2}, r"flags.jsonl:2: labels/val/c.txt line 2 is no "
                                                                      "object of the dataset"),
])
def test_a_problem_met_while_reading_refuses_the_output(yolo, tmp_path, label, flags, said):
    (yolo / "labels" / "val" / "c.txt").write_text(label)
    if flags:
        with open(yolo / "flags.jsonl", "a") as f:
            f.write(json.dumps(flags) + "\n")
    with pytest.raises(DataError, match=said):
        convert_dataset(yolo, tmp_path / "out", "coco")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["y"]  # no output, no staging folder left


def test_yolo_to_coco_streamed_equals_the_source(yolo, tmp_path):
    summary = convert_dataset(yolo, tmp_path / "c", "coco")
    assert str(summary) == f"wrote {tmp_path / 'c'} (coco; train: 2 images, 2 objects, val: 1 images, 1 objects)"
    assert _values(load_dataset(yolo).splits).keys() == load_dataset(tmp_path / "c").splits.keys()
    ann = json.loads((tmp_path / "c" / "annotations" / "train.json").read_text())["annotations"][1]
    assert ann == {"id": 2, "image_id": 1, "category_id": 2, "bbox": [12.0, 6.0, 8.0, 12.0], "area": 96.0,
                   "iscrowd": 0, "difficult": 1, "attributes": {"occluded": True, "z_order": 4}}

"""The LabelMe reader on files shaped as LabelMe 5 saves them (tests/data/labelme), through load, check and gate."""

import json
import shutil
from pathlib import Path

import pytest

from builders import write_image
from ssd.data import check_dataset, load_dataset
from ssd.data.gate import load_training_data
from ssd.data.index import index_dataset
from ssd.data.tools import read_tools
from test_data_index import reads, settle

FIXTURES = Path(__file__).parent / "data" / "labelme"


@pytest.fixture
def labelme(tmp_path):
    """``a.json`` (a rectangle drawn bottom-right to top-left, a polygon, a circle and a line) beside ``a.jpg``;
    ``b.json`` naming ``..\\pictures\\b.jpg`` Windows-style."""
    folder = tmp_path / "labelme"
    folder.mkdir()
    shutil.copy(FIXTURES / "a.json", folder)
    shutil.copy(FIXTURES / "b.json", folder)
    write_image(folder / "a.jpg", 40, 30)
    write_image(tmp_path / "pictures" / "b.jpg", 50, 20)
    return folder


def test_labelme_rectangles_polygons_and_other_shapes(labelme):
    spec = load_dataset(labelme)
    assert spec.format == "labelme" and spec.class_names == ["cat", "dog"] and list(spec.splits) == ["train"]
    a, b = spec.splits["train"]
    assert (a.path.name, a.width, a.height, a.annotation.name) == ("a.jpg", 40, 30, "a.json")
    dog, cat = a.objects
    assert dog.box == (4.0, 2.0, 30.0, 22.5) and dog.label == 1 and dog.where == "a.json shape 1 (dog)"
    assert cat.box == (10.0, 5.0, 20.0, 25.0) and cat.label == 0 and cat.line == 2  # the polygon's bounding box
    assert b.path == labelme.parent / "pictures" / "b.jpg" and b.objects[0].box == (0.0, 0.0, 50.0, 20.0)
    codes = sorted((i.code, i.line) for i in spec.issues)
    assert codes == [("polygon_as_box", None), ("shape_not_read", 3), ("shape_not_read", 4)]
    circle = next(i for i in spec.issues if i.line == 3)
    assert circle.message == ("a.json shape 3 (cat): a 'circle' has no box and is not read (draw a rectangle or a "
                              "polygon)") and circle.image == a.path
    [polygons] = [i for i in spec.issues if i.code == "polygon_as_box"]
    assert polygons.message == ("1 polygon(s) of the labelme annotations are read as their bounding boxes (this "
                                "detector learns boxes): a.json shape 2 (cat)")


def test_labelme_check_reports_the_polygon_summary_once(labelme):
    report = check_dataset(labelme)
    assert [i.code for i in report.issues].count("polygon_as_box") == 1
    assert not [i for i in report.issues if i.severity == "error"]


def test_labelme_split_folders_are_splits(tmp_path, labelme):
    root = tmp_path / "splits"
    shutil.copytree(labelme, root / "train")
    (root / "valid").mkdir()
    shutil.copy(FIXTURES / "a.json", root / "valid" / "c.json")
    write_image(root / "valid" / "a.jpg", 40, 30)
    spec = load_dataset(root)
    assert sorted(spec.splits) == ["train", "val"] and spec.format == "labelme"
    missing = [i for i in spec.issues if i.code == "missing_image"]
    assert [i.message for i in missing] == ["train/b.json: image '..\\\\pictures\\\\b.jpg' not found (imagePath is "
                                            "relative to train)"]
    assert [r.path.name for r in spec.splits["val"]] == ["a.jpg"]


@pytest.mark.parametrize("shapes, message", [
    ([{"label": "dog", "points": [[1, 2]], "shape_type": "rectangle"}],
     "x.json shape 1 (dog): points [[1, 2]] are not 2 [x, y] pairs for a 'rectangle'"),
    ([{"label": "", "points": [[1, 2], [3, 4]], "shape_type": "rectangle"}], "x.json shape 1 (no label): "),
    ([{"label": "dog", "points": [[1, True], [3, 4]], "shape_type": "rectangle"}], "x.json shape 1 (dog): points"),
    ([{"label": "dog", "points": [[1, 2], [3, 4]]}], "x.json shape 1 (dog): points [[1, 2], [3, 4]] are not 3 or "
     "more [x, y] pairs for a 'polygon'"),  # no shape_type: a polygon (LabelMe < 3)
])
def test_labelme_bad_shapes_name_file_shape_value_and_rule(tmp_path, shapes, message):
    write_image(tmp_path / "x.jpg", 10, 10)
    (tmp_path / "x.json").write_text(json.dumps({"shapes": shapes, "imagePath": "x.jpg"}))
    [issue] = [i for i in read_tools(tmp_path, {"train": tmp_path}).issues if i.code == "parse_error"]
    assert issue.message.startswith(message) and issue.severity == "error" and issue.line == 1


def test_labelme_unparseable_file_and_embedded_image(tmp_path):
    write_image(tmp_path / "ok.jpg", 10, 10)
    (tmp_path / "ok.json").write_text(json.dumps({"shapes": [{"label": "dog", "points": [[1, 1], [5, 5]],
                                                              "shape_type": "rectangle"}], "imagePath": "ok.jpg"}))
    (tmp_path / "bad.json").write_text('{"shapes": [\n{"label": "dog",,}]}')
    (tmp_path / "embedded.json").write_text(json.dumps({"shapes": [], "imagePath": "", "imageData": "aGk="}))
    messages = sorted(i.message for i in load_dataset(tmp_path).issues if i.severity == "error")
    assert messages == ["bad.json:2: JSON does not parse (Expecting property name enclosed in double quotes)",
                        "embedded.json: image '' not found (imagePath is relative to .)",
                        "embedded.json: the image is embedded in 'imageData' only: save it as a file beside the "
                        "JSON and name it in 'imagePath'"]


def test_labelme_gate_trains_on_it(labelme):
    spec = load_training_data(labelme, splits=("train",), skip_invalid=False)
    assert spec.splits["train"].num_objects == 3


def test_labelme_index_reads_only_the_file_that_changed(labelme):
    settle(labelme.parent)
    index_dataset(labelme)
    assert reads(labelme) == []
    shape = json.loads((labelme / "b.json").read_text())
    shape["shapes"][0]["label"] = "dog"
    (labelme / "b.json").write_text(json.dumps(shape))
    settle(labelme.parent)
    assert reads(labelme) == [("labelme", "b.json")]
    assert [o.name for o in index_dataset(labelme).spec.records("train")[1].objects] == ["dog"]

"""`ssd data convert` keeps every attribute a format can hold (difficult, crowd, occluded, truncated, z_order) through
every pair of formats and back, over unicode file and class names and an image without objects, and its report
counts, per attribute, what the format in the middle could not hold."""

import itertools
import json

import pytest

from builders import write_image
from ssd.data.commands.convert import convert_dataset
from ssd.data.commands.formats import ATTRIBUTES, HOLDS
from ssd.data.gate import load_training_data
from ssd.data.load import load_dataset

_NAMES = ["élan", "猫", "zèbre"]
_IMAGES = {  # split, file -> objects: (category id, [x, y, w, h], iscrowd, difficult, attributes)
    ("train", "a.jpg"): [(3, [10, 20, 30, 20.5], 0, 1, {"occluded": True, "z_order": 2}),
                         (1, [0, 0, 63, 47], 0, 0, {"truncated": True})],
    ("train", "b.jpg"): [(3, [4.5, 5, 24.5, 34.25], 1, 0, {}), (2, [1, 2, 3, 4], 0, 1, {"occluded": True})],
    ("train", "ünïcödé_写真.jpg"): [],
    ("val", "c.jpg"): [(1, [2, 3, 17, 26], 0, 0, {})],
}
_SET = {"difficult": 2, "iscrowd": 1, "occluded": 2, "truncated": 1, "z_order": 1}
"""How many objects of _IMAGES have each attribute set."""
_FORMATS = ("voc", "coco", "yolo", "labelstudio")


@pytest.fixture
def coco(tmp_path):
    """A COCO dataset (train and val files) holding every attribute, in CVAT's ``attributes`` for occluded,
    truncated and z_order."""
    root = tmp_path / "src"
    (root / "annotations").mkdir(parents=True)
    for split in ("train", "val"):
        images, annotations = [], []
        for (s, name), objects in _IMAGES.items():
            if s != split:
                continue
            write_image(root / "images" / split / name, 64, 48)
            images.append({"id": len(images) + 1, "file_name": f"{split}/{name}", "width": 64, "height": 48})
            annotations += [{"id": len(annotations) + k, "image_id": len(images), "category_id": cat, "bbox": bbox,
                             "area": bbox[2] * bbox[3], "iscrowd": crowd, "difficult": difficult,
                             "attributes": attributes}
                            for k, (cat, bbox, crowd, difficult, attributes) in enumerate(objects, start=1)]
        (root / "annotations" / f"{split}.json").write_text(json.dumps(
            {"images": images, "annotations": annotations,
             "categories": [{"id": i + 1, "name": n} for i, n in enumerate(_NAMES)]}, ensure_ascii=False),
            encoding="utf-8")
    return root


def _records(spec, attributes=tuple(ATTRIBUTES)):
    """Every split's records as comparable values: file name, size, objects (box to 1e-6 px, name, label, and the
    values of ``attributes``)."""
    return spec.class_names, {split: sorted((r.path.name, r.width, r.height, [
        (tuple(round(v, 6) for v in o.box), o.name, o.label, *(getattr(o, a) for a in attributes))
        for o in r.objects]) for r in records) for split, records in spec.splits.items()}


def test_the_source_holds_every_attribute(coco):
    names, splits = _records(load_dataset(coco))
    assert names == _NAMES
    train = {name: objects for name, _, _, objects in splits["train"]}
    assert train["a.jpg"] == [((10.0, 20.0, 40.0, 40.5), "zèbre", 2, True, False, True, False, 2),
                              ((0.0, 0.0, 63.0, 47.0), "élan", 0, False, False, False, True, 0)]
    assert train["b.jpg"] == [((4.5, 5.0, 29.0, 39.25), "zèbre", 2, False, True, False, False, 0),
                              ((1.0, 2.0, 4.0, 6.0), "猫", 1, True, False, True, False, 0)]
    assert train["ünïcödé_写真.jpg"] == []


@pytest.mark.parametrize(("first", "middle"), list(itertools.permutations(_FORMATS, 2)))
def test_every_pair_of_formats_and_back(coco, tmp_path, first, middle):
    """source -> first -> middle -> first: the records of ``first`` again, for the attributes both ends hold, and
    the report of first -> middle names (counted) what ``middle`` could not hold of what ``first`` held."""
    a, b, again = tmp_path / "a", tmp_path / "b", tmp_path / "again"
    convert_dataset(coco, a, first)
    kept = HOLDS[first]
    assert _records(load_dataset(a), kept) == _records(load_dataset(coco), kept)
    summary = convert_dataset(a, b, middle, images="copy")
    assert summary.dropped == {k: _SET[k] for k in kept if k not in HOLDS[middle]}
    convert_dataset(b, again, first)
    both = [k for k in kept if k in HOLDS[middle]]
    assert _records(load_dataset(again), both) == _records(load_dataset(a), both)
    lost = [k for k in kept if k not in HOLDS[middle]]
    assert all(not any(getattr(o, k) for r in recs for o in r.objects)
               for k in lost for recs in load_dataset(again).splits.values())


def test_the_report_counts_what_the_target_cannot_hold(coco, tmp_path, ssd_messages):
    summary = convert_dataset(coco, tmp_path / "ls", "labelstudio")
    lost = ("labelstudio cannot hold: 2 difficult flags, 1 crowd flag, 2 occluded flags, 1 truncated flag, 1 z_order "
            "value (the objects are written without them)")
    assert str(summary) == (f"wrote {tmp_path / 'ls'} (labelstudio; train: 3 images, 4 objects, val: 1 images, "
                            f"1 objects); {lost}")
    assert lost in ssd_messages()
    voc = convert_dataset(coco, tmp_path / "voc", "voc")
    assert voc.lost() == "voc cannot hold: 1 z_order value (the objects are written without them)"
    assert convert_dataset(coco, tmp_path / "yolo", "yolo").dropped == {}


def test_what_each_format_writes_of_the_attributes(coco, tmp_path):
    convert_dataset(coco, tmp_path / "coco", "coco")
    anns = json.loads((tmp_path / "coco" / "annotations" / "train.json").read_text(encoding="utf-8"))["annotations"]
    assert [a.get("attributes") for a in anns] == [{"occluded": True, "z_order": 2}, {"truncated": True}, None,
                                                   {"occluded": True}]
    convert_dataset(coco, tmp_path / "voc", "voc")
    xml = (tmp_path / "voc" / "Annotations" / "a.xml").read_text(encoding="utf-8")
    assert "<truncated>0</truncated>\n    <difficult>1</difficult>\n    <occluded>1</occluded>" in xml
    assert "<name>élan</name>\n    <truncated>1</truncated>\n    <difficult>0</difficult>\n    <bndbox>" in xml
    convert_dataset(coco, tmp_path / "yolo", "yolo")
    flags = [json.loads(line) for line in (tmp_path / "yolo" / "flags.jsonl").read_text().splitlines()]
    assert flags[0] == {"file": "labels/train/a.txt", "line": 1, "difficult": True, "iscrowd": False,
                        "occluded": True, "z_order": 2}
    assert len(flags) == 4


def test_cvat_attributes_reach_coco_and_back(tmp_path):
    """A CVAT export (which convert reads but does not write): occluded and z_order kept through COCO and YOLO."""
    root = tmp_path / "cvat"
    write_image(root / "images" / "ünï.jpg", 64, 48)
    write_image(root / "images" / "empty.jpg", 64, 48)
    (root / "annotations.xml").write_text(
        '<?xml version="1.0" encoding="utf-8"?>\n<annotations><version>1.1</version><meta><task><labels>'
        "<label><name>猫</name></label><label><name>car</name></label></labels></task></meta>"
        '<image id="0" name="ünï.jpg" width="64" height="48">'
        '<box label="car" occluded="1" source="manual" xtl="4.5" ytl="6" xbr="30.25" ybr="40" z_order="3"/>'
        '<box label="猫" occluded="0" source="manual" xtl="40" ytl="10" xbr="50" ybr="30" z_order="0"/></image>'
        '<image id="1" name="empty.jpg" width="64" height="48"></image></annotations>', encoding="utf-8")
    convert_dataset(root, tmp_path / "coco", "coco")
    convert_dataset(tmp_path / "coco", tmp_path / "yolo", "yolo")
    expected = _records(load_dataset(root))
    assert expected[1]["train"][1][3][0] == ((4.5, 6.0, 30.25, 40.0), "car", 1, False, False, True, False, 3)
    assert _records(load_dataset(tmp_path / "coco")) == _records(load_dataset(tmp_path / "yolo")) == expected


def test_truncated_and_occluded_survive_the_index(tmp_path):
    """VOC's truncated and occluded flags on the records the dataset index stores and gives back (a warm start)."""
    write_image(tmp_path / "a.jpg", 64, 48)
    (tmp_path / "a.xml").write_text("<annotation>" + "".join(
        f"<object><name>{name}</name><truncated>{t}</truncated><occluded>{o}</occluded><bndbox><xmin>2</xmin>"
        "<ymin>2</ymin><xmax>30</xmax><ymax>30</ymax></bndbox></object>" for name, t, o in (("cat", 1, 0),
                                                                                           ("dog", 0, 1))) +
        "</annotation>")
    for _ in range(2):  # built, then read back from the index
        a = load_training_data(tmp_path, splits=("train",)).splits["train"][0]
        assert [(o.name, o.truncated, o.occluded) for o in a.objects] == [("cat", True, False), ("dog", False, True)]

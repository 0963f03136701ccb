"""Readers on small hand-written VOC / YOLO / COCO fixtures, format detection, class lists, image decoding."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from builders import make_dataset, write_image
from ssd.data import check_dataset, load_dataset, read_image, read_image_size
from ssd.data.coco import read_coco
from ssd.data.synthetic import SHAPE_NAMES
from ssd.errors import DataError

# torchvision 0.29 flags its (working) decoders as deprecated in favour of TorchCodec, not a dependency here.


# Private writers, not builders.make_dataset: the exact annotation text is what each reader test reads.
def _voc_object(name, box, difficult=0):
    x1, y1, x2, y2 = box
    return (f"<object><name>{name}</name><difficult>{difficult}</difficult><bndbox><xmin>{x1}</xmin><ymin>{y1}</ymin>"
            f"<xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>")


def _voc_xml(path: Path, objects: str, size=(0, 0)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"<annotation><size><width>{size[0]}</width><height>{size[1]}</height></size>{objects}"
                    "</annotation>")


@pytest.fixture
def voc_dir(tmp_path):
    root = tmp_path / "VOCdevkit" / "VOC2007"
    write_image(root / "JPEGImages" / "a.jpg", 40, 30)
    write_image(root / "JPEGImages" / "b.jpg", 50, 20)
    _voc_xml(root / "Annotations" / "a.xml", _voc_object("dog", (1, 1, 10, 20)) + _voc_object("cat", (5, 6, 7, 8), 1))
    _voc_xml(root / "Annotations" / "b.xml", _voc_object("cat", (11, 2, 50, 20)), size=(999, 999))
    (root / "ImageSets" / "Main").mkdir(parents=True)
    (root / "ImageSets" / "Main" / "train.txt").write_text("a\n")
    (root / "ImageSets" / "Main" / "val.txt").write_text("b\n")
    (root / "ImageSets" / "Main" / "cat_train.txt").write_text("a 1\n")  # per-class list: not a split
    return tmp_path


def test_voc_devkit_layout(voc_dir):
    spec = load_dataset(voc_dir)
    assert spec.format == "voc" and spec.class_names == ["cat", "dog"]
    assert sorted(spec.splits) == ["train", "val"]
    a = spec.splits["train"][0]
    assert (a.width, a.height) == (40, 30)
    dog, cat = a.objects
    assert dog.box == (0.0, 0.0, 9.0, 19.0) and dog.label == 1 and not dog.difficult  # 1-based -> 0-based
    assert cat.label == 0 and cat.difficult and cat.ignore and cat.line == 2
    assert cat.where.endswith("a.xml object 2 (cat)")
    b = spec.splits["val"][0]
    assert (b.width, b.height) == (50, 20)  # from the image, not <size>


def test_voc_user_class_names_reorder_and_reject(voc_dir):
    spec = load_dataset(voc_dir, class_names=["dog", "cat", "bird"])
    assert spec.splits["train"][0].objects[0].label == 0
    with pytest.raises(DataError, match=r"unknown: 'cat' \(closest: 'Cat'\)") as e:
        load_dataset(voc_dir, class_names=["dog", "Cat"])
    assert "['cat', 'dog']" in str(e.value)


def test_voc_flat_folder_and_parse_error(tmp_path):
    write_image(tmp_path / "x.jpg", 10, 10)
    _voc_xml(tmp_path / "x.xml", _voc_object("a", (1, 1, 5, 5)))
    write_image(tmp_path / "y.jpg", 10, 10)
    (tmp_path / "y.xml").write_text("<annotation>\n<object>\n</annotation>")
    spec = load_dataset(tmp_path, split="train")
    assert [r.path.name for r in spec.splits["train"]] == ["x.jpg", "y.jpg"]
    (issue,) = spec.issues
    assert issue.code == "parse_error" and issue.file == "y.xml" and issue.line == 3


def _yolo(root: Path, names_yaml: str) -> Path:
    write_image(root / "images" / "train" / "p.jpg", 100, 50)
    write_image(root / "images" / "train" / "q.jpg", 100, 50)
    write_image(root / "images" / "train" / "r.jpg", 100, 50)
    write_image(root / "images" / "val" / "s.jpg", 100, 50)
    (root / "labels" / "train").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    (root / "labels" / "train" / "p.txt").write_text("0 0.5 0.5 0.2 0.4\n\n1 0.1 0.2 0.2 0.2\n")
    (root / "labels" / "train" / "q.txt").write_text("")  # empty: no objects; r has no label file at all
    (root / "labels" / "val" / "s.txt").write_text("1 0.1 0.1 0.3 0.1 0.2 0.5\n")  # polygon -> its box
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images/train\nval: images/val\n{names_yaml}\n")
    return root / "data.yaml"


@pytest.mark.parametrize("names", ["names: [ant, bee]", "names:\n  0: ant\n  1: bee"])
def test_yolo_yaml(tmp_path, names):
    spec = load_dataset(_yolo(tmp_path, names))
    assert spec.format == "yolo" and spec.class_names == ["ant", "bee"]
    p, q, r = spec.splits["train"]
    assert torch.allclose(torch.tensor([o.box for o in p.objects]), torch.tensor([[40.0, 15, 60, 35], [0, 5, 20, 15]]))
    assert [o.line for o in p.objects] == [1, 3] and p.objects[1].name == "bee"
    assert q.objects == [] and r.objects == [] and r.annotation is None
    assert [i.code for i in spec.issues] == ["missing_label_file", "short_polygon"]  # a triangle is said so
    (s,) = spec.splits["val"]
    assert s.objects[0].box == pytest.approx((10.0, 5.0, 30.0, 25.0))
    assert load_dataset(tmp_path).class_names == ["ant", "bee"]  # folder with a data.yaml


@pytest.mark.parametrize("names, message", [
    ("names:\n  0: ant\n  1: bee\n  1: wasp", r"data.yaml:7: YAML does not parse \(key '1' at line 7 is given twice "
                                             r"\(first at line 6\): only one value can be meant\)"),
    ("names:\n  0: ant\n  1.0: bee\n  1: wasp", r"key '1' at line 7 is given twice \(first at line 6 as '1.0'\)"),
    ("names:\n  0: ant\n  1: bee\n  '1': wasp", r"'names' key 1 is given twice \('bee' and 'wasp'\): each class id "
                                               "names one class"),
    ("names:\n  0: ant\n  1.5: bee", r"'names' key 1.5 is not a class id \(keys must be whole numbers 0, 1, ...\)"),
    ("names:\n  0: ant\n  true: bee", r"'names' key True is not a class id"),
    ("names:\n  0: ant\n  2: bee", r"'names' keys must be 0..1 without gaps, got \[0, 2\]"),
])
def test_yolo_names_dict_with_colliding_float_or_missing_keys_is_refused_naming_the_key(tmp_path, names, message):
    with pytest.raises(DataError, match=message) as info:
        load_dataset(_yolo(tmp_path, names))
    assert str(info.value).startswith(str(tmp_path / "data.yaml"))


def test_yolo_class_list_mismatch_lists_both(tmp_path):
    with pytest.raises(DataError, match=r"\['ant'\].*disagree.*\['ant', 'bee'\]"):
        load_dataset(_yolo(tmp_path, "names: [ant, bee]"), class_names=["ant"])


def test_yolo_nc_mismatch_and_missing_split(tmp_path):
    yaml_path = _yolo(tmp_path, "names: [ant, bee]\nnc: 3")
    with pytest.raises(DataError, match="nc: 3 disagrees with the 2 names"):
        load_dataset(yaml_path)
    yaml_path.write_text("train: nowhere/images\nnames: [a]\n")
    with pytest.raises(DataError, match="split 'train' points to .*nowhere/images, which does not exist"):
        load_dataset(yaml_path)


def test_coco(tmp_path):
    write_image(tmp_path / "images" / "1.jpg", 64, 48)
    write_image(tmp_path / "images" / "2.jpg", 64, 48)
    ann = {"images": [{"id": 7, "file_name": "1.jpg", "width": 64, "height": 48},
                      {"id": 8, "file_name": "2.jpg", "width": 64, "height": 48}],
           "categories": [{"id": 5, "name": "zebra"}, {"id": 2, "name": "yak"}],
           "annotations": [{"id": 1, "image_id": 7, "category_id": 5, "bbox": [1, 2, 10, 20], "iscrowd": 0},
                           {"id": 2, "image_id": 7, "category_id": 2, "bbox": [0, 0, 64, 48], "iscrowd": 1},
                           {"id": 3, "image_id": 8, "category_id": 9, "bbox": [0, 0, 5, 5]},
                           {"id": 4, "image_id": 8, "category_id": 2, "bbox": "oops"}]}
    (tmp_path / "annotations").mkdir()
    path = tmp_path / "annotations" / "instances_val.json"
    path.write_text(json.dumps(ann))
    spec = load_dataset(path)
    assert spec.format == "coco" and spec.class_names == ["yak", "zebra"] and list(spec.splits) == ["val"]
    one, two = spec.splits["val"]
    assert one.image_id == 7 and (one.width, one.height) == (64, 48)
    assert [(o.box, o.label, o.iscrowd) for o in one.objects] == [((1, 2, 11, 22), 1, False), ((0, 0, 64, 48), 0, True)]
    assert two.objects[0].label == -1 and two.objects[0].where == "instances_val.json annotation id 3"
    assert spec.category_ids == [2, 5]  # label k is the dataset's category category_ids[k]
    (issue,) = spec.issues
    assert issue.line == 4 and "bbox 'oops' is not [x, y, w, h]" in issue.message
    assert list(load_dataset(tmp_path).splits) == ["val"]  # folder detection


def test_detection_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_dataset(tmp_path / "nope")
    with pytest.raises(DataError, match="no dataset format recognised"):
        load_dataset(tmp_path)
    with pytest.raises(DataError, match="has no split 'test' \\(available: train, val\\)"):
        load_dataset(_yolo(tmp_path, "names: [a, b]"), split="test")


def test_read_image_modes_and_exif(tmp_path):
    gray = tmp_path / "g.png"
    Image.fromarray(np.full((5, 7), 200, np.uint8)).save(gray)
    rgba = tmp_path / "a.png"
    Image.new("RGBA", (3, 2), (10, 20, 30, 0)).save(rgba)
    pal = tmp_path / "p.gif"
    Image.new("P", (4, 4), 3).save(pal)
    assert read_image(gray).shape == (3, 5, 7) and int(read_image(gray)[1, 0, 0]) == 200
    assert read_image(rgba)[:, 0, 0].tolist() == [10, 20, 30]
    assert read_image(pal).shape == (3, 4, 4)
    rotated = tmp_path / "r.jpg"
    arr = np.zeros((10, 20, 3), np.uint8)
    arr[:, :10] = 255  # white left half
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to display
    Image.fromarray(arr).save(rotated, exif=exif, quality=100)
    img = read_image(rotated)
    assert img.shape == (3, 20, 10) and read_image_size(rotated) == (10, 20)
    assert img[:, :5].float().mean() > 200 and img[:, 15:].float().mean() < 50  # white half now on top
    bad = tmp_path / "bad.jpg"
    bad.write_bytes(b"not an image")
    with pytest.raises(DataError, match="bad.jpg: not an image"):
        read_image(bad)
    with pytest.raises(DataError, match="bad.jpg: not an image"):
        read_image(bad, min_size=8)


def test_read_image_reduced_jpeg_decode_keeps_min_size_and_orientation(tmp_path):
    # 1000x700 photo-like gradient, EXIF-rotated: decoded for a 300 px network at 1/2 scale (500x350 -> 350x500)
    y, x = np.mgrid[0:700, 0:1000]
    arr = np.stack([x * 255 // 999, y * 255 // 699, np.full_like(x, 90)], -1).astype(np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6
    path = tmp_path / "big.jpg"
    Image.fromarray(arr).save(path, exif=exif, quality=95)
    full, reduced = read_image(path), read_image(path, min_size=300)
    assert full.shape == (3, 1000, 700) and reduced.shape == (3, 500, 350)
    resized = torch.nn.functional.interpolate(full[None].float(), size=(500, 350), mode="area")[0]
    assert (resized - reduced.float()).abs().mean() < 2.0  # same picture, same orientation
    assert read_image(path, min_size=600).shape == (3, 1000, 700)  # not twice the size: full decode


def test_synthetic_through_voc_reader(synthetic_voc):
    spec = load_dataset(synthetic_voc)
    assert spec.format == "voc" and spec.class_names == list(SHAPE_NAMES[:3])
    assert len(spec.splits["train"]) == 48 and len(spec.splits["val"]) == 16 and not spec.issues
    objects = [o for r in spec.splits["train"] for o in r.objects]
    sides = torch.tensor([((o.box[2] - o.box[0]) * (o.box[3] - o.box[1])) ** 0.5 / 128 for o in objects])
    assert len(objects) >= 2 * 48 and sides.min() < 0.1 and sides.max() > 0.4
    assert {o.label for o in objects} == {0, 1, 2}
    assert any(o.box[0] == 0 or o.box[2] == 128 for o in objects)  # some touch the border


# --- COCO structure: malformed files, ids, categories --------------------------------------------------------------

def _coco(tmp_path: Path, **changes) -> Path:
    """A valid two-image COCO file with ``changes`` applied to its top-level keys; returns the JSON path."""
    write_image(tmp_path / "images" / "1.jpg", 64, 48)
    write_image(tmp_path / "images" / "2.jpg", 64, 48)
    ann = {"images": [{"id": 1, "file_name": "1.jpg", "width": 64, "height": 48},
                      {"id": 2, "file_name": "2.jpg", "width": 64, "height": 48}],
           "categories": [{"id": 90, "name": "zebra"}, {"id": 1, "name": "yak"}, {"id": 5, "name": "ox"}],
           "annotations": [{"id": 10, "image_id": 1, "category_id": 90, "bbox": [1, 2, 10, 20]},
                           {"id": 11, "image_id": 2, "category_id": 5, "bbox": [0, 0, 5, 5]}]}
    ann.update(changes)
    path = tmp_path / "instances_train.json"
    path.write_text(json.dumps(ann))
    return path


@pytest.mark.parametrize("change, message", [
    (dict(images=[{"id": 1, "file_name": "1.jpg"}, {"id": 2}]),
     r"images\[1\] \{'id': 2\} needs an 'id' .* and a 'file_name'"),
    (dict(images=[{"file_name": "1.jpg"}]), r"images\[0\] .* needs an 'id'"),
    (dict(images=[{"id": [1], "file_name": "1.jpg"}]), r"images\[0\] .* needs an 'id' \(integer or string\)"),
    (dict(categories=[{"name": "zebra"}]), r"categories\[0\] \{'name': 'zebra'\} needs an integer 'id' and a 'name'"),
    (dict(categories=[{"id": 1, "name": "a"}, {"id": 2}]), r"categories\[1\] .* needs an integer 'id' and a 'name'"),
    (dict(categories=[{"id": 1, "name": "a"}, {"id": 1, "name": "b"}]), r"category id 1 is listed twice"),
    (dict(annotations=[{"id": 1}, "oops"]), r"annotations\[1\] is 'oops', not an object"),
    (dict(images={"id": 1}), r"a COCO file needs a list 'images'"),
])
def test_coco_structure_errors_name_the_file_and_the_entry(tmp_path, change, message):
    path = _coco(tmp_path, **change)
    with pytest.raises(DataError, match=f"^{path}: {message}"):
        read_coco(path)


def test_coco_top_level_array_bom_and_bad_json(tmp_path):
    path = tmp_path / "a.json"
    path.write_text("[]")
    with pytest.raises(DataError, match=f"^{path}: a COCO file is a JSON object .* not a list"):
        read_coco(path)
    good = _coco(tmp_path)
    path.write_bytes(b"\xef\xbb\xbf" + good.read_bytes().replace(b"}, ", b"},\r\n"))  # BOM + CRLF
    assert read_coco(path).class_names == ["yak", "ox", "zebra"]
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(DataError, match=f"^{path}: cannot read the JSON \\(UnicodeDecodeError"):
        read_coco(path)
    path.write_text('{"images": [' + "9" * 5000 + "]}")  # Python refuses ints of over 4300 digits
    with pytest.raises(DataError, match=f"^{path}: cannot read the JSON \\(ValueError"):
        read_coco(path)


def test_coco_duplicate_image_ids_name_both_files(tmp_path):
    path = _coco(tmp_path, images=[{"id": 1, "file_name": "1.jpg"}, {"id": 1, "file_name": "2.jpg"}])
    with pytest.raises(DataError, match=r"image id 1 is listed twice: '1.jpg' \(images\[0\]\) and '2.jpg' "
                                        r"\(images\[1\]\); .*merged files"):
        read_coco(path)


def test_coco_category_ids_are_kept_for_writers(tmp_path):
    spec = load_dataset(_coco(tmp_path))
    assert spec.class_names == ["yak", "ox", "zebra"] and spec.category_ids == [1, 5, 90]
    labels = [o.label for r in spec.splits["train"] for o in r.objects]
    assert [spec.category_ids[k] for k in labels] == [90, 5]


def test_coco_annotation_defects_name_file_and_annotation(tmp_path):
    anns = [{"id": "ten", "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4]},
            {"id": 11, "image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4], "iscrowd": "0"},
            {"id": 12, "image_id": 1, "category_id": 1, "bbox": [True, 2, 3, 4]},
            {"id": 13, "image_id": [1], "category_id": 1, "bbox": [1, 2, 3, 4]},
            {"id": 14, "image_id": 2, "category_id": [1], "bbox": [1, 2, 3, 4]},
            {"id": 15, "image_id": 2, "category_id": 1, "bbox": [1, 2, 10 ** 400, 4]}]
    spec = read_coco(_coco(tmp_path, annotations=anns))
    messages = [i.message for i in spec.issues]
    assert messages == ["instances_train.json annotations[0]: id 'ten' is not an integer",
                        "instances_train.json annotation id 11: iscrowd '0' is not 0 or 1",
                        "instances_train.json annotation id 12: bbox [True, 2, 3, 4] is not [x, y, w, h] numbers",
                        "instances_train.json annotation id 13: image_id [1] is not in 'images'"]
    unknown, _ = spec.splits["train"][1].objects
    assert unknown.label == -1 and unknown.name == "category [1]"
    report = check_dataset(spec, decode_images=False)
    assert [(i.code, i.line) for i in report.errors if i.line in (14, 15)] == [("unknown_class", 14),
                                                                                ("non_finite", 15)]


def test_coco_xyxy_bbox_is_an_error_and_listed_size_is_compared(tmp_path):
    anns = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [30, 20, 60, 40]},  # xyxy: fits; xywh: past the edge
            {"id": 2, "image_id": 1, "category_id": 1, "bbox": [50, 20, 30, 10]}]  # x2 < x: plain xywh overflow
    images = [{"id": 1, "file_name": "1.jpg", "width": 64, "height": 48},
              {"id": 2, "file_name": "2.jpg", "width": 640, "height": 480}]
    spec = read_coco(_coco(tmp_path, annotations=anns, images=images))
    size, xyxy = spec.issues
    assert size.code == "size_mismatch" and size.severity == "warning"
    assert "image id 2: listed as 640x480 but 2.jpg is 64x48" in size.message
    assert (xyxy.severity, xyxy.code, xyxy.line) == ("error", "parse_error", 1)
    assert xyxy.message.endswith("annotation id 1: bbox [30, 20, 60, 40] passes the 64x48 image as [x, y, width, "
                                 "height] but fits it as [x1, y1, x2, y2]; COCO bboxes are [x, y, width, height] "
                                 "(write width = x2 - x1, height = y2 - y1)")
    [record] = (r for r in spec.records("train") if r.image_id == 1)
    assert [o.line for o in record.objects] == [2]  # the plain overflow stays a box for check's border rule


# --- YOLO layouts and label lines ------------------------------------------------------------------------------------

def test_yolo_images_folder_symlink_keeps_labels_beside_the_link(tmp_path):
    store = tmp_path / "elsewhere"
    write_image(store / "p.jpg", 100, 50)
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    (root / "images" / "train").symlink_to(store, target_is_directory=True)
    (root / "labels" / "train").mkdir(parents=True)
    (root / "labels" / "train" / "p.txt").write_text("0 0.5 0.5 0.2 0.4\n")
    (root / "data.yaml").write_text("train: images/train\nnames: [ant]\n")
    spec = load_dataset(root / "data.yaml")
    (record,) = spec.splits["train"]
    assert record.path == root / "images" / "train" / "p.jpg"
    assert record.annotation == root / "labels" / "train" / "p.txt"
    assert len(record.objects) == 1 and not spec.issues


def test_yolo_relative_yaml_path_from_another_folder(tmp_path, monkeypatch):
    write_image(tmp_path / "aq" / "train" / "images" / "p.jpg", 100, 50)
    (tmp_path / "aq" / "train" / "labels").mkdir()
    (tmp_path / "aq" / "train" / "labels" / "p.txt").write_text("0 0.5 0.5 0.2 0.4\n")
    (tmp_path / "aq" / "data.yaml").write_text("train: ../train/images\nval: train/images\nnames: [fish]\n")
    monkeypatch.chdir(tmp_path)
    spec = load_dataset("aq/data.yaml")
    assert [len(spec.splits[s][0].objects) for s in ("train", "val")] == [1, 1]
    assert spec.splits["train"][0].path == tmp_path / "aq" / "train" / "images" / "p.jpg"


def test_yolo_negative_class_reads_as_out_of_range(tmp_path):
    data = _yolo(tmp_path, "names: [ant, bee]")
    (tmp_path / "labels" / "train" / "q.txt").write_text("-1 0.5 0.5 0.2 0.2\n")
    report = check_dataset(data, decode_images=False)
    (error,) = report.errors
    assert error.code == "label_out_of_range" and error.file == "labels/train/q.txt" and error.line == 1
    assert "class -1 is out of range for 2 classes ['ant', 'bee'] (classes are 0..1)" in error.message


def test_yolo_bom_and_crlf_in_labels_class_list_and_image_list(tmp_path):
    write_image(tmp_path / "images" / "p.jpg", 100, 50)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "p.txt").write_bytes("\ufeff1 0.5 0.5 0.2 0.4\r\n0 0.1 0.2 0.2 0.2\r\n".encode())
    (tmp_path / "classes.txt").write_bytes("\ufeffant\r\nbee\r\n".encode())
    spec = load_dataset(tmp_path)
    assert spec.class_names == ["ant", "bee"] and not spec.issues
    assert [o.name for o in spec.splits["train"][0].objects] == ["bee", "ant"]
    (tmp_path / "train.txt").write_bytes("\ufeffimages/p.jpg\r\n".encode())
    (tmp_path / "data.yaml").write_bytes("\ufefftrain: train.txt\r\nnames: [ant, bee]\r\n".encode())
    assert len(load_dataset(tmp_path / "data.yaml").splits["train"][0].objects) == 2


@pytest.mark.parametrize("yaml_text, message", [
    ("train: images/train\nnames: []", r"'names' is empty"),
    ("train: images/train\nnames: [a, b]\nnc: three", r"nc: 'three' disagrees with the 2 names"),
    ("train: images/train\nnames: {a: x}", r"'names' key 'a' is not a class id"),
    ("train: images/train\nnames: [[a], b]", r"'names' must be plain names \(text\), got \['a'\]"),
    ("train: images/train\nnames: [a]\npath: [1]", r"'path' must be a folder \(text\)"),
    ("- a\n- b", r"a YOLO data.yaml needs 'names'"),
])
def test_yolo_yaml_values_are_checked(tmp_path, yaml_text, message):
    path = tmp_path / "data.yaml"
    path.write_text(yaml_text)
    with pytest.raises(DataError, match=f"^{path}: {message}"):
        load_dataset(path)


# --- VOC sizes and objects -------------------------------------------------------------------------------------------

def test_voc_size_disagreeing_with_the_image_warns_unless_rotated(tmp_path):
    write_image(tmp_path / "a.jpg", 50, 20)
    for size, warned in (((999, 999), True), ((20, 50), False), ((50, 20), False), ((0, 0), False), (("x", 3), True)):
        _voc_xml(tmp_path / "a.xml", _voc_object("cat", (2, 2, 9, 9)), size=size)
        issues = load_dataset(tmp_path).issues
        assert [i.code for i in issues] == (["size_mismatch"] if warned else []), size
    assert issues[0].severity == "warning" and issues[0].file == "a.xml"
    assert "<size> says xx3 but the image is 50x20" in issues[0].message


def test_voc_absurd_box_is_an_error_not_a_clipped_warning(tmp_path):
    write_image(tmp_path / "a.jpg", 50, 20)
    _voc_xml(tmp_path / "a.xml", _voc_object("cat", (1, 1, 1e12, 10)) + _voc_object("cat", (40, 1, 53, 10)))
    report = check_dataset(tmp_path, decode_images=False)
    assert [(i.severity, i.code, i.line) for i in report.issues] == [("error", "far_outside", 1),
                                                                     ("warning", "beyond_border", 2)]
    assert "extends more than the image's size past the 50x20 image" in report.errors[0].message


def test_voc_difficult_flag_values(tmp_path):
    write_image(tmp_path / "a.jpg", 50, 20)
    objects = "".join(_voc_object("cat", (1, 1, 9, 9), flag) for flag in ("maybe", "true", "No", " 1 "))
    _voc_xml(tmp_path / "a.xml", objects)
    spec = load_dataset(tmp_path)
    assert [o.difficult for o in spec.splits["train"][0].objects] == [False, True, False, True]
    (issue,) = spec.issues
    assert issue.severity == "warning" and issue.object_index == 0
    assert issue.message == "a.xml object 1 (cat): <difficult> is 'maybe', read as 0 (not difficult; write 0 or 1)"


def test_voc_bom_and_crlf_in_class_list_and_image_sets(voc_dir):
    root = voc_dir / "VOCdevkit" / "VOC2007"
    (root / "classes.txt").write_bytes("\ufeffdog\r\ncat\r\n".encode())
    (root / "ImageSets" / "Main" / "train.txt").write_bytes("\ufeffa\r\n".encode())
    spec = load_dataset(voc_dir)
    assert spec.class_names == ["dog", "cat"] and [r.image_id for r in spec.splits["train"]] == ["a"]
    (root / "classes.txt").write_bytes(b"\xff\xfed\x00")
    with pytest.raises(DataError, match="classes.txt: cannot read .*text files must be UTF-8"):
        load_dataset(voc_dir)


def test_the_same_scenes_in_yolo_and_coco_read_as_the_same_objects_and_their_bad_label_is_named(tmp_path):
    """builders.make_dataset writes one scene list in both formats: the readers agree to YOLO's 5 decimals."""
    yolo, coco = (load_dataset(make_dataset(fmt, tmp_path / fmt)) for fmt in ("yolo", "coco"))
    assert yolo.class_names == coco.class_names == ["a", "b", "c", "d", "e", "f"]
    assert coco.category_ids == [1, 2, 3, 4, 5, 6] and not yolo.issues and not coco.issues
    for split, count in (("train", 12), ("val", 4)):
        yolo_records = sorted(yolo.splits[split], key=lambda r: int(r.path.stem.removeprefix("img")))
        coco_records = sorted(coco.splits[split], key=lambda r: int(r.path.stem.removeprefix(split)))
        assert len(yolo_records) == len(coco_records) == count
        for a, b in zip(yolo_records, coco_records):
            assert (a.width, a.height, [o.name for o in a.objects]) == (b.width, b.height, [o.name for o in b.objects])
            assert [x for o in a.objects for x in o.box] == pytest.approx([x for o in b.objects for x in o.box],
                                                                           abs=1e-3)
    errors = {fmt: check_dataset(make_dataset(fmt, tmp_path / f"bad_{fmt}", bad_label=True)).errors
              for fmt in ("yolo", "coco")}
    assert [(e.code, e.file, e.line) for e in errors["yolo"]] == [("label_out_of_range", "labels/train/img5.txt", 3)]
    assert [e.message for e in errors["coco"]] == ["instances_train.json annotation id 13: unknown class name "
                                                   "'category 7'; known names: ['a', 'b', 'c', 'd', 'e', 'f']"]

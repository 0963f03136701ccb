"""Readers on small hand-written VOC / YOLO / COCO fixtures, format detection, class lists, image decoding."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from ssd.data import DataError, load_dataset, read_image, read_image_size
from ssd.data.synthetic import SHAPE_NAMES

# torchvision 0.29 flags its (working) decoders as deprecated in favour of TorchCodec, not a dependency here.
pytestmark = pytest.mark.filterwarnings("ignore:The image decoding:DeprecationWarning")


def _jpg(path: Path, w: int, h: int, colour=(120, 30, 200)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), colour).save(path)
    return path


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
    _jpg(root / "JPEGImages" / "a.jpg", 40, 30)
    _jpg(root / "JPEGImages" / "b.jpg", 50, 20)
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
    _jpg(tmp_path / "x.jpg", 10, 10)
    _voc_xml(tmp_path / "x.xml", _voc_object("a", (1, 1, 5, 5)))
    _jpg(tmp_path / "y.jpg", 10, 10)
    (tmp_path / "y.xml").write_text("<annotation>\n<object>\n</annotation>")
    spec = load_dataset(tmp_path, split="train")
    assert [r.path.name for r in spec.splits["train"]] == ["x.jpg", "y.jpg"]
    (issue,) = spec.issues
    assert issue.code == "parse_error" and issue.file == "y.xml" and issue.line == 3


def _yolo(root: Path, names_yaml: str) -> Path:
    _jpg(root / "images" / "train" / "p.jpg", 100, 50)
    _jpg(root / "images" / "train" / "q.jpg", 100, 50)
    _jpg(root / "images" / "train" / "r.jpg", 100, 50)
    _jpg(root / "images" / "val" / "s.jpg", 100, 50)
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
    assert [i.code for i in spec.issues] == ["missing_label_file"]
    (s,) = spec.splits["val"]
    assert s.objects[0].box == pytest.approx((10.0, 5.0, 30.0, 25.0))
    assert load_dataset(tmp_path).class_names == ["ant", "bee"]  # folder with a data.yaml


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
    _jpg(tmp_path / "images" / "1.jpg", 64, 48)
    _jpg(tmp_path / "images" / "2.jpg", 64, 48)
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

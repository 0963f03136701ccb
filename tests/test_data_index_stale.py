"""The index is never stale, never a crash: each test is a user's scenario that once gave stale data, a wrong number
or a traceback, and the mechanism that now prevents it."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import ssd.data.check as check_module
from builders import make_dataset, write_image
from ssd.data.check import check_dataset, find_issues
from ssd.data.disk_cache import disk_images
from ssd.data.gate import load_training_data
from ssd.data.index import index_dataset
from ssd.data.load import load_dataset
from ssd.errors import DataError
from ssd.limits import MAX_CLASSES
from test_data_index import reads, settle


def _yolo(root: Path, label_text: str = "0 0.5 0.5 0.2 0.2\n") -> Path:
    for split in ("train", "val"):
        write_image(root / "images" / split / "a.jpg", 32, 32)
        (root / "labels" / split).mkdir(parents=True)
        (root / "labels" / split / "a.txt").write_text(label_text)
    (root / "data.yaml").write_text("train: images/train\nval: images/val\nnames: [a]\n")
    return root / "data.yaml"


def test_a_yolo_class_id_of_twenty_digits_is_label_out_of_range_in_check_train_and_val(tmp_path):
    """Regression: the index packed labels into int64 before the rules saw them (OverflowError in table.py)."""
    data = _yolo(tmp_path, "0 0.5 0.5 0.2 0.2\n99999999999999999999 0.5 0.5 0.1 0.1\n")
    [error, _] = [i for i in check_dataset(data).errors if i.code == "label_out_of_range"]
    assert (error.file, error.line) == ("labels/train/a.txt", 2)
    assert error.message == ("labels/train/a.txt:2: class 99999999999999999999 is out of range (class ids are below "
                             f"{MAX_CLASSES:,}, the most classes a dataset may have; this dataset has 1)")
    for splits in (("train", "val"), ("val",)):  # ssd train's gate, ssd val's
        with pytest.raises(DataError, match=r"labels/(train|val)/a.txt:2: class 99999999999999999999 is out of"):
            load_training_data(data, splits=splits)


def test_more_class_names_than_max_classes_are_refused_when_the_names_are_read(tmp_path):
    names = [f"c{i}" for i in range(MAX_CLASSES + 1)]
    (tmp_path / "data.yaml").write_text(json.dumps({"train": "images", "names": names}))
    with pytest.raises(DataError, match=rf"data.yaml: {MAX_CLASSES + 1:,} 'names'; a dataset may have at most "
                                        rf"{MAX_CLASSES:,} classes"):
        load_dataset(tmp_path / "data.yaml")
    coco = tmp_path / "train.json"
    coco.write_text(json.dumps({"images": [], "annotations": [],
                                "categories": [{"id": i, "name": n} for i, n in enumerate(names)]}))
    with pytest.raises(DataError, match=rf"train.json: {MAX_CLASSES + 1:,} categories; a dataset may have at most"):
        load_dataset(coco)


def test_coco_image_ids_1_and_text_1_are_refused(tmp_path):
    """Regression: they were accepted, then collided in evaluation (class AP 0.0 instead of 1.0)."""
    for name in ("a.jpg", "b.jpg"):
        write_image(tmp_path / name, 16, 16)
    coco = tmp_path / "train.json"
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": "1", "file_name": "b.jpg"}],
                                "annotations": [], "categories": [{"id": 1, "name": "a"}]}))
    with pytest.raises(DataError, match=r"image ids 1 and '1' are one id as text, which evaluation and results files "
                                        r"tell images apart by: 'a.jpg' \(images\[0\]\) and 'b.jpg' \(images\[1\]\)"):
        load_dataset(coco)


def test_an_image_added_to_a_split_folder_outside_the_yaml_folder_is_seen_by_the_next_start(tmp_path):
    """Ultralytics' usual layout: data.yaml elsewhere, ``train:`` an absolute path."""
    images = tmp_path / "store"
    _yolo(images)
    description = tmp_path / "configs" / "data.yaml"
    description.parent.mkdir()
    description.write_text(f"train: {images / 'images' / 'train'}\nval: {images / 'images' / 'val'}\nnames: [a]\n")
    settle(tmp_path)
    assert len(index_dataset(description).spec.records("train")) == 1
    assert reads(description) == []
    write_image(images / "images" / "train" / "b.jpg", 32, 32)
    (images / "labels" / "train" / "b.txt").write_text("0 0.5 0.5 0.4 0.4\n")
    settle(tmp_path)
    assert reads(description) == [("decode", "b.jpg"), ("size", "b.jpg"), ("yolo", "b.txt")]
    assert [r.path.name for r in index_dataset(description).spec.records("train")] == ["a.jpg", "b.jpg"]
    (images / "labels" / "val" / "a.txt").unlink()  # a label file gone, then back: its labels folder is watched
    settle(tmp_path)
    assert index_dataset(description).spec.records("val")[0].objects == []
    (images / "labels" / "val" / "a.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    settle(tmp_path)
    assert reads(description) == [("yolo", "a.txt")]


def _rewrite_keeping_size_and_mtime(path: Path, data: bytes) -> None:
    """What ``cp -p``, ``touch -r`` and ``rsync --inplace -t`` leave: new content, the same size and mtime."""
    st = path.stat()
    assert len(data) == st.st_size
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def test_an_annotation_or_image_rewritten_in_place_with_its_mtime_restored_is_read_again(tmp_path):
    data = settle(make_dataset("voc", tmp_path / "voc", train=3, val=1, size=64, classes=2, seed=1))
    index_dataset(data)
    xml = data / "Annotations" / "synth_000001.xml"
    text = xml.read_bytes()
    _rewrite_keeping_size_and_mtime(xml, text.replace(b"<difficult>0</difficult>", b"<difficult>1</difficult>", 1))
    assert reads(data) == [("voc", "synth_000001.xml")]
    assert index_dataset(data).spec.records("train")[1].objects[0].difficult
    image = data / "JPEGImages" / "synth_000002.jpg"  # corrupted, its size and time kept: check must see it
    _rewrite_keeping_size_and_mtime(image, b"\0" * image.stat().st_size)
    assert [i.code for i in index_dataset(data).issues if i.severity == "error"] == ["corrupt_image"]


def test_a_coco_image_missing_on_the_first_run_then_put_in_place_is_found_by_the_next(tmp_path):
    """``annotations/train.json`` with its images in ``../images``: outside the folder the index walks."""
    for name in ("a.jpg", "b.jpg"):
        write_image(tmp_path / "images" / name, 16, 16)
    coco = tmp_path / "annotations" / "train.json"
    coco.parent.mkdir()
    coco.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg"}, {"id": 2, "file_name": "b.jpg"},
                                           {"id": 3, "file_name": "c.jpg"}],
                                "annotations": [{"id": i, "image_id": i, "category_id": 1, "bbox": [1, 1, 8, 8]}
                                                for i in (1, 2, 3)],
                                "categories": [{"id": 1, "name": "a"}]}))
    settle(tmp_path)
    assert [i.code for i in index_dataset(coco).issues if i.severity == "error"] == ["missing_image"]
    shutil.copy(tmp_path / "images" / "a.jpg", tmp_path / "images" / "c.jpg")
    settle(tmp_path)
    indexed = index_dataset(coco)
    assert [r.path.name for r in indexed.spec.records("train")] == ["a.jpg", "b.jpg", "c.jpg"]
    assert [i for i in indexed.issues if i.severity == "error"] == []


def test_an_image_rewritten_in_place_with_its_mtime_restored_is_decoded_again_by_the_disk_cache(tmp_path):
    image = tmp_path / "a.bmp"  # BMP: another colour, the same size
    Image.new("RGB", (8, 8), (1, 1, 1)).save(image)
    settle(tmp_path)

    def decode(i: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(Image.open(image).convert("RGB")).transpose(2, 0, 1).copy())
    sizes = np.array([[8, 8]])
    assert disk_images([str(image)], sizes, "t", decode).decoded == 1
    assert disk_images([str(image)], sizes, "t", decode).decoded == 0
    other = io.BytesIO()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(other, "BMP")
    _rewrite_keeping_size_and_mtime(image, other.getvalue())
    again = disk_images([str(image)], sizes, "t", decode)
    assert again.decoded == 1 and again.read(0, decode)[:, 0, 0].tolist() == [9, 9, 9]


def test_one_edited_annotation_costs_that_file_and_the_index_equals_a_cold_build(tmp_path, monkeypatch):
    """An edit cost a whole rebuild: every file's results decoded and every image's rules applied again. Now the
    edited file alone is read, the rules of the images it does not touch are their stored results, and the index
    (records, reader issues, check) equals a cold build's and a check without any index."""
    data = settle(make_dataset("voc", tmp_path / "voc", train=6, val=2, size=64, classes=3, seed=1))
    kept = data / "Annotations" / "synth_000003.xml"  # a near-duplicate and a box past the border: stored rules
    kept.write_text(kept.read_text().replace("</annotation>", "<object><name>circle</name><bndbox><xmin>3</xmin>"
                                             "<ymin>3</ymin><xmax>20</xmax><ymax>20</ymax></bndbox></object>" * 2
                                             + "<object><name>circle</name><bndbox><xmin>50</xmin><ymin>5</ymin>"
                                             "<xmax>67</xmax><ymax>9</ymax></bndbox></object></annotation>"))
    settle(data)
    splits = ("train", "val")
    assert index_dataset(data, splits=splits).reads and index_dataset(data, splits=None).reads == []
    edited = data / "Annotations" / "synth_000001.xml"  # one box now outside the image, one class unknown
    text = edited.read_text().replace("<xmin>25</xmin>", "<xmin>70</xmin>").replace("<xmax>35<", "<xmax>90<")
    edited.write_text("triangel".join(text.rsplit("triangle", 1)))
    settle(data)
    again = index_dataset(data, splits=splits)
    assert sorted((kind, Path(path).name) for kind, path in again.reads) == [("voc", "synth_000001.xml")]
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cold"))
    cold = index_dataset(data, splits=splits)
    unindexed = load_dataset(data)
    codes = {i.code for i in again.issues if i.image is not None}
    assert {"outside_image", "unknown_class", "duplicate_box", "beyond_border"} <= codes
    assert again.issues == cold.issues == find_issues(unindexed, splits, decode_images=True)
    assert again.spec.issues == cold.spec.issues == unindexed.issues
    for split, records in unindexed.splits.items():
        assert again.spec.splits[split] == cold.spec.splits[split] and len(records) == len(cold.spec.splits[split])
        assert [r.path for r in again.spec.splits[split]] == [r.path for r in records]
    assert reads(data, splits=splits) == []  # the cold build's index, whole


def test_after_one_edit_only_its_image_is_checked_again_unless_the_rules_changed(tmp_path, monkeypatch):
    """The rules of the images an edit does not touch are their kept results (an edit that leaves the records as
    they were checks none again), unless another version of the rules kept them (an upgraded ssd): then every
    image is checked again."""
    data = settle(make_dataset("voc", tmp_path / "voc", train=6, val=2, size=64, classes=3, seed=1))
    index_dataset(data, splits=("train", "val"))
    checked, rules = [], check_module.object_issues
    monkeypatch.setattr(check_module, "object_issues", lambda rec, *args: checked.append(rec.path.name) or rules(
        rec, *args))
    for name, version in (("synth_000001", None), ("synth_000002", "other rules")):
        xml = data / "Annotations" / f"{name}.xml"
        xml.write_text(xml.read_text().replace("<difficult>0</difficult>", "<difficult>1</difficult>", 1))
        settle(data)
        if version is not None:
            monkeypatch.setattr(check_module, "_rules_version", lambda version=version: version)
        checked.clear()
        index_dataset(data, splits=("train", "val"))
        assert checked == ([f"{name}.jpg"] if version is None else [f"synth_{i:06d}.jpg" for i in range(8)])
    xml = data / "Annotations" / "synth_000003.xml"  # read again, its record as it was: no image checked again
    xml.write_text(xml.read_text() + " ")
    settle(data)
    checked.clear()
    assert reads(data, splits=("train", "val")) == [("voc", "synth_000003.xml")] and checked == []

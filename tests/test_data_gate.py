"""The one dataset gate (``load_training_data``) and the rules it shares with ``ssd check``: whole splits, classes,
train/val overlap, layouts (relative data.yaml, VOC XML in a YAML dataset, nested XML folders), truncated images,
worker errors and the image size rule of the command line."""

from __future__ import annotations

import inspect
import itertools
import json
from pathlib import Path

import pytest
from PIL import Image

import ssd.data
from builders import make_yolo_folder
from ssd.cli import main
from ssd.data import build_dataloader, check_dataset, load_dataset, load_training_data
from ssd.errors import DataError
from ssd.training.trainer import train

_colors = itertools.count(1)


# Private writers, not builders.make_dataset: each gate test writes the one flaw it must catch.
def _image(path: Path, size=(64, 48), color=None) -> Path:
    """A small JPEG; each call paints a new colour unless ``color`` is given (no accidental identical images)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    c = next(_colors) if color is None else color
    Image.new("RGB", size, ((c * 40) % 256, (c * 90) % 256, (c * 150) % 256)).save(path)
    return path


def _yolo(root: Path, splits: dict[str, dict[str, str | None]], names: str = "[a, b]", extra: str = "") -> Path:
    """``root/<split>/images/<stem>.jpg`` with ``labels/<stem>.txt`` (None: no label file) and a data.yaml whose
    paths are relative to its folder."""
    for split, labels in splits.items():
        for stem, text in labels.items():
            _image(root / split / "images" / f"{stem}.jpg")
            if text is not None:
                (root / split / "labels").mkdir(parents=True, exist_ok=True)
                (root / split / "labels" / f"{stem}.txt").write_text(text)
    keys = "".join(f"{s}: {s}/images\n" for s in splits)
    (root / "data.yaml").write_text(f"{keys}names: {names}\n{extra}")
    return root / "data.yaml"


def _voc_xml(objects: list[tuple[str, int]]) -> str:
    """VOC XML text for ``(name, difficult)`` objects; object i has the 1-based box (11 + 15i, 11, 20 + 15i, 20)."""
    body = "".join(f"<object><name>{n}</name><difficult>{d}</difficult><bndbox><xmin>{11 + 15 * i}</xmin><ymin>11"
                   f"</ymin><xmax>{20 + 15 * i}</xmax><ymax>20</ymax></bndbox></object>"
                   for i, (n, d) in enumerate(objects))
    return f"<annotation>{body}</annotation>"


def _coco(path: Path, images: list, annotations: list, categories: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


OK_LINE = "0 0.5 0.5 0.2 0.2\n"


# ---------------------------------------------------------------------------------------------- module names
def test_check_module_is_not_shadowed_by_its_function():
    assert inspect.ismodule(ssd.data.check) and inspect.ismodule(ssd.data.load)
    assert ssd.data.check.check_dataset is check_dataset and ssd.data.gate.load_training_data is load_training_data


# ------------------------------------------------------------------------ one gate: check and train agree
def _dup_names(root):
    return _yolo(root, {"train": {"t": OK_LINE + "1 0.2 0.2 0.1 0.1\n"}, "val": {"v": OK_LINE}}, names="[a, a]")


def _coco_no_images(root):
    return _coco(root / "instances_train.json", [], [], [{"id": 1, "name": "cat"}])


def _no_labels(root):
    return _yolo(root, {"train": {"t1": None, "t2": None}})


def _no_objects(root):
    return _yolo(root, {"train": {"t1": "", "t2": "\n"}})


def _all_difficult(root):
    for split, stem, difficult in (("train", "t", 1), ("val", "v", 0)):
        _image(root / split / f"{stem}.jpg")
        (root / split / f"{stem}.xml").write_text(_voc_xml([("cat", difficult), ("cat", 1)]))
    return root


def _class_without_objects(root):
    return _yolo(root, {"train": {"t": OK_LINE}, "val": {"v": OK_LINE}})


@pytest.mark.parametrize("build, code, message", [
    (_dup_names, "duplicate_class_names",
     "{root}/data.yaml: class names ['a'] appear more than once in ['a', 'a']: every class needs a distinct name"),
    (_coco_no_images, "empty_split", "split 'train' ({root}/instances_train.json): no images: looked for entries of "
     "'images' whose image file can be read"),
    (_no_labels, "no_labels", "split 'train' ({root}/data.yaml): none of its 2 images has a label file (looked for "
     "YOLO .txt labels such as train/labels/t1.txt, the last images/ folder replaced by labels/, and for VOC .xml "
     "files beside the images)"),
    (_no_objects, "no_objects_in_split", "split 'train' ({root}/data.yaml): none of its 2 usable images has an "
     "object"),
    (_all_difficult, "no_trainable_objects", "split 'train' (train): all 2 of its objects are difficult or crowd "
     "(training leaves them out, evaluation ignores them)"),
    (_class_without_objects, "class_without_objects", "{root}/data.yaml: class 'b' (label 1) has no trainable "
     "object in split 'train' "
     "nor in any other split (difficult/crowd ones are not trained on): annotate some, or remove it from the class "
     "names"),
])
def test_check_and_gate_refuse_the_same_with_the_same_message(tmp_path, build, code, message):
    data = build(tmp_path)
    message = message.format(root=tmp_path)
    report = check_dataset(data)
    assert [(e.code, e.message) for e in report.errors] == [(code, message)]
    with pytest.raises(DataError) as refused:
        load_training_data(data, skip_invalid=True)
    assert str(refused.value) == (f"1 problems in dataset {report.dataset} (skip_invalid cannot drop these; run "
                                  f"`ssd check` for the full report):\n  {message}")


def test_train_refuses_duplicate_class_names_before_building_anything(tmp_path):
    data = _dup_names(tmp_path / "d")
    with pytest.raises(DataError, match=r"class names \['a'\] appear more than once"):
        train(data=str(data), model="ssd_tiny", epochs=1, project=str(tmp_path / "runs"), device="cpu", workers=0)
    assert not (tmp_path / "runs").exists()


def test_class_only_in_val_and_image_in_train_and_val_are_warnings(tmp_path, ssd_messages):
    data = _yolo(tmp_path, {"train": {"t": OK_LINE}, "val": {"v": "1 0.5 0.5 0.2 0.2\n", "w": OK_LINE}})
    same = tmp_path / "val" / "images" / "w.jpg"
    same.write_bytes((tmp_path / "train" / "images" / "t.jpg").read_bytes())  # another name, the same bytes
    report = check_dataset(data)
    assert report.ok
    warnings = {w.code: w.message for w in report.warnings}
    assert warnings == {
        "class_not_trained": f"{data}: class 'b' has no trainable object in split 'train', only in val (1): the "
                             "model cannot learn it (move some of those images to train)",
        "train_val_overlap": "val/images/w.jpg: this val image is also a train image (train/images/t.jpg): val scores "
                             "on it overestimate accuracy"}
    spec = load_training_data(data)
    logged = ssd_messages()
    assert [len(spec.splits[s]) for s in ("train", "val")] == [1, 2]
    assert logged == [f"warning: {warnings['class_not_trained']}",
                      f"1 warning(s) about files of {data} (`ssd check {data}` lists them)"]


def test_gate_for_evaluation_reads_only_its_split(tmp_path):
    """`ssd val --split val`: a class missing from train and a corrupt train image are not its business."""
    data = _yolo(tmp_path, {"train": {"t": OK_LINE}, "val": {"v": OK_LINE + "1 0.2 0.2 0.1 0.1\n"}})
    (tmp_path / "train" / "images" / "t.jpg").write_bytes(b"\xff\xd8 not a jpeg")
    assert not check_dataset(data).ok
    spec = load_training_data(data, splits=("val",))
    assert len(spec.records("val")) == 1
    with pytest.raises(DataError, match=r"has no split 'test' \(available: train, val\)"):
        load_training_data(data, splits=("test",))


# ------------------------------------------------------------------------------------------------- layouts
def test_relative_data_yaml_from_the_parent_folder(tmp_path, monkeypatch):
    """`ssd check aq/data.yaml` run from aq's parent reads aq/train/images (not aq/aq/train/images)."""
    _yolo(tmp_path / "aq", {"train": {"t": OK_LINE}, "val": {"v": OK_LINE}}, names="[a]")
    monkeypatch.chdir(tmp_path)
    spec = load_dataset("aq/data.yaml")
    assert spec.root == (tmp_path / "aq").resolve()
    assert {s: len(r) for s, r in spec.splits.items()} == {"train": 1, "val": 1}
    assert main(["check", "aq/data.yaml"]) == 0


def test_voc_xml_beside_images_of_a_data_yaml_is_read(tmp_path):
    """A "Pascal VOC" export (XML beside the images) described by a data.yaml: the XML is read with its names."""
    for split, stem, objects in (("train", "a", [("dog", 0), ("cat", 1), ("cat", 0)]), ("valid", "b", [("cat", 0)]),
                                 ("valid", "c", [("cta", 0)])):
        _image(tmp_path / split / f"{stem}.jpg")
        (tmp_path / split / f"{stem}.xml").write_text(_voc_xml(objects))
    _image(tmp_path / "train" / "d.jpg")  # no XML: an image without objects
    (tmp_path / "data.yaml").write_text("train: train\nval: valid\nnames: [cat, dog]\n")
    spec = load_dataset(tmp_path / "data.yaml")
    a = spec.splits["train"][0]
    assert a.annotation == tmp_path / "train" / "a.xml"
    assert [(o.name, o.label, o.difficult, o.box) for o in a.objects] == [("dog", 1, False, (10, 10, 19, 19)),
                                                                         ("cat", 0, True, (25, 10, 34, 19)),
                                                                         ("cat", 0, False, (40, 10, 49, 19))]
    report = check_dataset(tmp_path / "data.yaml")
    assert [(e.code, e.message) for e in report.errors] == [
        ("unknown_class", "valid/c.xml object 1 (cta): unknown class name 'cta' (closest: 'cat'); known names: "
                          "['cat', 'dog']")]
    assert [(w.code, w.file) for w in report.warnings] == [("missing_label_file", "train/d.txt"),
                                                          ("no_objects", "train/d.jpg")]


def test_xml_in_split_folders_two_levels_down(tmp_path):
    for folder, stem, name in (("a/train", "x", "cat"), ("b/test", "y", "dog")):
        _image(tmp_path / folder / f"{stem}.jpg")
        (tmp_path / folder / f"{stem}.xml").write_text(_voc_xml([(name, 0)]))
    spec = load_dataset(tmp_path)
    assert spec.format == "voc" and spec.class_names == ["cat", "dog"]
    assert {s: [o.label for r in recs for o in r.objects] for s, recs in spec.splits.items()} == {"train": [0],
                                                                                                  "test": [1]}


def test_xml_outside_split_folders_is_refused(tmp_path):
    _image(tmp_path / "misc" / "notes" / "x.jpg")
    (tmp_path / "misc" / "notes" / "x.xml").write_text(_voc_xml([("cat", 0)]))
    (error,) = check_dataset(tmp_path).errors
    assert error.code == "unreadable_dataset" and error.message == (
        f"{tmp_path}: XML files found only in misc/notes, none of them a split folder (train, val, valid, "
        "validation, test) or the folder itself; give the folder that holds the images and their XML files")


def test_empty_names_is_one_error(tmp_path):
    data = _yolo(tmp_path, {"train": {"t": OK_LINE * 3}}, names="[]")
    assert [e.message for e in check_dataset(data).errors] == [
        f"{data}: 'names' is empty: list the class names (e.g. names: [cat, dog]; label k is the k-th name)"]


@pytest.mark.parametrize("nc, shown", [("three", "'three'"), ("3", "3")])
def test_nc_disagreeing_or_not_a_number_names_the_file(tmp_path, nc, shown):
    data = _yolo(tmp_path, {"train": {"t": OK_LINE}}, extra=f"nc: {nc}\n")
    assert [e.message for e in check_dataset(data).errors] == [
        f"{data}: nc: {shown} disagrees with the 2 names ['a', 'b'] (nc is the number of names; it may be left out)"]


# ------------------------------------------------------------------------------------------- images, workers
def _truncate(path: Path) -> None:
    Image.effect_noise((96, 64), 60).convert("RGB").save(path, quality=90)
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])  # the header still reads


def test_truncated_jpeg_refused_by_the_gate_and_dropped_with_skip_invalid(tmp_path, ssd_messages):
    data = _yolo(tmp_path, {"train": {"t1": OK_LINE, "t2": OK_LINE, "cut": OK_LINE}, "val": {"v": OK_LINE}},
                 names="[a]")
    cut = tmp_path / "train" / "images" / "cut.jpg"
    _truncate(cut)
    with pytest.raises(DataError, match=r"1 problems in dataset .*\n  train/images/cut.jpg: image does not decode "
                                        r"\(OSError: image file is truncated"):
        load_training_data(data)
    spec = load_training_data(data, skip_invalid=True)
    assert [r.path.name for r in spec.records("train")] == ["t1.jpg", "t2.jpg"]
    assert ssd_messages() == [f"skip_invalid: dropped 0 object(s) and 1 image(s): {cut}"]


@pytest.mark.parametrize("workers", [0, 1])
def test_worker_data_error_keeps_its_own_message(tmp_path, workers):
    data = _yolo(tmp_path, {"train": {"t1": OK_LINE, "t2": OK_LINE}}, names="[a]")
    records = load_training_data(data, splits=("train",)).records("train")
    loader = build_dataloader(records, ["a"], 32, [0.5] * 3, [0.25] * 3, train=False, batch_size=2, workers=workers)
    records[1].path.unlink()  # gone after the gate: the loader meets it mid-run
    with pytest.raises(DataError) as failed:
        next(iter(loader))
    message = str(failed.value)
    assert message == f"{records[1].path}: image file does not exist"
    assert "Traceback" not in message and "DataLoader worker" not in message and len(message.splitlines()) == 1


@pytest.mark.slow
def test_image_size_rule_is_the_same_for_check_and_train(tmp_path, capsys):
    data = _yolo(tmp_path, {"train": {"t": OK_LINE}}, names="[a]")
    rule = ("image_size='7' is invalid: must be at least 32 and at most 4096 on each side (--image-size; the bound "
            "is ssd.limits.MAX_INPUT_SIDE)\n")
    assert main(["check", str(data), "--image-size", "7"]) == 2  # a command-line mistake, as argparse reports it
    assert capsys.readouterr().err == f"error: ssd check: argument --image-size: {rule}"
    assert main(["train", "--data", str(data), "--image-size", "7"]) == 2
    assert capsys.readouterr().err == f"error: ssd train: {rule}"


def test_dataset_without_validation_split_is_refused_with_both_fixes_named(tmp_path):
    from ssd.data.load import load_dataset, validation_split
    from ssd.errors import DataError

    spec = load_dataset(make_yolo_folder(tmp_path, 4))
    with pytest.raises(DataError, match=r"has no validation split, and training never scores on its own training "
                                        r"images: name one .* or hold out part of train with --val-fraction 0\.1"):
        validation_split(spec)


def test_val_fraction_holds_out_a_seeded_reported_share_of_train(tmp_path, ssd_messages):
    from ssd.data.load import load_dataset, validation_split

    spec = load_dataset(make_yolo_folder(tmp_path, 10))
    train, val = validation_split(spec, 0.2, seed=3)
    said = ssd_messages()
    assert (len(train), len(val)) == (8, 2)
    assert not {r.path for r in train} & {r.path for r in val}
    assert said == ["validation: 2 of 10 training images held out (--val-fraction 0.2, seed 3); training on the "
                    "other 8"]
    again, _ = validation_split(spec, 0.2, seed=3)
    assert [r.path for r in again] == [r.path for r in train]  # the same split on resume


def test_val_fraction_is_refused_when_the_data_has_a_val_split_or_it_empties_a_side(tmp_path):
    from ssd.data.load import load_dataset, validation_split
    from ssd.errors import DataError

    both = load_dataset(make_yolo_folder(tmp_path / "both", 2, splits=("train", "val")))
    assert [r.path.name for r in validation_split(both)[1]] == ["val0.png", "val1.png"]
    with pytest.raises(DataError, match=r"--val-fraction 0\.5 is for data without a validation split, but .* has "
                                        r"'val': drop --val-fraction or the split"):
        validation_split(both, 0.5)
    few = load_dataset(make_yolo_folder(tmp_path / "few", 3))
    with pytest.raises(DataError, match=r"--val-fraction 0\.1 of 3 training images holds out 0: it must leave at "
                                        r"least one image on each side"):
        validation_split(few, 0.1)


def test_train_without_validation_split_exits_before_a_run_directory(tmp_path, capsys):
    from ssd.cli import main

    data = make_yolo_folder(tmp_path / "data", 4)
    assert main(["train", "--data", str(data), "--model", "ssd_tiny", "--epochs", "1", "--project",
                 str(tmp_path / "runs"), "--device", "cpu", "--workers", "0"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: dataset ") and "--val-fraction 0.1" in err[-1]
    assert not (tmp_path / "runs").exists()

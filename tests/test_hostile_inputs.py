"""Hostile inputs are refused early with one line naming the file and the bound: YAML alias bombs, huge values."""

import pytest

from ssd.limits import MAX_VALUE_CHARS, value_text
from ssd.yamlfile import YAMLLimitError, safe_load

# Nine levels of nine aliases each: about 4 * 10^8 strings once expanded, from ten short lines.
ALIAS_BOMB = 'l0: &l0 ["ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha", "ha"]\n' + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10))


def test_yaml_with_a_few_aliases_reads_as_plain_yaml():
    assert safe_load("base: &b {lr: 0.1}\nfirst: *b\nsecond: [*b, 2]") == {
        "base": {"lr": 0.1}, "first": {"lr": 0.1}, "second": [{"lr": 0.1}, 2]}


def test_alias_bomb_is_refused_while_parsing():
    # l4 expands to 66,430 values, l5 to 597,871: the count passes the bound inside l5 (line 6)
    with pytest.raises(YAMLLimitError, match=r"more than 100,000 values once its aliases are expanded \(at line 6\)"):
        safe_load(ALIAS_BOMB)


def test_more_than_a_hundred_aliases_are_refused():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    with pytest.raises(YAMLLimitError, match=r"more than 100 aliases \(\*name\) at line 2"):
        safe_load(text)
    assert len(safe_load("a: &a 1\nb: [" + ", ".join(["*a"] * 100) + "]\n")["b"]) == 100


def test_recursive_alias_is_refused():
    with pytest.raises(YAMLLimitError, match="recursive alias at line 1"):
        safe_load("a: &a [1, *a]")


def test_python_tags_stay_refused():
    import yaml

    with pytest.raises(yaml.YAMLError, match="python/object"):
        safe_load("!!python/object/apply:os.system ['echo hi']")


def test_alias_bomb_in_data_yaml_is_one_data_error(tmp_path):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    (tmp_path / "data.yaml").write_text("names: [cat]\n" + ALIAS_BOMB + "train: *l9\n")
    with pytest.raises(DataError, match=r"data\.yaml:7: YAML does not parse \(more than 100,000 values"):
        load_dataset(tmp_path / "data.yaml")


def test_alias_bomb_in_nc_is_refused_without_formatting_it(tmp_path):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    (tmp_path / "data.yaml").write_text("names: [cat]\nl: &l [1, 2, 3, 4, 5, 6, 7, 8, 9]\nnc: [*l, *l, *l, *l, *l]\n")
    with pytest.raises(DataError, match=r"nc: \[\[1, 2, 3, 4, 5, 6, \.\.\.\], \[1, 2, 3,") as info:
        load_dataset(tmp_path / "data.yaml")
    assert len(str(info.value)) < 300


def test_alias_bomb_in_config_file_is_a_config_error(tmp_path):
    from ssd.errors import ConfigError
    from ssd.training.config import TrainConfig

    (tmp_path / "config.yaml").write_text(ALIAS_BOMB + "epochs: 3\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML \(more than 100,000 values"):
        TrainConfig.from_yaml(tmp_path / "config.yaml")


def test_config_file_with_a_key_given_twice_is_refused_naming_both_lines(tmp_path):
    from ssd.errors import ConfigError
    from ssd.training.config import TrainConfig

    (tmp_path / "config.yaml").write_text("epochs: 3\nlr: 0.01\nepochs: 300\n")
    with pytest.raises(ConfigError, match=r"config\.yaml: not valid YAML \(key 'epochs' at line 3 is given twice "
                                          r"\(first at line 1\): only one value can be meant\)"):
        TrainConfig.from_yaml(tmp_path / "config.yaml")


def test_alias_bomb_in_priors_file_is_refused(tmp_path):
    from ssd.priors.io import load_priors

    (tmp_path / "priors.yaml").write_text(ALIAS_BOMB + "priors: *l9\n")
    with pytest.raises(ValueError, match=r"priors\.yaml: not valid YAML \(more than 100,000 values"):
        load_priors(tmp_path / "priors.yaml")


def test_error_values_are_cut_before_formatting():
    nested = [1] * 9
    for _ in range(30):
        nested = [nested] * 9  # 9^31 items: formatting it whole would never end
    assert value_text(nested) == "[[[...], [...], [...], [...], [...], [...], ...], [[...], [...], [...], [...]..."
    assert value_text("x" * 10_000) == "'" + "x" * 37 + "..." + "x" * 38 + "'"
    assert len(value_text("x" * 10_000)) <= MAX_VALUE_CHARS
    assert value_text(3) == "3"


# ------------------------------------------------------------------------------------------------ datasets
# Private writers, not builders.make_dataset: each writes the one odd layout or file a refusal is about.
def make_yolo_folder(root, count: int, splits=("train",)):
    from PIL import Image

    for split in splits:
        images, labels = root / split / "images", root / split / "labels"
        images.mkdir(parents=True)
        labels.mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (64, 64), (i, 20, 30)).save(images / f"{split}{i}.png")
            (labels / f"{split}{i}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    (root / "classes.txt").write_text("circle\n")
    return root


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


# ------------------------------------------------------------------------------------------------ size bounds
def test_tiny_tiles_with_huge_overlap_are_refused_before_allocating():
    from ssd.inference.tiling import tile_windows

    with pytest.raises(ValueError, match=r"^--tile 32x32 with --tile-overlap 0\.999 cuts a 768x1024 image into "
                                         r"713,054,001 tiles, more than 1024 \(ssd\.limits\.MAX_TILES_PER_IMAGE\): use "
                                         r"larger tiles or less overlap$"):
        tile_windows((768, 1024), (32, 32), 0.999)
    assert tile_windows((768, 1024), (256, 256), 0.2).shape == (20, 4)  # 4 rows x 5 columns, as before


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
    import torch

    import ssd.data.check as check

    boxes = torch.tensor([[0, 0, 10, 10], [0, 0, 10, 10.5], [50, 50, 60, 60], [0, 0, 10, 10], [50, 50, 60, 60.2]],
                         dtype=torch.float64)
    labels = torch.tensor([0, 0, 1, 1, 1])
    whole = check._duplicate_pairs(boxes, labels)
    assert [(a, b, round(v, 4)) for a, b, v in whole] == [(0, 1, 0.9524), (2, 4, 0.9804)]
    monkeypatch.setattr(check, "DUPLICATE_CHUNK", 5)  # one row per chunk
    assert check._duplicate_pairs(boxes, labels) == whole


def write_coco(path, image_name: str, image_id: int = 1):
    import json

    from PIL import Image

    Image.new("RGB", (64, 64), (5, 5, 5)).save(path.parent / image_name)
    path.write_text(json.dumps({
        "images": [{"id": image_id, "file_name": image_name, "width": 64, "height": 64}],
        "annotations": [{"id": 1, "image_id": image_id, "category_id": 1, "bbox": [8, 8, 20, 20], "iscrowd": 0}],
        "categories": [{"id": 1, "name": "cell"}]}))


@pytest.mark.parametrize("name, split", [("instances_val2017.json", "val"), ("valid.json", "val"),
                                         ("image_info_test-dev2017.json", "test"), ("train2017.json", "train"),
                                         ("my_eval.json", "train"), ("interval.json", "train")])
def test_coco_split_names_are_whole_words_of_the_file_name(name, split):
    from pathlib import Path

    from ssd.data.coco import split_name

    assert split_name(Path(name)) == split


@pytest.mark.parametrize("first, second, split", [("train_part1.json", "train_part2.json", "train"),
                                                  ("train.json", "my_eval.json", "train")])
def test_two_coco_files_for_one_split_are_refused_by_name(tmp_path, first, second, split):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    write_coco(tmp_path / first, "a.png", 1)
    write_coco(tmp_path / second, "b.png", 2)
    a, b = sorted([first, second])
    with pytest.raises(DataError, match=f"COCO files {a} and {b} in .* are both split '{split}' \\(split names are "
                                        "whole words of the file name"):
        load_dataset(tmp_path)


# ------------------------------------------------------------------------------------------------ demo and pipes
@pytest.mark.parametrize("argv, words", [(["--epochs", "0"], "epochs=0 is invalid: must be at least 1 (--epochs)"),
                                         (["--epochs", "-1"], "epochs=-1 is invalid: must be at least 1"),
                                         (["--device", "gpu"], "device 'gpu' is not a valid device")])
def test_demo_options_are_refused_before_any_image_is_generated(tmp_path, capsys, argv, words):
    from ssd.cli import main

    assert main(["demo", "--project", str(tmp_path / "runs"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ssd demo: ") and words in err[0]
    assert not (tmp_path / "runs" / "demo_data").exists()


@pytest.mark.slow
def test_check_piped_into_a_closed_reader_exits_quietly(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    data = make_yolo_folder(tmp_path / "data", 2)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    read, write = os.pipe()
    os.close(read)  # `| head -0`: nobody reads what check prints
    with os.fdopen(write, "w") as closed:
        done = subprocess.run([sys.executable, "-m", "ssd", "check", str(data)], stdout=closed,
                              stderr=subprocess.PIPE, text=True, env=env)
    assert done.returncode == 141 and done.stderr == ""


# ------------------------------------------------------------------------------------------------ weak dataset cases
def voc_xml(name: str, image: str = "a.jpg") -> str:
    return (f"<annotation><filename>{image}</filename><size><width>64</width><height>64</height><depth>3</depth>"
            f"</size><object><name>{name}</name><bndbox><xmin>8</xmin><ymin>8</ymin><xmax>30</xmax><ymax>30</ymax>"
            "</bndbox></object></annotation>")


def flat_voc(root, files: dict[str, str]):
    """A flat VOC folder: ``{"a.jpg": "", "a.xml": "<annotation>..."}`` (images are 64x64)."""
    from PIL import Image

    root.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        if name.lower().endswith((".jpg", ".png")):
            Image.new("RGB", (64, 64), (3, 3, 3)).save(root / name)
        else:
            (root / name).write_text(text)
    return root


def test_upper_case_xml_suffix_is_read(tmp_path):
    from ssd.data.load import load_dataset

    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.XML": voc_xml("cell")}))
    assert [(r.path.name, r.annotation.name, [o.name for o in r.objects]) for r in spec.records("train")] == [
        ("a.jpg", "a.XML", ["cell"])]


def test_flat_voc_images_without_xml_are_reported(tmp_path):
    from ssd.data.load import load_dataset

    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("cell"), "b.jpg": "", "c.jpg": ""}))
    assert len(spec.records("train")) == 1
    assert [(i.code, i.message) for i in spec.issues] == [
        ("image_without_annotation", ".: 2 image(s) without an XML file beside them are not read: b.jpg, c.jpg")]


def test_two_images_with_one_stem_are_reported(tmp_path):
    from ssd.data.load import load_dataset

    spec = load_dataset(flat_voc(tmp_path, {"a.jpg": "", "a.png": "", "a.xml": voc_xml("cell")}))
    assert [r.path.name for r in spec.records("train")] == ["a.jpg"]
    assert [(i.code, i.message) for i in spec.issues] == [
        ("same_stem", "a.png: shares the name 'a' with a.jpg, whose annotation it would share: a.png is not read "
                      "(rename one)")]


@pytest.mark.parametrize("layout", ["voc", "yolo"])
def test_empty_classes_txt_is_named_as_empty(tmp_path, layout):
    from ssd.data.load import load_dataset
    from ssd.errors import DataError

    if layout == "voc":
        root = flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("cell")})
    else:
        root = make_yolo_folder(tmp_path, 1)
    (root / "classes.txt").write_text("\n  \n")
    with pytest.raises(DataError, match=r"classes\.txt: the class file is empty: list one class name per line"):
        load_dataset(root)


def test_class_names_differing_only_in_case_are_a_warning(tmp_path):
    from ssd.data.check import check_dataset

    root = flat_voc(tmp_path, {"a.jpg": "", "a.xml": voc_xml("rbc"), "b.jpg": "", "b.xml": voc_xml("RBC", "b.jpg")})
    report = check_dataset(root)
    assert [(i.code, i.message) for i in report.warnings if i.code == "class_names_differ_in_case"] == [
        ("class_names_differ_in_case", f"{root}: class names 'RBC', 'rbc' differ only in case and are 2 classes; "
                                       "rename them to one name if they are the same class")]


def coco_file(tmp_path, images: list[dict], annotations: list[dict]):
    import json

    from PIL import Image

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
    from ssd.data.load import load_dataset

    spec = load_dataset(coco_file(tmp_path, [{"id": 1, "file_name": "a.png"}], [box(7, 1), box(7, 1)]))
    assert [(i.code, i.message) for i in spec.issues] == [
        ("parse_error", "instances_train.json annotation id 7: id 7 is also annotations[0] (annotation ids must be "
                        "unique)")]
    assert len(spec.records("train")[0].objects) == 1


def test_coco_file_name_outside_the_dataset_folder_is_refused(tmp_path):
    from PIL import Image

    from ssd.data.load import load_dataset

    (tmp_path / "data").mkdir()
    Image.new("RGB", (64, 64)).save(tmp_path / "secret.png")
    spec = load_dataset(coco_file(tmp_path / "data", [{"id": 1, "file_name": "../secret.png"}], [box(1, 1)]))
    assert spec.records("train") == []
    assert [(i.code, i.message) for i in spec.issues] == [
        ("outside_root", "instances_train.json image id 1: file_name '../secret.png' leaves the dataset folder "
                         "(absolute or ../): images are read from inside it")]


def test_coco_same_file_under_two_ids_is_counted_once(tmp_path):
    from ssd.data.load import load_dataset

    spec = load_dataset(coco_file(tmp_path, [{"id": 1, "file_name": "a.png"}, {"id": 2, "file_name": "a.png"}],
                                  [box(1, 1), box(2, 2)]))
    assert [r.image_id for r in spec.records("train")] == [1]
    assert [(i.code, i.message) for i in spec.issues] == [
        ("duplicate_image", "instances_train.json image id 2: 'a.png' is also image id 1; one file under two ids "
                            "would be counted twice")]


def test_yolo_line_of_seven_values_is_a_warning_not_a_silent_polygon(tmp_path):
    from ssd.data.load import load_dataset

    root = make_yolo_folder(tmp_path, 1)
    (root / "train" / "labels" / "train0.txt").write_text("0 0.5 0.5 0.4 0.3 0.9 0.1\n")
    spec = load_dataset(root)
    assert [(i.code, i.message) for i in spec.issues] == [
        ("short_polygon", "train/labels/train0.txt:1: 7 values are read as a 3-point polygon (its bounding box); a "
                          "box line has 5: 'class cx cy w h'")]


def test_yolo_label_files_without_an_image_are_reported(tmp_path):
    from ssd.data.load import load_dataset

    root = make_yolo_folder(tmp_path, 2)
    for orphan in ("lost", "gone"):  # their images were deleted
        (root / "train" / "labels" / f"{orphan}.txt").write_text("0 0.5 0.5 0.4 0.3\n")
    assert len(load_dataset(root).records("train")) == 2
    spec = load_dataset(root)
    assert [(i.code, i.message) for i in spec.issues] == [
        ("label_without_image", "train/labels: 2 label file(s) without an image are not read: gone.txt, lost.txt")]


def test_split_whose_every_image_is_corrupt_says_so_not_no_images(tmp_path):
    from ssd.data.check import check_dataset

    root = make_yolo_folder(tmp_path, 2)
    for image in (root / "train" / "images").iterdir():
        image.write_bytes(b"\x89PNG\r\n\x1a\n" + b"garbage" * 10)
    report = check_dataset(root)
    assert [i.message for i in report.errors if i.code in ("no_valid_images", "empty_split")] == [
        f"split 'train' ({root}): none of its 2 images could be read (see the errors about them)"]

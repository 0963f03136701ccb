"""`ssd data convert`: round trips between formats keep every record (boxes, classes, difficult, crowd, images
without objects, unicode names), splits are kept, and bad outputs are refused before anything is written."""

import json

import pytest

from builders import write_image
from ssd.cli import main
from ssd.data.commands.convert import convert_dataset
from ssd.data.load import load_dataset
from ssd.errors import DataError, OutputError

_OBJECTS = {  # image name -> (class, xmin, ymin, xmax, ymax (VOC, 1-based), difficult, iscrowd)
    "a.jpg": [("zebra", 11, 21, 41, 41, 0, 0), ("élan", 1, 1, 64, 48, 1, 0)],
    "b.jpg": [("zebra", 5.5, 6, 30, 40.25, 0, 1)],
    "ünïcödé.jpg": [],  # an image without objects
    "c.jpg": [("élan", 3, 4, 20, 30, 0, 0)],
}
_SPLITS = {"train": ["a.jpg", "b.jpg", "ünïcödé.jpg"], "val": ["c.jpg"]}


def _voc(root):
    """A VOC dataset of _OBJECTS, 64x48 images, with classes.txt (élan, zebra)."""
    (root / "Annotations").mkdir(parents=True)
    (root / "ImageSets" / "Main").mkdir(parents=True)
    for name, objects in _OBJECTS.items():
        write_image(root / "JPEGImages" / name, 64, 48)
        xml = "".join(f"<object><name>{c}</name><difficult>{d}</difficult>{'<iscrowd>1</iscrowd>' * k}<bndbox>"
                      f"<xmin>{x1}</xmin><ymin>{y1}</ymin><xmax>{x2}</xmax><ymax>{y2}</ymax></bndbox></object>"
                      for c, x1, y1, x2, y2, d, k in objects)
        (root / "Annotations" / f"{name[:-4]}.xml").write_text(
            f"<annotation><filename>{name}</filename><size><width>64</width><height>48</height></size>{xml}"
            "</annotation>", encoding="utf-8")
    for split, names in _SPLITS.items():
        (root / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(n[:-4] + "\n" for n in names))
    (root / "classes.txt").write_text("élan\nzebra\n", encoding="utf-8")
    return root


def _records(spec):
    """Every split's records as comparable values: file name, size, objects (box to 1e-9 px, name, flags)."""
    return spec.class_names, {split: sorted((r.path.name, r.width, r.height, [
        (tuple(round(v, 9) for v in o.box), o.name, o.label, o.difficult, o.iscrowd) for o in r.objects])
        for r in records) for split, records in spec.splits.items()}


@pytest.fixture
def voc(tmp_path):
    return _voc(tmp_path / "src")


def test_voc_source_holds_every_case(voc):
    names, splits = _records(load_dataset(voc))
    assert names == ["élan", "zebra"]
    train = {name: objects for name, _, _, objects in splits["train"]}
    assert train["a.jpg"] == [((10.0, 20.0, 40.0, 40.0), "zebra", 1, False, False),
                              ((0.0, 0.0, 63.0, 47.0), "élan", 0, True, False)]
    assert train["b.jpg"] == [((4.5, 5.0, 29.0, 39.25), "zebra", 1, False, True)]
    assert train["ünïcödé.jpg"] == []


@pytest.mark.parametrize("middle", ["coco", "yolo", "voc"])
@pytest.mark.parametrize("first", ["voc", "coco", "yolo"])
def test_round_trip_keeps_every_record(voc, tmp_path, first, middle):
    """voc -> first -> middle -> first: the same records as the source (A -> B -> A for every pair)."""
    expected = _records(load_dataset(voc))
    a = tmp_path / "a"
    convert_dataset(voc, a, first)
    assert _records(load_dataset(a)) == expected
    b, again = tmp_path / "b", tmp_path / "again"
    convert_dataset(a, b, middle, images="copy")
    assert _records(load_dataset(b)) == expected
    convert_dataset(b, again, first)
    assert _records(load_dataset(again)) == expected


def test_yolo_output_is_plain_yolo_with_a_flags_file(voc, tmp_path):
    summary = convert_dataset(voc, tmp_path / "y", "yolo")
    assert str(summary) == f"wrote {tmp_path / 'y'} (yolo; train: 3 images, 3 objects, val: 1 images, 1 objects)"
    assert (tmp_path / "y" / "labels" / "train" / "a.txt").read_text() == (
        "1 0.390625 0.625 0.46875 0.4166666666666667\n0 0.4921875 0.4895833333333333 0.984375 "
        "0.9791666666666666\n")
    assert (tmp_path / "y" / "labels" / "train" / "ünïcödé.txt").read_text() == ""
    flags = [json.loads(line) for line in (tmp_path / "y" / "flags.jsonl").read_text().splitlines()]
    assert flags == [{"file": "labels/train/a.txt", "line": 2, "difficult": True, "iscrowd": False},
                     {"file": "labels/train/b.txt", "line": 1, "difficult": False, "iscrowd": True}]
    source = voc / "JPEGImages" / "a.jpg"
    assert (tmp_path / "y" / "images" / "train" / "a.jpg").stat().st_ino == source.stat().st_ino  # linked
    assert source.is_file()  # never moved


def test_labelstudio_tasks_are_what_its_import_takes(voc, tmp_path):
    convert_dataset(voc, tmp_path / "ls", "labelstudio", images="copy")
    tasks = json.loads((tmp_path / "ls" / "train" / "tasks.json").read_text(encoding="utf-8"))
    assert [t["data"]["image"] for t in tasks] == ["/data/local-files/?d=train/a.jpg",
                                                   "/data/local-files/?d=train/b.jpg",
                                                   "/data/local-files/?d=train/ünïcödé.jpg"]
    first = tasks[0]["annotations"][0]["result"][0]
    assert first["original_width"] == 64 and first["original_height"] == 48 and first["type"] == "rectanglelabels"
    assert first["value"] == {"x": 100 * 10 / 64, "y": 100 * 20 / 48, "width": 100 * 30 / 64,
                              "height": 100 * 20 / 48, "rotation": 0, "rectanglelabels": ["zebra"]}
    assert tasks[2]["annotations"] == [{"result": []}]
    assert (tmp_path / "ls" / "train" / "ünïcödé.jpg").is_file()
    assert (tmp_path / "ls" / "classes.txt").read_text(encoding="utf-8") == "élan\nzebra\n"


def test_bad_outputs_are_refused_before_anything_is_written(voc, tmp_path):
    before = sorted(p.relative_to(voc) for p in voc.rglob("*"))
    for out, rule in [(voc, "is the input"), (voc / "converted", "is inside the input folder"),
                      (tmp_path, "a folder above the input")]:
        with pytest.raises(OutputError, match=rule):
            convert_dataset(voc, out, "yolo")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(OutputError, match="exists and is not empty"):
        convert_dataset(voc, tmp_path / "full", "coco")
    assert sorted(p.relative_to(voc) for p in voc.rglob("*")) == before


def test_missing_images_are_listed_and_an_unknown_format_named(voc, tmp_path):
    (voc / "JPEGImages" / "c.jpg").unlink()
    (voc / "JPEGImages" / "b.jpg").unlink()
    with pytest.raises(DataError, match=r"2 problem\(s\) in the dataset.*id 'b'.*id 'c'"):
        convert_dataset(voc, tmp_path / "out", "coco")
    with pytest.raises(DataError, match="--to 'yolov8': not a format; did you mean 'yolo'"):
        convert_dataset(_voc(tmp_path / "other"), tmp_path / "out", "yolov8")
    assert not (tmp_path / "out").exists()


def test_cli_convert(voc, tmp_path, capsys):
    assert main(["data", "convert", str(voc), str(tmp_path / "c"), "--to", "coco", "--images", "copy"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert _records(load_dataset(tmp_path / "c")) == _records(load_dataset(voc))
    assert main(["data", "convert", str(voc), str(voc / "x"), "--to", "coco", "--quiet"]) == 1
    assert "error: OUT" in capsys.readouterr().err
    assert main(["data"]) == 2
    assert "ssd data: name a command: convert, split, merge or browse" in capsys.readouterr().err
    assert main(["data", "convert", str(voc), str(tmp_path / "d"), "--to", "coco", "--images", "move"]) == 2


def test_a_trainval_split_is_left_out_where_the_format_cannot_name_it(voc, tmp_path, ssd_messages):
    """VOC's trainval (= train + val) converts to YOLO as train and val, each image once; a split that holds other
    images is refused; VOC keeps it, one image file for both lists."""
    (voc / "ImageSets" / "Main" / "trainval.txt").write_text("a\nb\nünïcödé\nc\n")
    convert_dataset(voc, tmp_path / "y", "yolo")
    assert sorted(load_dataset(tmp_path / "y").splits) == ["train", "val"]
    assert "split 'trainval' left out: each of its 4 images is in train, val" in ssd_messages()[-1]
    convert_dataset(voc, tmp_path / "v", "voc")
    assert {s: len(r) for s, r in load_dataset(tmp_path / "v").splits.items()} == {"train": 3, "val": 1,
                                                                                    "trainval": 4}
    assert len(list((tmp_path / "v" / "JPEGImages").iterdir())) == 4
    (voc / "ImageSets" / "Main" / "val.txt").write_text("")
    (voc / "ImageSets" / "Main" / "test.txt").write_text("c\n")
    (voc / "ImageSets" / "Main" / "extra.txt").write_text("c\n")
    (voc / "ImageSets" / "Main" / "train.txt").write_text("a\n")
    with pytest.raises(DataError, match=r"split 'trainval': a coco dataset names only the splits train, val, test, "
                                        r"and 2 of its images are in none of them"):
        convert_dataset(voc, tmp_path / "c", "coco")


def test_labelstudio_to_voc_keeps_the_boxes_and_class_order(voc, tmp_path):
    """Label Studio -> VOC with the Label Studio reader (where it exists): the same boxes, names and labels (the tasks
    hold no difficult or crowd flag: those are dropped with a warning on the way in)."""
    pytest.importorskip("ssd.data.labelstudio")
    convert_dataset(voc, tmp_path / "ls", "labelstudio")
    convert_dataset(tmp_path / "ls", tmp_path / "back", "voc")

    def plain(spec):
        names, splits = _records(spec)
        return names, {s: [(n, w, h, [o[:3] for o in objects]) for n, w, h, objects in r] for s, r in splits.items()}

    assert plain(load_dataset(tmp_path / "back")) == plain(load_dataset(voc))

"""The start after an edit costs that file: the stored index is patched for a few changed files (their records read
alone and spliced into the tables, their issues replaced in reading order), and the patched index equals, array for
array, the one a cold build makes; what a patch cannot do exactly (files added or removed, a class list that
changes, a file that became invalid) is rebuilt, with the same result."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import ssd.data.index as index_module
from builders import make_dataset, write_image
from ssd.data.check import find_issues
from ssd.data.index import index_dataset
from ssd.data.load import load_dataset
from ssd.data.records import ImageRecord, ObjectRecord
from ssd.data.table import RecordTable
from ssd.data.table_splice import splice_record
from test_data_index import index_file, settle
from test_data_index_file import rewrite

KEYS = (("train",), ("train", "val"))
"""Two checks stored in one index (ssd val's and ssd train's): a patch replaces both."""


@pytest.fixture
def patched(monkeypatch) -> list[bool]:
    """Whether each run that found changed files patched the index (else it rebuilt it)."""
    calls: list[bool] = []
    patch = index_module.patch_index

    def spy(stored, spec, paths, states, start_ns):
        result = patch(stored, spec, paths, states, start_ns)
        if not np.array_equal(states, stored.arrays["files.state"]):
            calls.append(result is not None)
        return result
    monkeypatch.setattr(index_module, "patch_index", spy)
    return calls


def _members(path: Path) -> dict:
    """The index file's arrays and meta data, but the per-file results (a patch keeps those it no longer uses until
    the next rebuild) and what tells a patched index from a rebuilt one."""
    with np.load(path) as z:
        members = {name: z[name] for name in z.files if name not in ("memo", "memo_patch", "digests", "meta")}
        meta = json.loads(z["meta"].tobytes())
    meta.pop("appended")
    return members | {"meta": meta}


def _assert_equal_members(a: dict, b: dict) -> None:
    assert a.keys() == b.keys() and a.pop("meta") == b.pop("meta")
    for name, array in a.items():
        assert array.dtype == b[name].dtype and np.array_equal(array, b[name]), name


def _index_equals_a_cold_build(data: Path, tmp_path: Path, monkeypatch, name: str) -> list[tuple[str, str]]:
    """Index ``data`` for both checks, then build it cold in a cache of its own: the same issues, records and index
    arrays, and the same as a check without any index. The files the first index read, by name."""
    indexed = [index_dataset(data, splits=splits) for splits in reversed(KEYS)]
    kept = _members(index_file(data))
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / f"cold-{name}"))
    cold = [index_dataset(data, splits=splits) for splits in reversed(KEYS)]
    unindexed = load_dataset(data)
    for warm, built, splits in zip(indexed, cold, reversed(KEYS)):
        assert warm.issues == built.issues == find_issues(unindexed, splits, decode_images=True)
        assert warm.spec.issues == built.spec.issues == unindexed.issues
        assert warm.spec.class_names == unindexed.class_names
        for split, records in unindexed.splits.items():
            assert list(warm.spec.splits[split]) == list(built.spec.splits[split]) and len(records) == len(
                built.spec.splits[split])
    _assert_equal_members(kept, _members(index_file(data)))
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    return sorted((kind, Path(path).name) for kind, path in indexed[0].reads)


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


@pytest.fixture
def voc(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    data = make_dataset("voc", tmp_path / "voc", train=6, val=3, size=64, classes=3, seed=1)
    _edit(data / "Annotations" / "synth_000003.xml", "</annotation>", "<object><name>circle</name><difficult>maybe"
          "</difficult><bndbox><xmin>50</xmin><ymin>5</ymin><xmax>67</xmax><ymax>9</ymax></bndbox></object>"
          "</annotation>")  # past the border (a rule's warning), a flag that is not one (a reader's warning)
    settle(data)
    for splits in KEYS:
        index_dataset(data, splits=splits)
    return data


def test_an_edited_annotation_is_patched_and_the_index_equals_a_cold_build(voc, tmp_path, monkeypatch, patched):
    xml = voc / "Annotations" / "synth_000001.xml"
    _edit(xml, "<xmin>", "<xmin>1")  # a box moved
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "moved") == [("voc", xml.name)]
    _edit(xml, "</annotation>", "<object><name>circle</name><bndbox><xmin>70</xmin><ymin>5</ymin><xmax>90</xmax>"
          "<ymax>9</ymax></bndbox></object></annotation>")  # an error now, before synth_000003's warning
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "outside") == [("voc", xml.name)]
    assert any(i.code == "outside_image" for i in index_dataset(voc, splits=KEYS[1]).issues)
    flagged = voc / "Annotations" / "synth_000003.xml"  # its reader's and rules' issues replaced where they stand
    _edit(flagged, "<xmin>", "<xmin>1")
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "flagged") == [("voc", flagged.name)]
    val = voc / "Annotations" / "synth_000007.xml"
    _edit(val, "<difficult>0</difficult>", "<difficult>1</difficult>")  # a val file: ssd val's check patched too
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "val") == [("voc", val.name)]
    assert patched == [True, True, True, True]


def test_an_image_rewritten_in_place_is_read_and_decoded_again(voc, tmp_path, monkeypatch, patched):
    image = voc / "JPEGImages" / "synth_000002.jpg"
    Image.new("RGB", (64, 64), (9, 9, 9)).save(image)  # another picture of the same size
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "image") == [
        ("decode", image.name), ("size", image.name), ("voc", "synth_000002.xml")]  # its record read again whole
    image.write_bytes(image.read_bytes()[:100])  # truncated: a decode error where the image had none
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "truncated") == [("size", image.name)]
    assert patched == [True, False]  # the header no longer reads: the record is gone, rebuilt


def test_files_added_removed_or_made_invalid_are_rebuilt_as_a_cold_build(voc, tmp_path, monkeypatch, patched):
    for name in ("synth_000001", "synth_000008"):
        shutil.copy(voc / "Annotations" / f"{name}.xml", voc / "Annotations" / f"new{name}.xml")
        shutil.copy(voc / "JPEGImages" / f"{name}.jpg", voc / "JPEGImages" / f"new{name}.jpg")
    with (voc / "ImageSets" / "Main" / "train.txt").open("a") as f:
        f.write("newsynth_000001\nnewsynth_000008\n")
    _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "added")
    (voc / "Annotations" / "synth_000004.xml").unlink()
    _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "removed")
    _edit(voc / "Annotations" / "synth_000005.xml", "<xmin>", "<xmin>x")  # not a number: a reader error
    assert ("voc", "synth_000005.xml") in _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "invalid")
    assert True not in patched  # the file list changed (never patched), or the edit is left to the rebuild


def test_a_class_list_read_from_the_annotations_that_changes_is_rebuilt(tmp_path, monkeypatch, patched):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    data = make_dataset("voc", tmp_path / "voc", train=4, val=2, size=64, classes=2, seed=3)
    (data / "classes.txt").unlink()
    settle(data)
    for splits in KEYS:
        index_dataset(data, splits=splits)
    names = load_dataset(data).class_names
    xml = data / "Annotations" / "synth_000000.xml"
    _edit(xml, f"<name>{names[0]}</name>", "<name>a_new_class</name>")
    _index_equals_a_cold_build(settle(data), tmp_path, monkeypatch, "new")
    assert load_dataset(data).class_names == sorted([*names, "a_new_class"])
    _edit(xml, "<name>a_new_class</name>", f"<name>{names[0]}</name>")  # its only object: the class is gone
    _index_equals_a_cold_build(settle(data), tmp_path, monkeypatch, "gone")
    _edit(xml, "<xmin>", "<xmin>1")
    assert _index_equals_a_cold_build(settle(data), tmp_path, monkeypatch, "moved") == [("voc", xml.name)]
    assert patched == [False, False, True]


def test_an_edited_yolo_label_file_is_patched(tmp_path, monkeypatch, patched):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    data = make_dataset("yolo", tmp_path / "yolo", train=6, val=2, size=64, classes=3, bad_label=True)
    settle(data.parent)
    for splits in KEYS:
        index_dataset(data, splits=splits)
    label = data.parent / "labels" / "train" / "img2.txt"
    label.write_text(label.read_text() + "1 0.5 0.5 0.01 0.01\n")  # a tiny box: a warning before img5's error
    settle(data.parent)
    assert _index_equals_a_cold_build(data, tmp_path, monkeypatch, "tiny") == [("yolo", label.name)]
    label.write_text(label.read_text() + "7 0.5 0.5 0.2 0.2\n")  # out of range: a rule's error
    settle(data.parent)
    assert _index_equals_a_cold_build(data, tmp_path, monkeypatch, "range") == [("yolo", label.name)]
    label.write_text(label.read_text() + "x 0.5 0.5 0.2 0.2\n")  # a reader error the file had none of
    settle(data.parent)
    _index_equals_a_cold_build(data, tmp_path, monkeypatch, "parse")
    assert patched == [True, True, False]


def _record(i: int, objects: int, folder: str = "/data/") -> ImageRecord:
    return ImageRecord(Path(f"{folder}img/{i}.jpg"), Path(f"{folder}xml/{i}.xml"), [
        ObjectRecord((1.0 + j, 2.0, 5.5, 9.0), j % 2, ["cat", "dög"][j % 2], j == 1, False, j + 1,
                     Path(f"{folder}xml/{i}.xml"), f"xml/{i}.xml object {j + 1}", f"x={j}") for j in range(objects)],
        64, 48, str(i))


@pytest.mark.parametrize("row, objects, folder", [(0, 0, "/data/"), (1, 3, "/data/"), (2, 1, "/other/"),
                                                  (0, 2, "/other/"), (2, 0, "/data/")])
def test_a_spliced_table_equals_the_table_of_the_new_records(row, objects, folder):
    """Every column, the common prefixes of the path columns included (an image of another folder shortens them;
    the one that kept them short replaced lengthens them)."""
    records = [_record(0, 2, "/other/" if folder == "/data/" and row == 0 else "/data/"), _record(1, 0),
               _record(2, 3)]
    new = [*records[:row], _record(row, objects, folder), *records[row + 1:]]
    spliced = splice_record(RecordTable.from_records(records), row, new[row]).arrays("")
    expected = RecordTable.from_records(new).arrays("")
    assert spliced.keys() == expected.keys()
    for name, array in expected.items():
        assert spliced[name].dtype == array.dtype and np.array_equal(spliced[name], array), name
    assert bytes(spliced["paths.prefix"]) == (b"/" if "/other/" in {str(r.path)[:7] for r in new} else b"/data/img/")


def test_message_columns_found_damaged_by_a_patch_are_rebuilt_in_the_same_run(voc, tmp_path, monkeypatch, caplog,
                                                                               patched):
    path = index_file(voc)
    train = json.loads(np.load(path)["meta"].tobytes())["splits"].index("train")
    rewrite(path, lambda m: m.__setitem__(f"split{train}.where.blob", m[f"split{train}.where.blob"][::-1].copy()))
    _edit(voc / "Annotations" / "synth_000001.xml", "<xmin>", "<xmin>1")
    assert len(_index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "damaged")) == 3 * 9  # all read
    assert patched == [False] and [r.getMessage() for r in caplog.records if r.name == "ssd"] == [
        f"dataset cache: {path} is not a valid index (its message columns of split {train} do not match their digest "
        "(edited or damaged)): rebuilding it now"]


def test_the_results_of_many_patches_are_merged_by_a_rebuild(voc, tmp_path, monkeypatch, patched):
    monkeypatch.setattr("ssd.data.index_patch.PATCHED_SHARE", 10)  # 9 images, 21 files: at most 2 results kept
    monkeypatch.setattr("ssd.data.index_patch.PATCHED_MIN", 0)
    xml = voc / "Annotations" / "synth_000001.xml"
    for round_ in range(3):  # each patch keeps 2 results: the file's and its image's rules
        _edit(xml, "<xmin>", "<xmin>1")
        assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, f"round{round_}") == [("voc", xml.name)]
    with np.load(index_file(voc)) as z:
        assert "memo_patch" not in z.files and json.loads(z["meta"].tobytes())["appended"] == 0
    assert patched == [True, True, False]


def test_a_file_whose_reader_error_is_mended_without_changing_its_record_is_checked_again(voc, tmp_path, monkeypatch,
                                                                                           patched):
    """The per-image rules read the reader's errors too: an image without objects is said only when its file reads."""
    xml = voc / "Annotations" / "synth_000002.xml"
    head = xml.read_text().split("<object>")[0]
    xml.write_text(head + "<object><bndbox><xmin>1</xmin><ymin>1</ymin><xmax>9</xmax><ymax>9</ymax></bndbox>"
                   "</object></annotation>")  # its one object has no name: an error, no record objects
    _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "nameless")
    xml.write_text(head + "</annotation>")  # the same record (no objects), the error gone: now "no objects"
    assert _index_equals_a_cold_build(settle(voc), tmp_path, monkeypatch, "empty") == [("voc", xml.name)]
    image = voc / "JPEGImages" / "synth_000002.jpg"
    assert "no_objects" in {i.code for i in index_dataset(voc, splits=KEYS[1]).issues if i.image == image}
    assert patched == [False, True]


def test_an_edited_labelme_file_is_patched_with_the_polygon_summary_made_again(tmp_path, monkeypatch, patched):
    monkeypatch.setenv("SSD_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "labelme"
    folder.mkdir()
    for name in ("a.json", "b.json"):
        shutil.copy(Path(__file__).parent / "data" / "labelme" / name, folder)
    write_image(folder / "a.jpg", 40, 30)
    write_image(tmp_path / "pictures" / "b.jpg", 50, 20)
    settle(tmp_path)
    for splits in KEYS:
        index_dataset(folder, splits=splits)
    a, b = folder / "a.json", folder / "b.json"

    def shapes(path: Path, change) -> None:
        data = json.loads(path.read_text())
        change(data["shapes"][0])
        path.write_text(json.dumps(data, indent=2))
    shapes(a, lambda shape: shape["points"][0].__setitem__(0, 31.0))  # moved, in the file with reader's warnings
    settle(tmp_path)
    assert _index_equals_a_cold_build(folder, tmp_path, monkeypatch, "moved") == [("labelme", a.name)]
    shapes(b, lambda shape: shape.update(shape_type="polygon", points=[[0, 0], [50, 20], [3, 19]]))  # counted
    settle(tmp_path)
    assert _index_equals_a_cold_build(folder, tmp_path, monkeypatch, "polygon") == [("labelme", b.name)]
    assert "2 polygon(s)" in next(i.message for i in index_dataset(folder).issues if i.code == "polygon_as_box")
    assert patched == [True, True]

"""The CVAT reader on files shaped as CVAT exports them ("CVAT for images 1.1" and "CVAT for video 1.1",
tests/data/cvat), through load, check, the gate and its index."""

import re
import shutil
from pathlib import Path

import pytest

from builders import write_image
from ssd.data import check_dataset, load_dataset
from ssd.data.cvat import read_cvat_split
from ssd.data.gate import load_training_data
from ssd.errors import DataError

FIXTURES = Path(__file__).parent / "data" / "cvat"


@pytest.fixture
def images_export(tmp_path):
    """An images task's export: ``annotations.xml`` and ``images/street/{a,b,c}.jpg``."""
    folder = tmp_path / "export"
    folder.mkdir()
    shutil.copy(FIXTURES / "images.xml", folder / "annotations.xml")
    for name in ("a", "b", "c"):
        write_image(folder / "images" / "street" / f"{name}.jpg", 64, 48)
    return folder


def test_cvat_images_boxes_polygons_attributes(images_export):
    spec = load_dataset(images_export)
    assert spec.format == "cvat" and spec.class_names == ["person", "car"]  # <meta>'s labels, in CVAT's order
    assert spec.sources == {"train": images_export / "annotations.xml"}
    a, b, c = spec.splits["train"]
    assert a.path == images_export / "images" / "street" / "a.jpg" and a.image_id == 0 and b.objects == c.objects == []
    car, person = a.objects
    assert car.box == (4.5, 6.0, 30.25, 40.0) and car.label == 1 and car.occluded and car.z_order == 2
    assert car.where == "annotations.xml image 0 (street/a.jpg) box 1 (car)"
    assert person.box == (40.0, 10.0, 50.0, 30.0) and person.label == 0 and not person.occluded
    codes = {i.code: i for i in spec.issues}
    assert sorted(codes) == ["parse_error", "polygon_as_box", "shape_not_read"]
    assert codes["parse_error"].message == (
        "annotations.xml image 2 (street/c.jpg) box 1 (person): xtl='1.00' ytl='2.00' xbr='ten' ybr='9.00' are not "
        "four numbers (CVAT boxes are <box label= xtl= ytl= xbr= ybr=> in pixels)")
    assert codes["shape_not_read"].message.startswith("annotations.xml image 0 (street/a.jpg) polyline 3 (person): ")


def test_cvat_attributes_survive_the_index(images_export):
    for _ in range(2):  # built, then read back from the index
        spec = load_training_data(images_export, splits=("train",), skip_invalid=True)
        car = spec.splits["train"][0].objects[0]
        assert (car.occluded, car.z_order, car.box) == (True, 2, (4.5, 6.0, 30.25, 40.0))


def test_cvat_video_tracks_become_frames(tmp_path):
    folder = tmp_path / "clip"
    folder.mkdir()
    shutil.copy(FIXTURES / "video.xml", folder / "annotations.xml")
    for frame in range(3):
        write_image(folder / "images" / f"frame_{frame:06d}.png", 64, 48)
    spec = load_dataset(folder)
    frames = spec.splits["train"]
    assert [r.image_id for r in frames] == [0, 1, 2] and frames[0].path.name == "frame_000000.png"
    assert [[o.box for o in r.objects] for r in frames] == [[(10.0, 10.0, 20.0, 20.0)], [(12.0, 10.0, 22.0, 20.0)],
                                                            []]  # frame 2: the car is outside
    assert frames[1].objects[0].occluded and frames[1].objects[0].where == "annotations.xml track 0 frame 1 box 1 (car)"
    (folder / "images" / "frame_000001.png").unlink()
    [missing] = [i for i in load_dataset(folder).issues if i.code == "missing_image"]
    assert missing.message.startswith("annotations.xml frame 1: image not found in ")


def test_cvat_split_folders_mixed_with_other_tools(tmp_path, images_export):
    root = tmp_path / "data"
    shutil.copytree(images_export, root / "train")
    (root / "val").mkdir()
    shutil.copy(FIXTURES / "video.xml", root / "val" / "annotations.xml")
    write_image(root / "val" / "frame_000000.png", 64, 48)
    with pytest.raises(DataError, match=r"declare different labels: \['person', 'car'\] vs \['car'\]"):
        load_dataset(root)


@pytest.mark.parametrize("text, message", [
    ("<annotations><image id='0' name='a.jpg'>", ":1: XML does not parse (no element found"),
    ("<annotation></annotation>", ": the root element is <annotation>, not <annotations>"),
])
def test_cvat_file_that_cannot_be_read(tmp_path, text, message):
    (tmp_path / "task.xml").write_text(text)
    with pytest.raises(DataError, match=re.escape(f"{tmp_path / 'task.xml'}{message}")):
        read_cvat_split(tmp_path / "task.xml", tmp_path, "train", [])


def test_cvat_check_reports_the_box_that_does_not_parse(images_export):
    report = check_dataset(images_export)
    assert [i.code for i in report.errors] == ["parse_error"]

"""`ssd data merge`: classes matched by name after --map, differing class lists refused (or their union), the
report of what went where, images of the same name kept apart."""

import pytest
import yaml

from ssd.cli import main
from ssd.data.commands.convert import convert_dataset
from ssd.data.commands.merge import merge_datasets
from ssd.data.load import load_dataset
from ssd.errors import DataError
from test_data_convert import _voc


@pytest.fixture
def two(tmp_path):
    """The VOC fixture (élan, zebra) and a YOLO copy of it whose classes are named Elan and zebra."""
    voc = _voc(tmp_path / "voc")
    convert_dataset(voc, tmp_path / "yolo", "yolo")
    desc = yaml.safe_load((tmp_path / "yolo" / "data.yaml").read_text(encoding="utf-8"))
    desc["names"] = ["Elan", "zebra"]
    (tmp_path / "yolo" / "data.yaml").write_text(yaml.safe_dump(desc, allow_unicode=True), encoding="utf-8")
    return voc, tmp_path / "yolo"


def test_differing_classes_are_refused_until_mapped(two, tmp_path):
    voc, yolo = two
    with pytest.raises(DataError, match=r"only .*voc has \['élan'\], only .*yolo has \['Elan'\]"):
        merge_datasets([voc, yolo], tmp_path / "m")
    with pytest.raises(DataError, match="no dataset has a class 'elan'; did you mean 'Elan'"):
        merge_datasets([voc, yolo], tmp_path / "m", map=["elan=élan"])
    assert not (tmp_path / "m").exists()
    summary = merge_datasets([voc, yolo], tmp_path / "m", map=["Elan=élan"], to="coco")
    spec = load_dataset(tmp_path / "m")
    assert spec.class_names == ["élan", "zebra"]
    assert {s: len(r) for s, r in spec.splits.items()} == {"train": 6, "val": 2}
    names = sorted(r.path.name for r in spec.splits["train"])
    assert names == ["a.jpg", "a_2.jpg", "b.jpg", "b_2.jpg", "ünïcödé.jpg", "ünïcödé_2.jpg"]
    assert [o.name for r in spec.splits["val"] for o in r.objects] == ["élan", "élan"]
    text = str(summary)
    assert f"{yolo} (yolo) train: 3 images -> train" in text
    assert "  Elan -> élan: 2 objects" in text and "  zebra: 2 objects" in text


def test_union_keeps_every_class_and_the_cli_prints_the_report(two, tmp_path, capsys):
    voc, yolo = two
    assert main(["data", "merge", str(voc), str(yolo), str(tmp_path / "u"), "--union", "--to", "yolo"]) == 0
    assert load_dataset(tmp_path / "u").class_names == ["élan", "zebra", "Elan"]
    assert "classes (3): élan, zebra, Elan" in capsys.readouterr().out
    assert main(["data", "merge", str(voc), str(voc / "inside")]) == 2  # one dataset is no merge

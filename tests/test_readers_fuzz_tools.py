"""Property-based fuzzing of the annotation tools' readers (LabelMe, Label Studio, CVAT), as test_readers_fuzz does
the others: mutated files raise nothing but ``DataError`` naming the file, and every problem ``check`` reports names
its file."""

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ssd.data import load_dataset
from test_readers_fuzz import (
    FUZZ,
    _assert_reads_or_names,
    _jpg,
    byte_mutations,
    element_mutations,
    number_mutations,
    tree_mutations,
)

DATA = Path(__file__).parent / "data"


def _mutated(data, valid: str, parsed=None) -> bytes:
    kinds = ["numbers", "bytes"] + (["tree"] if parsed is not None else ["elements"])
    kind = data.draw(st.sampled_from(kinds))
    if kind == "tree":
        return json.dumps(data.draw(tree_mutations(parsed))).encode()
    if kind == "elements":
        return data.draw(element_mutations(valid)).encode()
    if kind == "numbers":
        return data.draw(number_mutations(valid)).encode()
    return data.draw(byte_mutations(valid.encode()))


@pytest.fixture(scope="module")
def tool_dirs(tmp_path_factory) -> dict[str, Path]:
    """A folder per tool with its fixture's images and a classes.txt (so a mutation that loses every object still
    leaves a dataset to check)."""
    root = tmp_path_factory.mktemp("tools")
    _jpg(root / "labelme" / "a.jpg", 40, 30)
    _jpg(root / "labelstudio" / "cat.jpg", 200, 100)
    _jpg(root / "labelstudio" / "photos" / "dog.png", 100, 50)
    for name in "abc":
        _jpg(root / "cvat" / "images" / "street" / f"{name}.jpg", 64, 48)
    for tool in ("labelme", "labelstudio", "cvat"):
        (root / tool / "classes.txt").write_text("person\ncar\ncat\ndog\n")
    return {tool: root / tool for tool in ("labelme", "labelstudio", "cvat")}


@FUZZ
@given(data=st.data())
def test_labelme_reader_survives_mutations(tool_dirs, data):
    valid = (DATA / "labelme" / "a.json").read_text()
    path = tool_dirs["labelme"] / "a.json"
    path.write_bytes(_mutated(data, valid, json.loads(valid)))
    _assert_reads_or_names(lambda: load_dataset(tool_dirs["labelme"]), path)


@FUZZ
@given(data=st.data())
def test_labelstudio_reader_survives_mutations(tool_dirs, data):
    valid = (DATA / "labelstudio" / "export.json").read_text()
    path = tool_dirs["labelstudio"] / "export.json"
    path.write_bytes(_mutated(data, valid, json.loads(valid)))
    _assert_reads_or_names(lambda: load_dataset(path), path)


@FUZZ
@given(data=st.data())
def test_cvat_reader_survives_mutations(tool_dirs, data):
    valid = (DATA / "cvat" / "images.xml").read_text()
    path = tool_dirs["cvat"] / "annotations.xml"
    path.write_bytes(_mutated(data, valid))
    _assert_reads_or_names(lambda: load_dataset(path), path)

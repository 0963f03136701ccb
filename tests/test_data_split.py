"""`ssd data split`: iterative stratification by class (hand-computed cases), list files the readers take, a new
dataset in another format, and the shares' rules."""

import pytest

from ssd.cli import main
from ssd.data.commands.split import split_dataset, stratified_split
from ssd.data.load import load_dataset
from ssd.errors import DataError
from test_data_convert import _voc


def test_the_rare_class_goes_to_every_split_in_its_share():
    """Images 4 and 5 hold the rare class 1: one per split (a random split puts both in one half a third of the
    time); then class 0's four images two and two, train first on ties."""
    labels = [{0}, {0}, {0}, {0}, {0, 1}, {0, 1}]
    for seed in range(5):
        parts = stratified_split(labels, {"train": 0.5, "val": 0.5}, seed)
        assert len(parts["train"]) == len(parts["val"]) == 3
        assert len({4, 5} & set(parts["train"])) == 1 and len({4, 5} & set(parts["val"])) == 1
    assert stratified_split(labels, {"train": 0.5, "val": 0.5}, 3) == stratified_split(
        labels, {"train": 0.5, "val": 0.5}, 3)


def test_images_without_objects_fill_the_splits_by_size():
    parts = stratified_split([set()] * 10, {"train": 0.7, "val": 0.2, "test": 0.1}, 0)
    assert [len(parts[s]) for s in ("train", "val", "test")] == [7, 2, 1]
    assert sorted(i for p in parts.values() for i in p) == list(range(10))


def test_voc_lists_over_the_source_files(tmp_path):
    voc = _voc(tmp_path / "src")
    summary = split_dataset(voc, tmp_path / "s", val=0.5, seed=1)
    spec = load_dataset(tmp_path / "s")
    assert {s: len(r) for s, r in spec.splits.items()} == {"train": 2, "val": 2}
    assert summary.images == {"train": 2, "val": 2}
    assert [summary.counts["train"][0] + summary.counts["val"][0], summary.counts["train"][1] +
            summary.counts["val"][1]] == [2, 2]  # élan twice, zebra twice: every object kept
    assert summary.counts["train"][0] == summary.counts["val"][0] == 1  # élan's two images: one per split
    assert (tmp_path / "s" / "JPEGImages").resolve() == (voc / "JPEGImages").resolve()
    assert "élan" in str(summary) and "(50.0%)" in str(summary)


def test_yolo_lists_keep_flags_and_a_format_writes_a_dataset(tmp_path):
    voc = _voc(tmp_path / "src")
    assert main(["data", "convert", str(voc), str(tmp_path / "y"), "--to", "yolo"]) == 0
    split_dataset(tmp_path / "y", tmp_path / "lists", val=0.25, seed=0)
    spec = load_dataset(tmp_path / "lists")
    flags = sorted((r.path.name, o.difficult, o.iscrowd) for rs in spec.splits.values() for r in rs
                   for o in r.objects if o.difficult or o.iscrowd)
    assert flags == [("a.jpg", True, False), ("b.jpg", False, True)]
    split_dataset(tmp_path / "y", tmp_path / "coco", val=0.25, test=0.25, seed=0, to="coco")
    assert {s: len(r) for s, r in load_dataset(tmp_path / "coco").splits.items()} == {"train": 2, "val": 1,
                                                                                       "test": 1}


def test_bad_shares_are_refused(tmp_path):
    voc = _voc(tmp_path / "src")
    with pytest.raises(DataError, match="--test 0.1 of 4 images is no image"):
        split_dataset(voc, tmp_path / "s", val=0.5, test=0.1)
    assert main(["data", "split", str(voc), str(tmp_path / "s"), "--val", "0.6", "--test", "0.5"]) == 2
    assert not (tmp_path / "s").exists()

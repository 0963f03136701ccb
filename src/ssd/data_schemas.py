"""The schemas of ``ssd data convert | split | merge | browse``, in the style of :mod:`ssd.schemas`: a frozen
dataclass per command, a field per option (its type, default and help, once); the command line takes the fields
named in ``POSITIONAL`` as positional arguments and the others as ``--options``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ssd.limits import is_real, is_whole
from ssd.schemas import CommandSchema, option

__all__ = ["DataConvertConfig", "DataSplitConfig", "DataMergeConfig", "DataBrowseConfig", "POSITIONAL"]

_SOURCE = "the dataset: data.yaml, dataset folder or COCO JSON (what --data takes)"
_OUT = "the new dataset folder (must not exist or be empty; never inside an input)"
_IMAGES = ("link: hard links (symbolic across file systems); copy; none: annotation files only (put the images in "
           "place yourself). Images are never moved")
Format = Literal["voc", "coco", "yolo", "labelstudio"]

POSITIONAL = {"convert": ("source", "out"), "split": ("source", "out"), "merge": ("sources",),
              "browse": ("source",)}
"""Per command, the fields given as positional arguments (in order)."""


@dataclass(frozen=True, kw_only=True)
class DataConvertConfig(CommandSchema):
    """``ssd data convert``: a dataset written in another format, splits and every object kept."""

    source: str = option(_SOURCE)
    out: Path = option(_OUT)
    to: Format = option("the format to write")
    images: Literal["link", "copy", "none"] = option(_IMAGES, "link")


@dataclass(frozen=True, kw_only=True)
class DataSplitConfig(CommandSchema):
    """``ssd data split``: every image of a dataset dealt into train / val (/ test), stratified by class."""

    source: str = option(_SOURCE)
    out: Path = option(_OUT)
    val: float = option("share of the images for val", 0.2)
    test: float = option("share of the images for test", 0.0)
    seed: int = option("random seed of the deal", 0)
    to: Literal["lists", "voc", "coco", "yolo", "labelstudio"] | None = option(
        "lists: list files over the source's own files (YOLO image lists and a data.yaml, or VOC ImageSets with "
        "links to its folders); or a format to write the dataset in (default: lists for YOLO and VOC, else the "
        "source's format)", None)
    images: Literal["link", "copy", "none"] = option(_IMAGES, "link")

    def __post_init__(self) -> None:
        for name in ("val", "test"):
            value = getattr(self, name)
            self._require(name, is_real(value) and 0 <= value < 1, "must be a share in [0, 1)")
        self._require("test", self.val + self.test < 1, "leaves no image for train (--val + --test must be < 1)")
        self._require("seed", is_whole(self.seed), "must be a whole number")


@dataclass(frozen=True, kw_only=True)
class DataMergeConfig(CommandSchema):
    """``ssd data merge``: datasets merged into one, classes matched by name (after ``--map``)."""

    sources: list[str] = option("the datasets to merge, then the new folder: A B ... OUT")
    map: list[str] = option("rename classes before merging: old=new (several allowed)", default_factory=list,
                            metavar="OLD=NEW")
    union: bool = option("accept datasets whose class lists differ: the merged list is their union", False)
    to: Format | None = option("the format to write (default: the first dataset's, YOLO when it cannot be "
                               "written)", None)
    images: Literal["link", "copy", "none"] = option(_IMAGES, "link")

    def __post_init__(self) -> None:
        self._require("sources", len(self.sources) >= 3, "needs at least two datasets and the output folder")


@dataclass(frozen=True, kw_only=True)
class DataBrowseConfig(CommandSchema):
    """``ssd data browse``: one self-contained HTML page of a dataset."""

    source: str = option(_SOURCE)
    output: Path = option("the HTML page to write", Path("browse.html"))
    split: str | None = option("only this split (default: all)", None)
    limit: int = option("thumbnails shown (the flagged images first)", 200)
    augmented: bool = option("also show training batches as the trainer builds them (augmentation, mosaic, "
                             "crops of --config)", False)
    config: Path | None = option("ssd train options (YAML) whose augmentation --augmented shows (default: "
                                 "ssd train's defaults)", None, metavar="YAML")
    batches: int = option("training batches shown with --augmented", 2)

    def __post_init__(self) -> None:
        self._positive("limit", "batches")

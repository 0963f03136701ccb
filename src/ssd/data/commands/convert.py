"""``ssd data convert``: a dataset read by any reader, written in another format with its splits, every object kept
(see :mod:`ssd.data.commands.formats` for what each format carries)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ssd.data.commands.formats import WRITERS, Target
from ssd.data.commands.output import check_dataset_output, missing_images, place_images, staged, unique_names
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord
from ssd.errors import DataError
from ssd.log import LOGGER
from ssd.names import did_you_mean
from ssd.text import few

__all__ = ["ConvertSummary", "convert_dataset", "write_dataset", "usable_records"]

_SPLIT_NAMES = ("train", "val", "test")
"""The splits that COCO, YOLO and Label Studio datasets name (their readers know no others)."""


@dataclass
class ConvertSummary:
    """What a write produced: the folder, its format, images and objects per split."""

    out: Path
    format: str
    images: dict[str, int]
    objects: dict[str, int]

    def __str__(self) -> str:
        splits = ", ".join(f"{s}: {self.images[s]} images, {self.objects[s]} objects" for s in self.images)
        return f"wrote {self.out} ({self.format}; {splits})"


def usable_records(spec: DatasetSpec) -> dict[str, list[ImageRecord]]:
    """Every split's records, refused (naming the problems) when a reader found errors or an object's class is not
    in the class list: a converted dataset holds exactly what the source does."""
    errors = [i for i in spec.issues if i.severity == "error"]
    if errors:
        raise DataError(f"{spec.root}: {len(errors)} problem(s) in the dataset, fix them first (ssd check "
                        f"{spec.root} lists them all): {few([i.message for i in errors], 3)}")
    splits = {split: list(records) for split, records in spec.splits.items()}
    for records in splits.values():
        for record in records:
            for obj in record.objects:
                if not 0 <= obj.label < spec.num_classes:
                    raise DataError(f"{obj.where or record.path}: class {obj.name!r} is not one of the dataset's "
                                    f"{spec.num_classes} classes{did_you_mean(obj.name, spec.class_names)}")
    return splits


def _named_splits(splits: dict[str, list[ImageRecord]], to: str) -> dict[str, list[ImageRecord]]:
    """The splits a ``to`` dataset can name: any for VOC; else train, val and test, and a split beyond them (VOC's
    ``trainval``) only when each of its images is in one of them: it is left out, and said so."""
    if to == "voc":
        return splits
    kept = {s: r for s, r in splits.items() if s in _SPLIT_NAMES}
    listed = {r.path for records in kept.values() for r in records}
    for split, records in splits.items():
        if split in kept:
            continue
        outside = [str(r.path) for r in records if r.path not in listed]
        if outside:
            raise DataError(f"split {split!r}: a {to} dataset names only the splits {', '.join(_SPLIT_NAMES)}, and "
                            f"{len(outside)} of its images are in none of them ({few(outside, 3)}): convert to "
                            "voc, or make it one of those splits")
        LOGGER.info(f"split {split!r} left out: each of its {len(records)} images is in {', '.join(kept)} (a {to} "
                    f"dataset names only {', '.join(_SPLIT_NAMES)})")
    return kept


def write_dataset(splits: dict[str, list[ImageRecord]], class_names: list[str], out: Path, to: str, images: str,
                  category_ids: list[int] | None = None) -> ConvertSummary:
    """Write ``splits`` as a ``to`` dataset in the new folder ``out`` (staged, renamed into place when whole)."""
    if to not in WRITERS:
        raise DataError(f"--to {to!r}: not a format{did_you_mean(to, list(WRITERS))} (choose {', '.join(WRITERS)})")
    splits = _named_splits(splits, to)
    every = [r for records in splits.values() for r in records]
    if images != "none":
        missing_images(every)
    names = iter(unique_names(every, spaces=to != "voc"))
    named = {split: [(r, next(names)) for r in records] for split, records in splits.items()}
    ids = category_ids if category_ids and len(category_ids) == len(class_names) else range(1, len(class_names) + 1)
    with staged(out) as stage:
        pairs = WRITERS[to](stage, Target(list(class_names), list(ids)), named)
        place_images(pairs, images)
    flagged = sum(o.difficult or o.iscrowd for r in every for o in r.objects)
    if to == "labelstudio" and flagged:
        LOGGER.warning(f"{flagged} difficult or crowd object(s) written as plain boxes: Label Studio's rectangle "
                       "labels have no such flag")
    return ConvertSummary(out, to, {s: len(r) for s, r in splits.items()},
                          {s: sum(len(r.objects) for r in records) for s, records in splits.items()})


def convert_dataset(source: str | Path, out: str | Path, to: str, images: str = "link") -> ConvertSummary:
    """Read ``source`` (any layout ``--data`` takes) and write it as a ``to`` dataset (``voc``, ``coco``, ``yolo``,
    ``labelstudio``) in the new folder ``out``, splits kept; images hard-linked, copied or left out (``images``).

    Raises:
        DataError: a format not known, a dataset with errors, missing images (listed).
        OutputError: ``out`` not empty, or equal to, inside or above the source's folder (before any write).
    """
    spec = load_dataset(source)
    out = check_dataset_output(out, [source, spec.root])
    return write_dataset(usable_records(spec), spec.class_names, out, to, images, spec.category_ids)

"""``ssd data convert``: a dataset read by any reader, written in another format with its splits, every object kept
(see :mod:`ssd.data.commands.formats` for what each format carries)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ssd.data.commands.formats import ATTRIBUTES, HOLDS, WRITERS, Target
from ssd.data.commands.output import UniqueNames, check_dataset_output, image_placer, missing_images, staged
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord, ObjectRecord
from ssd.data.table import RecordTable
from ssd.errors import DataError
from ssd.log import LOGGER
from ssd.names import did_you_mean
from ssd.text import few

__all__ = ["ConvertSummary", "convert_dataset", "write_dataset", "usable_records"]

_SPLIT_NAMES = ("train", "val", "test")
"""The splits that COCO, YOLO and Label Studio datasets name (their readers know no others)."""


@dataclass
class ConvertSummary:
    """What a write produced: the folder, its format, images and objects per split, and per attribute the objects
    whose attribute the format cannot hold (written without it)."""

    out: Path
    format: str
    images: dict[str, int]
    objects: dict[str, int]
    dropped: dict[str, int] = field(default_factory=dict)

    def lost(self) -> str:
        """``yolo cannot hold: 2 difficult flags, 1 occluded flag`` ('' when nothing was lost)."""
        if not self.dropped:
            return ""
        counts = ", ".join(f"{n} {ATTRIBUTES[a]}{'s' if n > 1 else ''}" for a, n in self.dropped.items())
        return f"{self.format} cannot hold: {counts} (the objects are written without them)"

    def __str__(self) -> str:
        splits = ", ".join(f"{s}: {self.images[s]} images, {self.objects[s]} objects" for s in self.images)
        lost = self.lost()
        return f"wrote {self.out} ({self.format}; {splits})" + (f"; {lost}" if lost else "")


def usable_records(spec: DatasetSpec) -> dict[str, Iterable[ImageRecord]]:
    """Every split's records (as the reader holds them: nothing copied), refused (naming the problems) when a reader
    found errors or an object's class is not in the class list: a converted dataset holds exactly what the source
    does. A split that is an iterator (``load_dataset(lazy=True)``) is checked as it is written."""
    _refuse_errors(spec)
    for records in spec.splits.values():
        if isinstance(records, Sequence) and (found := _outside_classes(records, spec.num_classes)) is not None:
            _refuse_class(*found, spec.class_names)
    return dict(spec.splits)


def _refuse_errors(spec: DatasetSpec) -> None:
    errors = [i for i in spec.issues if i.severity == "error"]
    if errors:
        raise DataError(f"{spec.root}: {len(errors)} problem(s) in the dataset, fix them first (ssd check "
                        f"{spec.root} lists them all): {few([i.message for i in errors], 3)}")


def _refuse_class(record: ImageRecord, obj: ObjectRecord, class_names: list[str]) -> None:
    raise DataError(f"{obj.where or record.path}: class {obj.name!r} is not one of the dataset's "
                    f"{len(class_names)} classes{did_you_mean(obj.name, class_names)}")


def _outside_classes(records: Sequence[ImageRecord], num_classes: int) -> tuple[ImageRecord, ObjectRecord] | None:
    """The first object whose label is not a class (a table's label column read at once, no records made)."""
    if isinstance(records, RecordTable):
        bad = np.flatnonzero((records.labels < 0) | (records.labels >= num_classes))
        if not bad.size:
            return None
        image = int(np.searchsorted(records.first, bad[0], side="right")) - 1
        record = records[image]
        return record, record.objects[int(bad[0] - records.first[image])]
    return next(((r, o) for r in records for o in r.objects if not 0 <= o.label < num_classes), None)


def _image_paths(records: Sequence[ImageRecord]) -> Iterator[Path]:
    """Each record's image (a table's from its path column, no records made)."""
    if isinstance(records, RecordTable):
        return (records.path(i) for i in range(len(records)))
    return (r.path for r in records)


def _named_splits(splits: dict[str, Iterable[ImageRecord]], to: str) -> dict[str, Iterable[ImageRecord]]:
    """The splits a ``to`` dataset can name: any for VOC; else train, val and test, and a split beyond them (VOC's
    ``trainval``) only when each of its images is in one of them: it is left out, and said so."""
    if to == "voc":
        return splits
    kept = {s: r for s, r in splits.items() if s in _SPLIT_NAMES}
    if len(kept) == len(splits):
        return kept
    listed = {p for records in kept.values() for p in _image_paths(records)}
    for split, records in splits.items():
        if split in kept:
            continue
        outside = [str(p) for p in _image_paths(records) if p not in listed]
        if outside:
            raise DataError(f"split {split!r}: a {to} dataset names only the splits {', '.join(_SPLIT_NAMES)}, and "
                            f"{len(outside)} of its images are in none of them ({few(outside, 3)}): convert to "
                            "voc, or make it one of those splits")
        LOGGER.info(f"split {split!r} left out: each of its {len(records)} images is in {', '.join(kept)} (a {to} "
                    f"dataset names only {', '.join(_SPLIT_NAMES)})")
    return kept


def write_dataset(splits: dict[str, Iterable[ImageRecord]], class_names: list[str], out: Path, to: str,
                  images: str, category_ids: list[int] | None = None, source: DatasetSpec | None = None
                  ) -> ConvertSummary:
    """Write ``splits`` as a ``to`` dataset in the new folder ``out`` (staged, renamed into place when whole), each
    record written as it is read (a :class:`~ssd.data.table.RecordTable` is read in chunks): beyond the records
    the reader holds, memory grows only by the names taken (a few dozen bytes an image). What ``to`` cannot hold of
    the objects (see :data:`~ssd.data.commands.formats.HOLDS`) is counted in the summary and said on the logger.
    ``source``: the dataset read lazily, whose issues found while it was read refuse the output before it is put in
    place (the staging folder removed), as do objects whose class is not in ``class_names``."""
    if to not in WRITERS:
        raise DataError(f"--to {to!r}: not a format{did_you_mean(to, list(WRITERS))} (choose {', '.join(WRITERS)})")
    place = image_placer(images)
    splits = _named_splits(splits, to)
    if images != "none":
        missing_images(p for records in splits.values() if isinstance(records, Sequence)
                       for p in _image_paths(records))  # a lazy reader reports a missing image as an issue
    summary = ConvertSummary(out, to, dict.fromkeys(splits, 0), dict.fromkeys(splits, 0))
    lost = [a for a in ATTRIBUTES if a not in HOLDS[to]]
    dropped = dict.fromkeys(lost, 0)
    names = UniqueNames(spaces=to != "voc", repeats=len(splits) > 1)

    def named(split: str, records: Iterable[ImageRecord]) -> Iterator[tuple[ImageRecord, str]]:
        for record in records:
            if (bad := next((o for o in record.objects if not 0 <= o.label < len(class_names)), None)) is not None:
                _refuse_class(record, bad, class_names)
            summary.images[split] += 1
            summary.objects[split] += len(record.objects)
            for attribute in lost:
                dropped[attribute] += sum(bool(getattr(o, attribute)) for o in record.objects)
            yield record, names(record.path)

    ids = category_ids if category_ids and len(category_ids) == len(class_names) else range(1, len(class_names) + 1)
    with staged(out) as stage:
        WRITERS[to](stage, Target(list(class_names), list(ids)), {s: named(s, r) for s, r in splits.items()}, place)
        if source is not None:
            _refuse_errors(source)
    summary.dropped = {a: n for a, n in dropped.items() if n}
    if summary.dropped:
        LOGGER.warning(summary.lost())
    return summary


def convert_dataset(source: str | Path, out: str | Path, to: str, images: str = "link") -> ConvertSummary:
    """Read ``source`` (any layout ``--data`` takes) and write it as a ``to`` dataset (``voc``, ``coco``, ``yolo``,
    ``labelstudio``) in the new folder ``out``, splits kept; images hard-linked, copied or left out (``images``).

    Raises:
        DataError: a format not known, a dataset with errors, missing images (listed).
        OutputError: ``out`` not empty, or equal to, inside or above the source's folder (before any write).
    """
    spec = load_dataset(source, lazy=True)
    out = check_dataset_output(out, [source, spec.root])
    return write_dataset(usable_records(spec), spec.class_names, out, to, images, spec.category_ids, spec)

"""The one dataset gate of ``ssd train`` and ``ssd val``: :func:`load_training_data` reads a dataset and applies the
``ssd check`` rules to it, refusing what the check reports as errors or, when asked, skipping it (reported)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ssd.data.check import screen, used_splits
from ssd.data.index import index_dataset, release_freed_heap
from ssd.data.records import DatasetSpec
from ssd.errors import DataError
from ssd.log import LOGGER

__all__ = ["load_training_data"]


def load_training_data(data: str | Path | None, *, skip_invalid: bool = False, class_names: list[str] | None = None,
                       splits: Sequence[str] = ("train", "val"), recheck: bool = False) -> DatasetSpec:
    """The dataset gate of training and evaluation: :func:`load_dataset`, then the ``ssd check`` rules.

    It refuses exactly what :func:`ssd.data.check.check_dataset` (same data and class names) reports as errors in
    the splits it reads, with the same messages; images are decoded to find truncated or corrupt files. The
    reading and the check are kept in the dataset index (:mod:`ssd.data.index`): on an unchanged dataset nothing
    is read or decoded again, and after a change only the changed files are.

    Args:
        data: a data.yaml, dataset folder or COCO JSON.
        skip_invalid: drop the invalid objects and images instead of refusing them (logged on the ``ssd`` logger,
            with a summary of the warnings: how many, which). Errors
            no dropping can mend (an empty split, a class without training objects, duplicate class names) are
            refused all the same.
        class_names: the model's class names (evaluation), see :func:`load_dataset`.
        splits: the splits the caller reads; the first must exist, the others are read where present.
        recheck: read and decode every file again instead of trusting the index (which is then rebuilt).

    Returns the spec with the invalid objects/images removed from the splits read (the input files are untouched),
    its splits as :class:`~ssd.data.table.RecordTable` arrays.
    """
    if data is None:
        raise DataError("no dataset given: set data (--data DATA: a data.yaml, dataset folder or COCO JSON)")
    indexed = index_dataset(data, class_names=class_names, splits=splits, recheck=recheck)
    spec = indexed.spec
    clean, report = screen(spec, used_splits(spec, splits), skip_invalid=skip_invalid,
                           issues=indexed.issues)
    dropped = report.dropped
    if dropped:
        LOGGER.info(f"skip_invalid: dropped {dropped['objects']} object(s) and {dropped['images']} image(s): "
                    f"{', '.join(dropped['object_locations'][:5] + dropped['image_paths'][:5])}")
    for issue in report.warnings:
        if issue.image is None:  # dataset- and split-wide warnings in full, per-file ones counted below
            LOGGER.info(f"warning: {issue.message}")
    per_file = [i for i in report.warnings if i.image is not None]
    if per_file:
        LOGGER.info(f"{len(per_file)} warning(s) about files of {data} (`ssd check {data}` lists them)")
    release_freed_heap()
    return clean

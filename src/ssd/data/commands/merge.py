"""``ssd data merge``: datasets merged into one, classes matched by name after ``--map old=new``; class lists that
still differ are refused unless ``--union`` is given, and a report says what went where."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ssd.data.commands.convert import usable_records, write_dataset
from ssd.data.commands.formats import WRITERS
from ssd.data.commands.output import check_dataset_output
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord
from ssd.errors import DataError
from ssd.names import did_you_mean

__all__ = ["merge_datasets", "parse_map", "MergeSummary"]


def parse_map(entries: list[str], known: list[str]) -> dict[str, str]:
    """``["old=new", ...]`` as a dict; every ``old`` must be a class of some dataset."""
    mapping: dict[str, str] = {}
    for entry in entries:
        old, sep, new = entry.partition("=")
        if not sep or not old.strip() or not new.strip():
            raise DataError(f"--map {entry!r}: write old=new (a class name of a dataset, then its new name)")
        old, new = old.strip(), new.strip()
        if old not in known:
            raise DataError(f"--map {entry!r}: no dataset has a class {old!r}{did_you_mean(old, known)}")
        if mapping.setdefault(old, new) != new:
            raise DataError(f"--map renames {old!r} twice: to {mapping[old]!r} and to {new!r}")
    return mapping


@dataclass
class MergeSummary:
    """What went where: per source, its images per split and its classes' new names with their object counts."""

    out: Path
    class_names: list[str]
    lines: list[str]

    def __str__(self) -> str:
        return "\n".join([*self.lines, f"classes ({len(self.class_names)}): {', '.join(self.class_names)}",
                          f"written: {self.out}"])


def _check_classes(specs: list[DatasetSpec], names: list[list[str]], sources: list, union: bool) -> None:
    first = set(names[0])
    for source, mapped in zip(sources[1:], names[1:]):
        only_first, only_this = sorted(first - set(mapped)), sorted(set(mapped) - first)
        if (only_first or only_this) and not union:
            hints = "; ".join(f"{n!r}{did_you_mean(n, only_first)}" for n in only_this)
            raise DataError(f"the class lists differ: only {sources[0]} has {only_first or 'none'}, only {source} "
                            f"has {only_this or 'none'}{' (' + hints + ')' if hints else ''}: rename with --map "
                            "old=new, or give --union to keep every class")


def merge_datasets(sources: list[str | Path], out: str | Path, map: list[str] = (), union: bool = False,
                   to: str | None = None, images: str = "link") -> MergeSummary:
    """Merge ``sources`` (any layouts) into the new dataset folder ``out`` in format ``to`` (default: the first
    source's): splits by name, classes by name after ``map`` (``old=new`` entries; two old names may become one).

    Raises:
        DataError: a bad ``map`` entry, class lists that still differ (without ``union``), a dataset with errors.
        OutputError: ``out`` not empty, or equal to, inside or above one of the sources.
    """
    specs = [load_dataset(s) for s in sources]
    out = check_dataset_output(out, [*sources, *(s.root for s in specs)])
    mapping = parse_map(list(map), sorted({n for s in specs for n in s.class_names}))
    names = [[mapping.get(n, n) for n in s.class_names] for s in specs]
    _check_classes(specs, names, list(sources), union)
    merged = list(dict.fromkeys(n for mapped in names for n in mapped))
    label = {n: i for i, n in enumerate(merged)}
    splits: dict[str, list[ImageRecord]] = {}
    lines = []
    for source, spec, mapped in zip(sources, specs, names):
        moved: Counter = Counter()
        for split, records in usable_records(spec).items():
            for r in records:
                objects = [dataclasses.replace(o, label=label[mapped[o.label]], name=mapped[o.label])
                           for o in r.objects]
                moved.update((spec.class_names[o.label], mapped[o.label]) for o in r.objects)
                splits.setdefault(split, []).append(dataclasses.replace(r, objects=objects))
            lines.append(f"{source} ({spec.format}) {split}: {len(records)} images -> {split}")
        lines += [f"  {old} -> {new}: {n} objects" if old != new else f"  {old}: {n} objects"
                  for (old, new), n in sorted(moved.items())]
    to = to or (specs[0].format if specs[0].format in WRITERS else "yolo")
    write_dataset(splits, merged, out, to, images)
    return MergeSummary(out, merged, lines)

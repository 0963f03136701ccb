"""The dataset index patched after a few edited files, instead of rebuilt: the start after one changed annotation
costs about a warm start plus that file.

When the dataset's file list is the stored one and only the states of a few files changed, and each of those is the
annotation file or the image of one record of a VOC, YOLO or LabelMe dataset (one record per file: the one-file
formats, COCO, CVAT and Label Studio, are rebuilt), that record alone is read again
(:func:`~ssd.data.voc.read_voc_record`, :func:`~ssd.data.yolo.read_yolo_record`,
:func:`~ssd.data.labelme.read_labelme_record`; an unchanged image's size taken from the table) and spliced into its
split's table (:func:`~ssd.data.table_splice.splice_record`); its reader issues, per-image rule results and decode
result replace its old ones where they stood in reading order; the dataset-wide rules run on the tables
(:func:`~ssd.data.rules.dataset_issues`: the train/val overlap kept when no image changed; LabelMe's summary of
polygons made again from the tables). The stored per-file results stay in their file
(:func:`~ssd.data.index_file.memo_path`), unread; the new ones go to a group of the index of their own
(``memo_patch``), which replaces them where both answer, until a rebuild.

Anything else is left to the rebuild, which gives the same index: files added or removed, a class list that would
change (a new name, or the last object of a class gone), a record that became unreadable, an issue whose place in
reading order is not known (a file that had none and now has some reader issue), an image listed twice, or a check
stored without its parts or by other rules (another version of ssd).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ssd.data.check import decode_issues, invalid, record_issues, rules_version
from ssd.data.index_file import INDEX_ERRORS, StoredIndex, issue_rows, issues_from, read_group
from ssd.data.labelme import read_labelme_record
from ssd.data.memo import FileMemo
from ssd.data.records import DatasetSpec, ImageRecord, Issue, relative_path
from ssd.data.rules import dataset_issues
from ssd.data.shapes import POLYGON_RAW, polygon_issues
from ssd.data.table import RecordTable, Strings
from ssd.data.table_splice import splice_record
from ssd.data.voc import assign_labels, read_voc_record
from ssd.data.yolo import read_description, read_yolo_record
from ssd.errors import DataError

__all__ = ["Patch", "patch_index", "PATCH_MAX_FILES"]

PATCH_MAX_FILES = 64
"""Changed files a patch reads at most; more are read by the rebuild (each through its stored results)."""
PATCHED_SHARE, PATCHED_MIN = 4, 1_000
"""Per-file results the patches keep, at most one per ``PATCHED_SHARE`` files of the dataset plus ``PATCHED_MIN``
(then a rebuild merges them with the others, and drops those no file uses)."""


@dataclass
class Patch:
    """The patched index: ``spec`` (splits as tables), ``checks`` and ``parts`` (by key, as the index stores them),
    ``memo`` (the arrays of the per-file results the patches made so far: the stored ones stay in their file),
    ``reads`` (the files read) and ``appended`` (how many results the patches made since the last rebuild)."""

    spec: DatasetSpec
    checks: dict[str, list]
    parts: dict[str, list[int]]
    memo: dict[str, np.ndarray]
    reads: list[tuple[str, str]]
    appended: int


class _Rebuild(Exception):
    """This change is left to the rebuild."""


def patch_index(stored: StoredIndex, spec: DatasetSpec, paths: list[str], states: np.ndarray, start_ns: int
                ) -> Patch | None:
    """The index ``stored`` (``spec``: its dataset) patched for the files whose states changed (``paths`` and
    ``states [F, 4]``: the dataset's files now, the stored list); None when the change is left to the rebuild."""
    changed = np.flatnonzero((states != stored.arrays["files.state"]).any(axis=1))
    appended = stored.meta.get("appended", 0)
    if (spec.format not in _READERS or not 0 < len(changed) <= PATCH_MAX_FILES
            or appended > len(paths) // PATCHED_SHARE + PATCHED_MIN
            or set(stored.meta["checks"]) - set(stored.meta.get("parts", {}))
            or stored.meta.get("rules") != rules_version()):  # another ssd's rules made the stored results
        return None
    try:
        return _patch(stored, spec, {paths[i]: states[i].tolist() for i in changed}, start_ns, appended)
    except (_Rebuild, DataError):  # DataError: the stored message columns were damaged (said, and the file removed)
        return None


def _patch(stored: StoredIndex, spec: DatasetSpec, changed: dict[str, list[int]], start_ns: int, appended: int
           ) -> Patch:
    found = _records_of(spec, set(changed))
    files = {p for split, row in found for p in _files(spec.splits[split], row)}
    memo = FileMemo(None, start_ns, [(p, changed.get(p) or _old_state(stored, p)) for p in files])
    splits, issues, new = dict(spec.splits), list(spec.issues), {}
    counts = _class_counts(spec)
    with memo.active():
        for (split, row), image_changed in found.items():
            table = splits[split]
            size = None if image_changed else tuple(table.sizes[row].tolist())
            record, read = _READERS[spec.format](spec, table, row, split, size)
            counts += _label_counts(record, spec.num_classes) - _label_counts(table[row], spec.num_classes)
            own = [i for i in issues if i.image == record.path and i.split == split]
            issues = _replace(issues, lambda i, p=record.path, s=split: i.image == p and i.split == s, read, None)
            splits[split] = splice_record(table, row, record)
            one = DatasetSpec(spec.root, spec.format, spec.class_names, {split: [record]}, read)
            # an edit that leaves the record and its reader's issues as they were (the rules read both): none again
            same = not image_changed and own == read and splits[split][row] == table[row]
            new[(split, row)] = (record, None if same else record_issues(one, [split]),
                                 decode_issues(one, [split]) if image_changed else None)
        if ((counts == 0) & (_class_counts(spec) > 0)).any():  # a class gone: the names of VOC / LabelMe change
            raise _Rebuild
        patched = DatasetSpec(spec.root, spec.format, spec.class_names, splits, issues, spec.category_ids,
                              spec.sources, spec.watched)
        if spec.format == "labelme":
            patched.issues = _polygons(patched)
        checks, parts = {}, {}
        for key, rows in stored.meta["checks"].items():
            checks[key], parts[key] = _check(patched, key.split(",") if key else [], issues_from(rows),
                                             stored.meta["parts"][key], new)
    try:
        memo_patch = _patch_memo(stored, memo.used)
    except INDEX_ERRORS:
        raise _Rebuild from None
    return Patch(patched, checks, parts, {"memo_patch": np.frombuffer(memo_patch, np.uint8)}, memo.reads,
                 appended + len(memo.used))


def _records_of(spec: DatasetSpec, changed: set[str]) -> dict[tuple[str, int], bool]:
    """``{(split, row): whether its image changed}`` of the records whose files changed; each changed file must be
    the image or the annotation of exactly one record, and that image in one split only."""
    owners: dict[str, list] = {}
    for split, table in spec.splits.items():
        for kind, column in (("image", table.paths), ("annotation", table.annotations)):
            for text, rows in _rows_of(column, changed).items():
                owners.setdefault(text, []).extend((split, row, kind) for row in rows)
    if owners.keys() != changed or any(len(o) > 1 for o in owners.values()):
        raise _Rebuild
    found: dict[tuple[str, int], bool] = {}
    for [(split, row, kind)] in owners.values():
        found[(split, row)] = found.get((split, row), False) or kind == "image"
    images = {spec.splits[split].paths[row] for split, row in found}
    if sum(len(rows) for table in spec.splits.values() for rows in _rows_of(table.paths, images).values()) > len(
            images):
        raise _Rebuild  # an image in two splits (VOC trainval): its issues are said once, for the first
    return found


def _rows_of(column: Strings, texts: set[str]) -> dict[str, list[int]]:
    """The rows of ``column`` that hold each of ``texts`` (found in its bytes: no text of the column decoded)."""
    blob, found = column.blob.tobytes(), {}
    for text in texts:
        if not text.startswith(column.prefix):
            continue
        needle = text[len(column.prefix):].encode("utf-8", "surrogatepass")
        at = blob.find(needle)
        while at >= 0:
            row = int(np.searchsorted(column.offsets, at, side="right")) - 1
            if row < len(column) and column.offsets[row] == at and column.offsets[row + 1] == at + len(needle):
                found.setdefault(text, []).append(row)
            at = blob.find(needle, at + 1) if at < len(blob) else -1
    return found


def _files(table: RecordTable, row: int) -> list[str]:
    return [p for p in (table.paths[row], table.annotations[row]) if p]


def _old_state(stored: StoredIndex, path: str) -> list[int]:
    """The stored state of ``path``, one of the index's files (unchanged: the file list is the stored one)."""
    files = stored.files
    low, high = 0, len(files)  # the list is sorted: a binary search, no list of every path made
    while low < high:
        middle = (low + high) // 2
        if files[middle] < path:
            low = middle + 1
        else:
            high = middle
    if low == len(files) or files[low] != path:
        raise _Rebuild
    return stored.arrays["files.state"][low].tolist()


def _patch_memo(stored: StoredIndex, made: dict[str, bytes]) -> bytes:
    """The per-file results of the patches so far with ``made`` added (the JSON text :meth:`FileMemo.used_json`
    writes)."""
    kept = FileMemo()
    if "memo_patch" in stored.digests:
        entries = json.loads(read_group(stored.path, "memo_patch", stored.digests)["memo_patch"].tobytes())
        if not isinstance(entries, dict):  # not what a patch stores: the index is rebuilt
            raise _Rebuild
        kept.used = entries
    kept.used |= made
    return kept.used_json()


def _class_counts(spec: DatasetSpec) -> np.ndarray:
    k = spec.num_classes
    return sum((np.bincount(t.labels[(t.labels >= 0) & (t.labels < k)], minlength=k) for t in spec.splits.values()),
               np.zeros(k, np.int64))


def _label_counts(record: ImageRecord, k: int) -> np.ndarray:
    return np.bincount([o.label for o in record.objects if 0 <= o.label < k], minlength=k).astype(np.int64)


def _voc(spec: DatasetSpec, table: RecordTable, row: int, split: str, size: tuple[int, int] | None
         ) -> tuple[ImageRecord, list[Issue]]:
    old = table[row]
    xml = old.annotation
    if xml is None or not (xml.parent == spec.root or xml.parent.parent == spec.root
                           or xml.parent.name == "Annotations"):
        raise _Rebuild  # split folders deeper down are read relative to their own parent
    if old.objects and not old.objects[0].where.startswith(f"{relative_path(xml, spec.root)} object "):
        raise _Rebuild
    issues: list[Issue] = []
    record = read_voc_record(old.image_id, old.path, xml, spec.root, split, issues, size)
    if record is None or any(o.name not in spec.class_names for o in record.objects):
        raise _Rebuild  # unreadable now, or a new name (a class list read from the annotations changes)
    assign_labels([record], spec.class_names)
    return record, issues


def _yolo(spec: DatasetSpec, table: RecordTable, row: int, split: str, size: tuple[int, int] | None
          ) -> tuple[ImageRecord, list[Issue]]:
    old = table[row]
    declared = next(iter(spec.sources.values()), None)  # a data.yaml; else the folder's classes.txt
    if old.annotation is None or old.annotation.suffix != ".txt" or (
            read_description(declared).get("flags") if declared else not (spec.root / "classes.txt").is_file()):
        raise _Rebuild  # XML beside the images, a flags file naming lines, or names from the labels
    issues: list[Issue] = []
    record = read_yolo_record(old.path, split, spec.root, spec.class_names, issues, size)
    if record is None or record.annotation != old.annotation:
        raise _Rebuild
    return record, issues


def _labelme(spec: DatasetSpec, table: RecordTable, row: int, split: str, size: tuple[int, int] | None
             ) -> tuple[ImageRecord, list[Issue]]:
    old = table[row]
    rel = relative_path(old.annotation, spec.root)
    if (old.objects and not old.objects[0].where.startswith(f"{rel} shape ")) or any(
            i.code == "duplicate_image" and i.image == old.path for i in spec.issues):
        raise _Rebuild  # read from another root; or its image annotated twice (said for the other file)
    issues: list[Issue] = []
    record = read_labelme_record(old.annotation, spec.root, split, issues, None, size)
    if record is None or record.path != old.path or any(o.name not in spec.class_names for o in record.objects):
        raise _Rebuild
    assign_labels([record], spec.class_names)
    return record, issues


def _polygons(spec: DatasetSpec) -> list[Issue]:
    """The issues of ``spec`` (its splits patched) with the LabelMe summary of polygons read as boxes made again."""
    converted = [where for table in spec.splits.values() for where, raw in zip(table.where.tolist(), table.raw.tolist())
                 if raw.startswith(POLYGON_RAW)]
    return [i for i in spec.issues if i.code != "polygon_as_box"] + polygon_issues(converted, spec.format)


_READERS: dict[str, Callable[..., tuple[ImageRecord, list[Issue]]]] = {
    "voc": _voc, "yolo": _yolo, "labelme": _labelme}


def _replace(issues: list[Issue], own: Callable[[Issue], bool], new: list[Issue],
             order: Callable[[Issue], tuple] | None) -> list[Issue]:
    """``issues`` with those ``own`` picks (one run of them) replaced by ``new``; where there were none, ``new`` goes
    before the first issue that ``order`` places after them (the rebuild's job without ``order``)."""
    at = [j for j, issue in enumerate(issues) if own(issue)]
    if at:
        if at[-1] - at[0] + 1 != len(at):
            raise _Rebuild
        return issues[:at[0]] + new + issues[at[-1] + 1:]
    if not new:
        return issues
    if order is None:
        raise _Rebuild
    mine = order(new[0])
    place = next((j for j, issue in enumerate(issues) if order(issue) > mine), len(issues))
    return issues[:place] + new + issues[place:]


def _check(spec: DatasetSpec, splits: list[str], issues: list[Issue], sizes: list[int],
           new: dict[tuple[str, int], tuple[ImageRecord, list[Issue] | None, list[Issue] | None]]
           ) -> tuple[list, list[int]]:
    """The stored check of ``splits`` (``issues`` in its parts of ``sizes``: see :func:`~ssd.data.check.check_parts`)
    with the records of ``new`` read again (``(record, its per-image issues, its decode issues)``, None for those
    that stand: the same record, the same image); ``(rows, sizes)`` as the index stores them."""
    read = [i for i in spec.issues if i.split is None or i.split in splits]
    per_image = issues[sizes[0]:sizes[0] + sizes[1]]
    decoded = issues[sizes[0] + sizes[1]:sum(sizes)]
    order = _reading_order(spec, splits)
    for (split, _), (record, checked, decode) in new.items():
        if split in splits and checked is not None:
            per_image = _replace(per_image, lambda i, p=record.path: i.image == p, checked, order)
        if split in splits and decode is not None:
            decoded = _replace(decoded, lambda i, p=record.path: i.image == p, decode, order)
    overlap = None if any(decode is not None for *_, decode in new.values()) else [
        i for i in issues[sum(sizes):] if i.code == "train_val_overlap"]  # the images' bytes alone decide it
    rules = dataset_issues(spec, splits, *invalid(read + per_image + decoded), overlap=overlap)
    return issue_rows(read + per_image + decoded + rules), [len(read), len(per_image), len(decoded)]


def _reading_order(spec: DatasetSpec, splits: list[str]) -> Callable[[Issue], tuple]:
    """An image's place in the order the check reads ``splits`` (made on first use: a dict of every path)."""
    places: dict[str, tuple[int, int]] = {}

    def order(issue: Issue) -> tuple[int, int]:
        if not places:
            for s, split in enumerate(splits):
                for row, path in enumerate(spec.splits[split].paths.tolist()):
                    places.setdefault(path, (s, row))
        if str(issue.image) not in places:
            raise _Rebuild
        return places[str(issue.image)]
    return order

"""``RecordTable``: a split's records as a few numpy arrays (the dataset index's form of a split).

A list of :class:`~ssd.data.records.ImageRecord` costs kilobytes of Python objects per image, and every DataLoader
worker that touches them copies them (copy-on-write pages, pytorch#13246). A table holds the same fields in packed
arrays, which forked workers share as they are: text as one UTF-8 blob with offsets (paths after their common
prefix), boxes ``[M, 4]`` float32, labels, flags and source lines ``[M]``, and the image -> objects offsets
``first [N + 1]``. It is a ``Sequence[ImageRecord]``: ``table[i]`` builds image ``i``'s rich record (for messages
and reports); training reads the arrays (:meth:`objects`). Boxes are stored as the float32 values training uses.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from ssd.data.records import ImageRecord, ObjectRecord

__all__ = ["RecordTable", "Strings", "select", "object_arrays", "DIFFICULT", "CROWD", "OCCLUDED", "TRUNCATED",
           "IGNORE"]

DIFFICULT, CROWD, OCCLUDED, TRUNCATED = 1, 2, 4, 8
"""Bits of :attr:`RecordTable.flags`."""
IGNORE = DIFFICULT | CROWD
"""The bits of objects that training leaves out and evaluation ignores (:attr:`ObjectRecord.ignore`)."""
_CHUNK = 1024
"""Images whose records iterating a table builds at once (their columns decoded together)."""
_ENCODING = ("utf-8", "surrogatepass")  # any str round-trips, lone surrogates included


class Strings:
    """Texts packed as one ``uint8`` blob and ``offsets [N + 1]``, after a common ``prefix`` (stored once)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, prefix: str = "") -> None:
        self.blob, self.offsets, self.prefix = blob, offsets, prefix

    @classmethod
    def pack(cls, texts: Sequence[str], share_prefix: bool = False) -> Strings:
        prefix = _shared_start(min(texts), max(texts)) if share_prefix and texts else ""
        if prefix:
            texts = [t[len(prefix):] for t in texts]
        joined = "".join(texts)
        if joined.isascii():  # one byte per character: encoded at once
            blob, lengths = joined.encode(), np.fromiter(map(len, texts), np.int64, len(texts))
        else:
            encoded = [t.encode(*_ENCODING) for t in texts]
            blob, lengths = b"".join(encoded), np.fromiter(map(len, encoded), np.int64, len(encoded))
        offsets = np.zeros(len(texts) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(np.frombuffer(blob, np.uint8), offsets, prefix)

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> str:
        return self.prefix + self.blob[self.offsets[i]:self.offsets[i + 1]].tobytes().decode(*_ENCODING)

    def tolist(self, start: int = 0, stop: int | None = None) -> list[str]:
        """The texts ``start:stop``, decoded at once."""
        offsets = self.offsets[start:(len(self) if stop is None else stop) + 1]
        data = self.blob[offsets[0]:offsets[-1]].tobytes()
        return [self.prefix + data[a:b].decode(*_ENCODING) for a, b in itertools.pairwise((offsets - offsets[0])
                                                                                            .tolist())]

    def take(self, index: np.ndarray) -> Strings:
        """The texts at ``index`` (int array), in that order."""
        lo, hi = self.offsets[index], self.offsets[index + 1]
        offsets = np.zeros(len(index) + 1, np.int64)
        np.cumsum(hi - lo, out=offsets[1:])
        return Strings(self.blob[_ranges(lo, hi)], offsets, self.prefix)

    def arrays(self, name: str) -> dict[str, np.ndarray]:
        prefix = np.frombuffer(self.prefix.encode(*_ENCODING), np.uint8)
        return {f"{name}.blob": self.blob, f"{name}.offsets": self.offsets, f"{name}.prefix": prefix}

    @classmethod
    def from_arrays(cls, arrays, name: str) -> Strings:
        prefix = arrays[f"{name}.prefix"].tobytes().decode(*_ENCODING)
        return cls(arrays[f"{name}.blob"], arrays[f"{name}.offsets"], prefix)


def _shared_start(first: str, last: str) -> str:
    """The text every string between ``first`` and ``last`` (in sort order) starts with."""
    n = next((i for i, (a, b) in enumerate(zip(first, last)) if a != b), min(len(first), len(last)))
    return first[:n]


def _ranges(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """The concatenated ``arange(lo[i], hi[i])`` for every i, without a Python loop."""
    lengths = hi - lo
    total = int(lengths.sum())
    starts = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return starts + np.arange(total)


_TEXT = ("paths", "annotations", "image_ids")
_ARRAYS = ("sizes", "id_is_int", "first", "boxes", "labels", "flags")
_DETAIL = {"names": Strings, "sources": Strings, "where": Strings, "raw": Strings,
           "lines": np.ndarray, "z_order": np.ndarray}
"""The columns only messages and reports read: kept on disk until one asks (see :class:`Detail`)."""


def _rows(column, index: np.ndarray):
    return column.take(index) if isinstance(column, Strings) else column[index]


class _DetailReader:
    """``load()``'s arrays as the detail columns of the table of ``prefix`` (a class, not a closure: a DataLoader
    worker started by ``spawn`` receives the table pickled)."""

    def __init__(self, load: Callable[[], Mapping], prefix: str) -> None:
        self.load, self.prefix = load, prefix

    def __call__(self) -> dict:
        source = self.load()
        return {name: Strings.from_arrays(source, self.prefix + name) if kind is Strings else source[self.prefix + name]
                for name, kind in _DETAIL.items()}


class Detail:
    """The detail columns of a table (:data:`_DETAIL`): held, or read on first use by ``load()`` (a mapping of the
    whole split's columns) at ``objects`` rows (None: all), so training processes never hold them."""

    def __init__(self, columns: dict | None = None, load: Callable[[], dict] | None = None,
                 objects: np.ndarray | None = None) -> None:
        self._columns, self._load, self._objects = columns, load, objects

    def columns(self) -> dict:
        if self._columns is None:
            source = self._load()
            self._columns = {name: source[name] if self._objects is None else _rows(source[name], self._objects)
                             for name in _DETAIL}
        return self._columns

    def take(self, objects: np.ndarray) -> Detail:
        """The detail of the object rows ``objects`` (read, or still to read)."""
        if self._columns is not None:
            return Detail({name: _rows(c, objects) for name, c in self._columns.items()})
        return Detail(load=self._load, objects=objects if self._objects is None else self._objects[objects])


class RecordTable(Sequence[ImageRecord]):
    """The records of one split in arrays (see the module docstring).

    Attributes (N images, M objects):
        paths, annotations, image_ids: :class:`Strings` ``[N]`` (no annotation: ``""``; ``id_is_int [N]`` bool says
            which ids were integers).
        sizes: int64 ``[N, 2]`` ``(width, height)`` of the decoded image, ``-1`` when unknown.
        first: int64 ``[N + 1]``: image ``i``'s objects are rows ``first[i]:first[i + 1]``.
        boxes: float32 ``[M, 4]`` pixel xyxy (float64 in a reader's table: as
            written); labels: int64 ``[M]``; flags: uint8 ``[M]`` (bit 1 difficult, 2 crowd,
            4 occluded);
        lines, z_order: int64 ``[M]``; names, sources, where, raw: :class:`Strings` ``[M]`` (no source: ``""``).
        The last six are the :class:`Detail`: a table read from an index reads them from its file on first use.
    """

    def __init__(self, detail: Detail, **columns) -> None:
        self.detail = detail
        for name in (*_TEXT, *_ARRAYS):
            setattr(self, name, columns[name])

    def __getattr__(self, name: str):
        if name in _DETAIL:
            return self.detail.columns()[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @classmethod
    def from_records(cls, records: Iterable[ImageRecord]) -> RecordTable:
        """The table of ``records``; a table (a reader's, whose boxes are float64 as written) with float32 boxes."""
        if isinstance(records, RecordTable):
            return records if records.boxes.dtype == np.float32 else records._with(boxes=records.boxes.astype(
                np.float32))
        records = list(records)
        objects = [o for r in records for o in r.objects]
        first = np.zeros(len(records) + 1, np.int64)
        np.cumsum([len(r.objects) for r in records], out=first[1:])
        sizes = np.array([[-1 if r.width is None else r.width, -1 if r.height is None else r.height]
                          for r in records], np.int64).reshape(-1, 2)
        bound = 2**63 - 1  # a COCO annotation id may be any JSON integer
        lines = np.array([min(max(o.line or 0, -bound), bound) for o in objects], np.int64)
        detail = Detail({
            "lines": lines, "names": Strings.pack([o.name for o in objects]),
            "sources": Strings.pack(["" if o.source is None else str(o.source) for o in objects], True),
            "where": Strings.pack([o.where for o in objects], True), "raw": Strings.pack([o.raw for o in objects]),
            "z_order": np.array([o.z_order for o in objects], np.int64)})
        return cls(
            detail, paths=Strings.pack([str(r.path) for r in records], share_prefix=True),
            annotations=Strings.pack(["" if r.annotation is None else str(r.annotation) for r in records], True),
            image_ids=Strings.pack([str(r.image_id) for r in records]),
            id_is_int=np.array([isinstance(r.image_id, int) for r in records], bool),
            sizes=sizes, first=first,
            boxes=np.array([o.box for o in objects], np.float32).reshape(-1, 4),
            labels=np.array([o.label for o in objects], np.int64),
            flags=np.array([DIFFICULT * o.difficult + CROWD * o.iscrowd + OCCLUDED * o.occluded
                            + TRUNCATED * o.truncated for o in objects], np.uint8))

    def __len__(self) -> int:
        return len(self.first) - 1

    def __eq__(self, other) -> bool:
        """Equal to any sequence of equal records (a reader's list, another table)."""
        return isinstance(other, Sequence) and len(self) == len(other) and all(a == b for a, b in zip(self, other))

    __hash__ = None  # compared by content

    @property
    def num_objects(self) -> int:
        return int(self.first[-1])

    def path(self, i: int) -> Path:
        return Path(self.paths[i])

    def image_id(self, i: int) -> str | int:
        text = self.image_ids[i]
        return int(text) if self.id_is_int[i] else text

    def input_files(self) -> list[Path]:
        """The images and annotation files of the split (as :meth:`DatasetSpec.input_files` lists them)."""
        files = []
        for i in range(len(self)):
            files.append(self.path(i))
            if annotation := self.annotations[i]:
                files.append(Path(annotation))
        return files

    def objects(self, i: int) -> slice:
        """The rows of image ``i``'s objects in the object arrays."""
        return slice(int(self.first[i]), int(self.first[i + 1]))

    def __getitem__(self, i):
        if isinstance(i, slice):
            return self.take(np.arange(len(self))[i])
        i = range(len(self))[i]  # negative indices, and IndexError past the end
        return self._records(i, i + 1)[0]

    def __iter__(self) -> Iterator[ImageRecord]:
        for start in range(0, len(self), _CHUNK):
            yield from self._records(start, min(start + _CHUNK, len(self)))

    def _records(self, start: int, stop: int) -> list[ImageRecord]:
        """The rich records of images ``start:stop``, their columns read at once."""
        lo, hi = int(self.first[start]), int(self.first[stop])
        boxes, labels = self.boxes[lo:hi].tolist(), self.labels[lo:hi].tolist()
        flags, lines, z_order = self.flags[lo:hi].tolist(), self.lines[lo:hi].tolist(), self.z_order[lo:hi].tolist()
        names, sources, where, raw = (getattr(self, n).tolist(lo, hi) for n in ("names", "sources", "where", "raw"))
        source = {text: Path(text) for text in set(sources) if text}  # one Path per annotation file
        first = (self.first[start:stop + 1] - lo).tolist()
        records = []
        for k, (path, annotation, image_id, is_int, size) in enumerate(zip(
                self.paths.tolist(start, stop), self.annotations.tolist(start, stop),
                self.image_ids.tolist(start, stop), self.id_is_int[start:stop].tolist(),
                self.sizes[start:stop].tolist())):
            objects = [ObjectRecord(tuple(boxes[j]), labels[j], names[j], bool(flags[j] & DIFFICULT),
                                    bool(flags[j] & CROWD), lines[j], source.get(sources[j]), where[j], raw[j],
                                    bool(flags[j] & OCCLUDED), z_order[j], bool(flags[j] & TRUNCATED))
                       for j in range(first[k], first[k + 1])]
            width, height = (v if v >= 0 else None for v in size)
            records.append(ImageRecord(Path(path), Path(annotation) if annotation else None, objects, width, height,
                                       int(image_id) if is_int else image_id))
        return records

    def take(self, index: Sequence[int] | np.ndarray, keep_objects: np.ndarray | None = None) -> RecordTable:
        """The images at ``index`` (in that order) with their objects; ``keep_objects``: a bool mask ``[M]`` of the
        objects to keep (default: all)."""
        index = np.asarray(index, np.int64).reshape(-1)
        lengths = self.first[index + 1] - self.first[index]
        rows = _ranges(self.first[index], self.first[index + 1])
        counts = lengths
        if keep_objects is not None:
            kept = keep_objects[rows]
            counts = np.bincount(np.repeat(np.arange(len(index)), lengths)[kept], minlength=len(index))
            rows = rows[kept]
        first = np.zeros(len(index) + 1, np.int64)
        np.cumsum(counts, out=first[1:])
        return RecordTable(self.detail.take(rows), paths=self.paths.take(index),
                           annotations=self.annotations.take(index), image_ids=self.image_ids.take(index),
                           sizes=self.sizes[index],
                           id_is_int=self.id_is_int[index], first=first, boxes=self.boxes[rows],
                           labels=self.labels[rows], flags=self.flags[rows])

    def _with(self, **columns) -> RecordTable:
        """This table with ``columns`` replaced."""
        return RecordTable(self.detail, **{name: getattr(self, name) for name in (*_TEXT, *_ARRAYS)} | columns)

    def without(self, images: set[Path], objects: set[tuple[Path, int]]) -> tuple[RecordTable, list[str]]:
        """The table without ``images`` and ``objects`` (``(image path, index among its objects)``), and the
        dropped objects' locations (``where``; those of dropped images are not listed)."""
        row = {self.paths[i]: i for i in range(len(self))}
        keep_images, keep_objects = np.ones(len(self), bool), np.ones(self.num_objects, bool)
        keep_images[[row[str(p)] for p in images if str(p) in row]] = False
        dropped = sorted(self.first[row[str(p)]] + i for p, i in objects if str(p) in row and keep_images[row[str(p)]])
        keep_objects[dropped] = False
        return self.take(np.flatnonzero(keep_images), keep_objects), [self.where[j] for j in dropped]

    def name_counts(self) -> tuple[dict[str, int], dict[str, int]]:
        """``(objects per name, images per name)``, names in the order first met."""
        names = [self.names[j] for j in range(self.num_objects)]
        code_of = {n: c for c, n in enumerate(dict.fromkeys(names))}
        codes = np.array([code_of[n] for n in names], np.int64)
        owner = np.repeat(np.arange(len(self)), np.diff(self.first))
        per_image = np.unique(owner * max(1, len(code_of)) + codes) % max(1, len(code_of))
        objects, images = np.bincount(codes, minlength=len(code_of)), np.bincount(per_image, minlength=len(code_of))
        return ({n: int(objects[c]) for n, c in code_of.items()}, {n: int(images[c]) for n, c in code_of.items()})

    def arrays(self, prefix: str) -> dict[str, np.ndarray]:
        """Every column as named arrays (for ``np.savez``), names starting with ``prefix``."""
        out = {}
        for name, column in [(n, getattr(self, n)) for n in (*_TEXT, *_ARRAYS, *_DETAIL)]:
            out |= column.arrays(prefix + name) if isinstance(column, Strings) else {prefix + name: column}
        return out

    @classmethod
    def from_arrays(cls, arrays, prefix: str, detail: Callable[[], dict] | None = None) -> RecordTable:
        """The inverse of :meth:`arrays` (``arrays``: a mapping, e.g. an opened ``.npz``); ``detail``: where to read
        the detail columns from on first use (a mapping like ``arrays``) instead of ``arrays`` now."""
        columns = {name: Strings.from_arrays(arrays, prefix + name) for name in _TEXT}
        held = Detail(_DetailReader(lambda: arrays, prefix)()) if detail is None else None
        return cls(held or Detail(load=_DetailReader(detail, prefix)), **columns,
                   **{name: arrays[prefix + name] for name in _ARRAYS})

    @staticmethod
    def detail_arrays(prefix: str, names: Iterable[str]) -> list[str]:
        """Which of the array ``names`` (of :meth:`arrays` with ``prefix``) hold detail columns."""
        return [n for n in names if n.startswith(prefix) and n[len(prefix):].split(".")[0] in _DETAIL]


def select(records: Sequence[ImageRecord], index: Sequence[int]) -> Sequence[ImageRecord]:
    """The records at ``index``, in that order: a table of them for a :class:`RecordTable`, else a list."""
    return records.take(index) if isinstance(records, RecordTable) else [records[i] for i in index]


def object_arrays(records: Sequence[ImageRecord]) -> tuple[np.ndarray, np.ndarray]:
    """``(boxes [M, 4] pixel xyxy, labels [M])`` of every object of ``records`` (a table's own arrays)."""
    if isinstance(records, RecordTable):
        return records.boxes, records.labels
    objects = [o for r in records for o in r.objects]
    return np.array([o.box for o in objects], np.float64).reshape(-1, 4), np.array([o.label for o in objects], np.int64)

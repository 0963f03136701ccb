"""One image's record replaced in a :class:`~ssd.data.table.RecordTable`, the table equal, array for array, to the
one :meth:`~ssd.data.table.RecordTable.from_records` makes of the new records (the dataset index patches a split
after an edited annotation instead of making every record again)."""

from __future__ import annotations

import numpy as np

from ssd.data.records import ImageRecord
from ssd.data.table import Detail, RecordTable, Strings

__all__ = ["splice_record", "splice_strings"]

_SHARED = frozenset({"paths", "annotations", "sources", "where"})
"""The text columns that :meth:`RecordTable.from_records` packs after their common prefix."""
_IMAGE_TEXT, _OBJECT_TEXT = ("paths", "annotations", "image_ids"), ("names", "sources", "where", "raw")
_IMAGE_ARRAYS, _OBJECT_ARRAYS = ("sizes", "id_is_int"), ("boxes", "labels", "flags", "lines", "z_order")


def _varied(strings: Strings) -> bool:
    """Whether the texts of ``strings`` share nothing after its prefix (one is empty, or two first bytes differ):
    the prefix is then the longest one, as :meth:`Strings.pack` finds it."""
    lengths = np.diff(strings.offsets)
    if len(lengths) == 0 or (lengths == 0).any():
        return True
    firsts = strings.blob[strings.offsets[:-1]]
    return bool((firsts != firsts[0]).any())


def splice_strings(strings: Strings, lo: int, hi: int, texts: list[str], shared: bool) -> Strings:
    """``strings`` with its texts ``lo:hi`` replaced by ``texts``, as :meth:`Strings.pack` (``share_prefix=shared``)
    packs the whole list; the other texts are copied as bytes unless the common prefix changes."""
    prefix = strings.prefix if shared else ""
    if len(strings) == hi - lo or not all(t.startswith(prefix) for t in texts):
        return Strings.pack(strings.tolist(0, lo) + texts + strings.tolist(hi), shared)
    new = Strings.pack([t[len(prefix):] for t in texts])
    offsets = strings.offsets
    blob = np.concatenate([strings.blob[:offsets[lo]], new.blob, strings.blob[offsets[hi]:]])
    lengths = np.concatenate([np.diff(offsets[:lo + 1]), np.diff(new.offsets), np.diff(offsets[hi:])])
    spliced = Strings(blob, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), prefix)
    if shared and not _varied(spliced):  # the texts that kept the prefix short are gone
        return Strings.pack(spliced.tolist(), True)
    return spliced


def _rows(array: np.ndarray, lo: int, hi: int, new: np.ndarray) -> np.ndarray:
    return np.concatenate([array[:lo], new.astype(array.dtype, copy=False), array[hi:]])


def splice_record(table: RecordTable, row: int, record: ImageRecord) -> RecordTable:
    """``table`` with image ``row``'s record (and its objects) replaced by ``record`` (its detail columns read)."""
    one = RecordTable.from_records([record])
    lo, hi = int(table.first[row]), int(table.first[row + 1])
    columns = {name: splice_strings(getattr(table, name), row, row + 1, getattr(one, name).tolist(),
                                    name in _SHARED) for name in _IMAGE_TEXT}
    columns |= {name: _rows(getattr(table, name), row, row + 1, getattr(one, name)) for name in _IMAGE_ARRAYS}
    columns |= {name: _rows(getattr(table, name), lo, hi, getattr(one, name)) for name in _OBJECT_ARRAYS[:3]}
    columns["first"] = np.concatenate([table.first[:row + 1], table.first[row + 1:] + (one.num_objects - (hi - lo))])
    detail = {name: splice_strings(getattr(table, name), lo, hi, getattr(one, name).tolist(), name in _SHARED)
              for name in _OBJECT_TEXT}
    detail |= {name: _rows(getattr(table, name), lo, hi, getattr(one, name)) for name in _OBJECT_ARRAYS[3:]}
    return RecordTable(Detail(detail), **columns)

"""The dataset index's file: one ``.npz`` of plain arrays (read with ``allow_pickle=False``; never a pickle) whose
members come in groups, each with its own SHA-256 in the member ``digests``, checked when that group is read:

- ``index``: what a warm start reads (the meta data, the file list, the tables' training columns);
- ``detail<i>``: the message columns of split ``i`` (where, raw, source lines, names), read on first use;
- ``memo``: the per-file results (:mod:`ssd.data.memo`), read only to rebuild, in a file of their own beside the
  index (:func:`memo_path`; the index holds their digest): a patch (:mod:`ssd.data.index_patch`) rewrites the index
  and leaves them as they are, its own results in the index's group ``memo_patch``.

So a warm start reads and hashes only the group ``index``. :mod:`ssd.data.index` decides when a file is used.

A cache file is opened only when it is a regular file (a FIFO would block the read forever), and read only when its
members are stored as ``np.savez`` writes them, uncompressed: a compressed member (a "zip bomb" of gigabytes in a
few kilobytes) is a damaged file, never inflated.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import zipfile
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ssd.data.memo import issue_rows, issues_from
from ssd.data.records import DatasetSpec
from ssd.data.table import RecordTable, Strings
from ssd.errors import DataError
from ssd.files import atomic_write
from ssd.log import LOGGER

__all__ = ["StoredIndex", "write_index", "read_group", "read_memo", "memo_path", "issue_rows", "issues_from",
           "text_array", "INDEX_ERRORS", "damage_reason", "open_regular", "load_npz"]

MEMO_GROUPS = ("memo", "memo_patch")
"""The groups (each one member) of the per-file results: a rebuild's, and those patches added since (which hold)."""
INDEX_ERRORS = (OSError, ValueError, KeyError, EOFError, RecursionError, zipfile.BadZipFile)
"""What reading a damaged or foreign index file raises (zip, npy and JSON errors: a JSON nested too deep is a
``RecursionError``); the image cache's file too."""


def open_regular(path: str | os.PathLike) -> BinaryIO:
    """``path`` open for reading; ``ValueError`` unless it is a regular file (opened without blocking: a FIFO's
    open would wait for a writer forever)."""
    nonblock = getattr(os, "O_NONBLOCK", 0)  # POSIX (Windows has no FIFO to open)
    fd = os.open(path, os.O_RDONLY | nonblock | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("it is not a regular file (a FIFO or a device?)")
        if nonblock:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def load_npz(file: BinaryIO) -> np.lib.npyio.NpzFile:
    """``np.load`` of an ``.npz`` (no pickles) whose members are all stored uncompressed, as ``np.savez`` writes
    them: their sizes are then bounded by the file's own; ``ValueError`` for a compressed member."""
    z = np.load(file, allow_pickle=False)
    for info in z.zip.infolist():
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            z.close()
            raise ValueError(f"its member {info.filename} is compressed ({info.compress_size:,} bytes to "
                             f"{info.file_size:,}), which ssd never writes")
    return z


def damage_reason(error: BaseException) -> str:
    """One of :data:`INDEX_ERRORS` as the reason of a one-line notice: its first line, at most 120 characters."""
    return (str(error) or type(error).__name__).splitlines()[0][:120]


def text_array(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _digest(arrays: Mapping, names: Iterable[str]) -> str:
    """SHA-256 of the arrays ``names`` of ``arrays``."""
    h = hashlib.sha256()
    for name in sorted(names):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


def _group(name: str) -> str:
    """The digest group of an index member: ``memo`` (the per-file results), ``memo_patch`` (those the patches of
    :mod:`ssd.data.index_patch` made since), ``detail<i>`` (split ``i``'s message columns) or ``index`` (the rest:
    what a warm start reads)."""
    split = name.partition(".")[0]
    if name in MEMO_GROUPS:
        return name
    return f"detail{split[5:]}" if split.startswith("split") and RecordTable.detail_arrays(split + ".", [name]) \
        else "index"


def _groups(names: Iterable[str]) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for name in names:
        if name != "digests":
            groups.setdefault(_group(name), []).append(name)
    return groups


_GROUP_TEXT = {"index": "arrays", "memo": "per-file results", "memo_patch": "per-file results of its patches"}


def _version(meta) -> object:
    """The index version an index file's meta data names (None when it names none)."""
    key = meta.get("key") if isinstance(meta, dict) else None
    return key.get("version") if isinstance(key, dict) else None


class _Damaged(ValueError):
    """A group of an index file fails its digest."""


def memo_path(path: Path) -> Path:
    """The file of the per-file results of the index file ``path`` (``index-<key>.npz`` -> ``memo-<key>.npz``)."""
    return path.with_name(path.name.replace("index-", "memo-", 1))


def read_group(path: Path, group: str, digests: dict | None = None) -> dict[str, np.ndarray]:
    """The arrays of ``group`` in the index file ``path`` (``memo``: in its :func:`memo_path`), checked against
    their digest in ``digests`` (the file's own when None). Raises :class:`_Damaged` for a group that fails the
    digest of its file, ``ValueError`` (and what ``np.load`` raises) for a file whose ``group`` is not the one of
    ``digests`` (a file rewritten by another run with this group unchanged still answers: only the group's own
    digest is compared)."""
    with open_regular(path) as f, load_npz(f) as z:
        held = json.loads(z["digests"].tobytes())
        if not isinstance(held, dict):
            raise ValueError("it has no digests")
        if group != "memo":
            names = _groups(z.files).get(group, [])
            arrays = {name: z[name] for name in names}
    if group == "memo":
        with open_regular(memo_path(path)) as f, load_npz(f) as z:
            names = [name for name in z.files if name == "memo"]
            arrays = {name: z[name] for name in names}
    if digests is not None and held.get(group) != digests.get(group):
        raise ValueError("another index replaced it")
    if group not in held or _digest(arrays, names) != held[group]:
        what = _GROUP_TEXT.get(group, f"message columns of split {group[6:]}")
        raise _Damaged(f"its {what} do not match their digest (edited or damaged)")
    return arrays


def read_memo(path: Path, digests: dict | None = None) -> dict:
    """The per-file results (:mod:`ssd.data.memo`) stored in the index file ``path`` (a rebuild's, then those of
    the patches since, which replace them), checked as :func:`read_group` checks a group."""
    if digests is None:
        with open_regular(path) as f, load_npz(f) as z:
            digests = json.loads(z["digests"].tobytes())
    groups = [group for group in MEMO_GROUPS if group == "memo" or (isinstance(digests, dict) and group in digests)]
    memo: dict = {}
    for group in groups:
        entries = json.loads(read_group(path, group, digests)[group].tobytes())
        if not isinstance(entries, dict):
            raise ValueError(f"its {_GROUP_TEXT[group]} are not a JSON object")
        memo |= entries
    return memo


class _IndexFile:
    """Reads ``group`` from the index file again (a split's message columns, on first use), provided the file is
    still the one of ``digests``. A group damaged in place is said and its file removed; with ``rebuild`` (which
    builds the index again: an :class:`~ssd.data.index.Indexed`) the columns come from the new file in this run,
    provided its split ``split`` trains on the very arrays ``training`` this run holds."""

    def __init__(self, path: Path, digests: dict, group: str, split: int, training: dict[str, np.ndarray],
                 rebuild: Callable[[], Any] | None) -> None:
        self.path, self.digests, self.group, self.split = path, digests, group, split
        self.training, self.rebuild = training, rebuild

    def __call__(self) -> dict:
        try:
            return read_group(self.path, self.group, self.digests)
        except _Damaged as e:
            again = "rebuilding it now" if self.rebuild else "removed, the next run rebuilds it"
            LOGGER.warning(f"dataset cache: {self.path} is not a valid index ({e}): {again}")
            with suppress(OSError):
                self.path.unlink()
            with suppress(*INDEX_ERRORS):
                if self.rebuild is not None and self.rebuild().stored and self._same_split():
                    return read_group(self.path, self.group)
        except INDEX_ERRORS:
            pass
        raise DataError(f"the dataset index {self.path} changed while this run used it (rebuilt by another run, or "
                        "damaged): run again")

    def _same_split(self) -> bool:
        """Whether the rebuilt file's split trains on the arrays this run holds (the dataset did not change)."""
        rebuilt = read_group(self.path, "index")
        return self.training.keys() == {n for n in rebuilt if n.startswith(f"split{self.split}.")} and all(
            np.array_equal(rebuilt[name], array) for name, array in self.training.items())


class StoredIndex:
    """An index file's content, checked (the key it was built for and the digest of what training reads); the
    message columns of its tables and the per-file results are read (and checked) from the file when needed, never
    held."""

    def __init__(self, path: Path, key: dict) -> None:
        with open_regular(path) as f, load_npz(f) as z:  # each z[name] reads its member again: read once
            meta_text = z["meta"]
            meta = json.loads(meta_text.tobytes())  # the version first: an older index says so, not "damaged"
            if _version(meta) != key["version"]:
                raise ValueError(f"it was written for index version {_version(meta)}, this ssd reads version "
                                 f"{key['version']}")
            digests = json.loads(z["digests"].tobytes())
            groups = _groups(z.files)
            if not isinstance(digests, dict) or set(digests) != set(groups) | {"memo"}:
                raise ValueError("its members do not match its digests (edited or damaged)")
            arrays = {name: meta_text if name == "meta" else z[name] for name in groups["index"]}
        if _digest(arrays, arrays) != digests["index"]:  # meta's among them: parsed from what is checked
            raise ValueError("its digest does not match its content (edited or damaged)")
        if meta.get("key") != key:
            raise ValueError("it was built for another dataset or class list")
        self._hold(path, meta, arrays, digests)

    @classmethod
    def written(cls, path: Path, meta: dict, arrays: dict[str, np.ndarray], digests: dict) -> StoredIndex:
        """The index just written from ``arrays``, as :meth:`__init__` would read it back."""
        stored = cls.__new__(cls)
        stored._hold(path, meta, {name: arrays[name] for name in _groups(arrays)["index"]}, digests)
        return stored

    def _hold(self, path: Path, meta: dict, arrays: dict[str, np.ndarray], digests: dict) -> None:
        """Keep what training reads (``arrays``: the group ``index``); the other groups stay in the file."""
        self.path, self.meta, self.arrays, self.digests = path, meta, arrays, digests
        self.files = Strings.from_arrays(arrays, "files")
        self.rebuild: Callable[[], Any] | None = None  # see _IndexFile; set by the dataset index

    def memo(self) -> dict | None:
        """The per-file results; None (said when damaged) when they cannot be trusted: every file is read."""
        try:
            return read_memo(self.path, self.digests)
        except _Damaged as e:
            LOGGER.warning(f"dataset cache: {self.path} is not a valid index ({e}): rebuilding it")
        except INDEX_ERRORS:
            pass
        return None

    def spec(self) -> DatasetSpec:
        m = self.meta
        splits = {name: RecordTable.from_arrays(self.arrays, f"split{i}.", _IndexFile(
            self.path, self.digests, f"detail{i}", i, {n: a for n, a in self.arrays.items()
                                                       if n.startswith(f"split{i}.")}, self.rebuild))
                  for i, name in enumerate(m["splits"])}
        return DatasetSpec(Path(m["root"]), m["format"], m["class_names"], splits, issues_from(m["issues"]),
                           m["category_ids"], {k: Path(v) for k, v in m["sources"].items()},
                           [Path(p) for p in m["watched"]])


def write_index(path: Path, meta: dict, arrays: dict[str, np.ndarray], memo: np.ndarray | str) -> StoredIndex:
    """Write ``arrays`` (``meta`` among them, as :func:`text_array`) with their digests to ``path`` atomically, and
    the per-file results ``memo`` to its :func:`memo_path` first (or, given their digest, keep those there); the
    index as :class:`StoredIndex` would read it back."""
    digests = {group: _digest(arrays, names) for group, names in _groups(arrays).items()}
    if isinstance(memo, str):
        digests["memo"] = memo
    else:
        digests["memo"] = _digest({"memo": memo}, ["memo"])
        with atomic_write(memo_path(path)) as f:  # a run killed before the index is written: its digest fails
            np.savez(f, memo=memo)
    with atomic_write(path) as f:
        np.savez(f, **arrays, digests=text_array(digests))
    return StoredIndex.written(path, meta, arrays, digests)

"""The dataset index: a parsed and checked dataset, stored once in a cache folder and reused while its files are
unchanged, so that ``ssd train`` / ``ssd val`` on a known dataset read and decode nothing.

What is stored (:mod:`ssd.data.index_file`: plain arrays, never a pickle, in groups checked when read): every split as
a :class:`~ssd.data.table.RecordTable`, the reader's issues, the check's issues for each set of splits checked so far,
the per-file results of :mod:`ssd.data.memo` (image sizes, decodes, annotation files) and the dataset's file list
with each file's size, modification and status-change times and inode (a file rewritten in place with its size kept
and its modification time restored has a new status-change time). Where: ``$SSD_CACHE_DIR``, else
``$XDG_CACHE_HOME/ssd``, else ``~/.cache/ssd`` (never inside the dataset, which may be read-only), in a folder named
by a hash of the data path, one file per class list given (a new one starts from the per-file results of another).

Reuse: the file list is taken again (the dataset folder and the folders the readers watched outside it walked once,
files elsewhere stat'ed: :attr:`~ssd.data.records.DatasetSpec.watched`) and must equal the stored one; otherwise the
readers run again with the stored per-file results, so only the files that changed are read. A warm start reads and
checks only what training uses; a file that fails a digest, holds another dataset's key or does not load is rebuilt
with a one-line notice (message columns found damaged while a run uses them: rebuilt in that run, which goes on when
its tables are unchanged, else is told to run again). Two processes never write one index at once
(:class:`~ssd.files.DirectoryLock`; the second builds without storing) and the file is replaced atomically. Under
torchrun rank 0 builds or validates it first while the others wait, then they take that file as it is (not
fingerprinted again: a file changed just before the run differs between ranks). A cache folder that cannot be written
is said once; the data is then read as without an index.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import itertools
import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ssd.distributed as ddp
from ssd.data.check import find_issues, used_splits
from ssd.data.index_file import (
    INDEX_ERRORS,
    StoredIndex,
    damage_reason,
    issue_rows,
    issues_from,
    read_memo,
    text_array,
    write_index,
)
from ssd.data.load import load_dataset
from ssd.data.memo import RACY_NS, FileMemo, cyclic_gc_paused, file_state
from ssd.data.records import DatasetSpec, Issue
from ssd.data.table import RecordTable, Strings
from ssd.errors import OutputError
from ssd.files import DirectoryLock, LockHeld, describe_os_error, remove_stale_temporaries
from ssd.log import LOGGER

__all__ = ["INDEX_VERSION", "CACHE_ENV", "cache_root", "cache_lock", "Indexed", "index_dataset", "release_freed_heap",
           "stable_state", "state_array", "json_hash"]

INDEX_VERSION = 3
"""Changes whenever what an index stores changes: an index of another version is rebuilt (with a notice)."""
FOLDER_SCHEME = 1
"""The index folder is named by a hash of this and the data path: it stays, so an older index is found and rebuilt."""
CACHE_ENV = "SSD_CACHE_DIR"
INDEX_FILE = "index-{}.npz"
"""One file per class list given, in one folder per dataset (and :data:`INDEX_VERSION`)."""
EXTRA_FILES_FACTOR, EXTRA_FILES = 4, 100_000
"""The dataset folder is walked for at most ``EXTRA_FILES_FACTOR`` times the dataset's own files plus
``EXTRA_FILES``: a folder that holds far more (a data.yaml whose ``path`` is ``/``) is not indexed."""

_told: set[str] = set()  # cache folders already said to be unwritable (once per process)


def cache_root() -> Path:
    """The cache folder: ``$SSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/ssd``, else ``~/.cache/ssd``."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ssd"


@dataclass
class Indexed:
    """What :func:`index_dataset` gives: ``spec`` (splits as tables), ``issues`` (the check of the splits asked
    for), ``reads`` (the files read in this run, ``(kind, path)``: none when the index was reused), ``stored``
    (whether an index file now holds it) and ``digest`` (that file's digest of what training reads, when stored)."""

    spec: DatasetSpec
    issues: list[Issue]
    reads: list[tuple[str, str]] = field(default_factory=list)
    stored: bool = False
    digest: str | None = None


class _Fingerprint:
    """The dataset's files and their states: ``paths`` sorted, ``states`` int64 ``[F, 4]`` (see
    :func:`~ssd.data.memo.file_state`; ``-1`` for a file that cannot be stat'ed or changed too recently)."""

    def __init__(self, spec: DatasetSpec, since_ns: int, walked: dict[str, dict] | None = None,
                 known: dict[str, tuple[int, int, int, int] | None] | None = None) -> None:
        """``spec``'s splits are tables; ``walked``: the states of the files of folders walked earlier in this run (the
        dataset folder, the watched folders outside it: :attr:`DatasetSpec.watched`), by folder; ``known``: states of
        some files taken earlier (:attr:`FileMemo.states`; a file changed since then is read again next time: the
        older state is kept)."""
        own = {os.fspath(p) for p in spec.sources.values()}
        for table in spec.splits.values():
            own.update(table.paths.tolist(), table.annotations.tolist())
        own.update(os.fspath(i.image) for i in spec.issues if i.image is not None)  # a missing one put in place
        own.discard("")  # an image without annotation file
        root = os.path.join(os.path.abspath(spec.root), "")
        folders = [p for p in map(os.path.abspath, spec.watched) if os.path.isdir(p) and not p.startswith(root)]
        own.update(p for p in map(os.path.abspath, spec.watched) if not os.path.isdir(p))
        self.walked = {folder: (walked or {}).get(folder) or _walk(Path(folder), len(own), since_ns, known)
                       for folder in [os.fspath(spec.root), *folders]}  # each folder walked once in a run
        states = {path: state for found in self.walked.values() for path, state in found.items()}
        for path in own - states.keys():
            states[path] = stable_state(path, since_ns, known)
        self.paths = sorted(states)
        self.states = state_array(map(states.__getitem__, self.paths), len(self.paths))

    @functools.cached_property
    def packed(self) -> Strings:
        """:attr:`paths` packed, as the index stores them (compared, then written: packed once)."""
        return Strings.pack(self.paths)

    def same(self, paths: Strings, states: np.ndarray) -> bool:
        packed = self.packed
        return (np.array_equal(states, self.states) and np.array_equal(paths.offsets, packed.offsets)
                and paths.prefix == packed.prefix and np.array_equal(paths.blob, packed.blob))


class _NotIndexed(Exception):
    """Why this dataset is read without an index (said once)."""


def _walk(root: Path, own: int, since_ns: int, known: dict | None = None) -> dict[str, tuple[int, int, int, int]]:
    """The states of the files under ``root`` (a dataset of ``own`` files), by path (``known``: see
    :class:`_Fingerprint`)."""
    states: dict[str, tuple[int, int, int, int]] = {}
    bound = EXTRA_FILES_FACTOR * own + EXTRA_FILES
    folders = [os.fspath(root)] if root.is_dir() else []
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:  # links to folders are listed, not followed: no loops
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(entry.path)
                    else:
                        states[entry.path] = stable_state(entry.path, since_ns, known)
        except OSError:  # a folder that cannot be listed: its files, if the dataset's, are stat'ed one by one
            continue
        if len(states) > bound:
            raise _NotIndexed(f"{root} holds more than {bound:,} files, most of them not the dataset's")
    return states


def stable_state(path: str, since_ns: int, known: Mapping[str, tuple[int, int, int, int] | None] | None = None
                 ) -> tuple[int, int, int, int]:
    """:func:`~ssd.data.memo.file_state` of ``path`` (its state in ``known`` when there is one: no second stat);
    ``(-1, -1, -1, -1)`` when it cannot be stat'ed or was modified at or after ``since_ns`` (too recently to be
    told from a later edit: never trusted)."""
    state = known[path] if known is not None and path in known else file_state(path)
    return (-1, -1, -1, -1) if state is None or state[1] >= since_ns else state


def state_array(states: Iterable[tuple[int, int, int, int]], count: int) -> np.ndarray:
    """``count`` file states as int64 ``[count, 4]``, from an iterator, not a list of tuples: ``np.array``'s
    coercion of many tuples leaves the small-object heap it used held (about 2 MB per 10k images, in the trainer
    to its end)."""
    return np.fromiter(itertools.chain.from_iterable(states), np.int64, 4 * count).reshape(-1, 4)


def json_hash(value) -> str:
    """32 hex digits of the SHA-256 of ``value`` as JSON: the name of a cache folder or file."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:32]


def _key(data: str | Path, class_names: list[str] | None) -> dict:
    return {"version": INDEX_VERSION, "data": os.path.abspath(data), "class_names": class_names}


def _save(path: Path, key: dict, spec: DatasetSpec, checks: dict, memo: FileMemo, files: _Fingerprint
          ) -> StoredIndex:
    meta = {"key": key, "root": str(spec.root), "format": spec.format, "class_names": spec.class_names,
            "category_ids": spec.category_ids, "sources": {k: str(v) for k, v in spec.sources.items()},
            "watched": [str(p) for p in spec.watched],
            "splits": list(spec.splits), "issues": issue_rows(spec.issues), "checks": checks}
    arrays = {"meta": text_array(meta), "memo": np.frombuffer(memo.used_json(), np.uint8), "files.state": files.states,
              **files.packed.arrays("files")}
    for i, table in enumerate(spec.splits.values()):
        arrays |= table.arrays(f"split{i}.")
    return write_index(path, meta, arrays)


def cache_lock(folder: Path, what: str = "dataset index", busy: str | None = None,
               notice: str = "dataset cache", without: str = "working without a cache") -> DirectoryLock | None:
    """The lock of the cache folder of ``what``; None when the folder cannot be written or its lock file is not one
    (said once, as ``notice: <reason>; <without>``) or another process holds the lock (``busy`` said, when given).
    Temporaries a killed writer left in the folder are removed (under the lock no writer is at work)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = DirectoryLock(folder, what=what)
        with suppress(OSError):  # removed next time
            remove_stale_temporaries(folder)
        return lock
    except OSError as e:
        reason = describe_os_error(e, folder)
    except LockHeld:  # another process builds it now
        if busy is not None:
            LOGGER.warning(busy)
        return None
    except OutputError as e:  # the folder is not writable, or its lock file is not one
        reason = str(e)
    if str(folder.parent) not in _told:
        _told.add(str(folder.parent))
        LOGGER.warning(f"{notice}: {reason}; {without} (set {CACHE_ENV} to a writable folder)")
    return None


def index_dataset(data: str | Path, *, class_names: list[str] | None = None, splits: Sequence[str] | None = ("train",),
                  recheck: bool = False) -> Indexed:
    """The dataset ``data`` read (:func:`~ssd.data.load.load_dataset`) and checked (:func:`~ssd.data.check
    .find_issues` of those of ``splits`` it has, or of every split for None; images decoded), from its index when
    unchanged.

    ``recheck``: read and decode everything again (the index is then replaced). Notices (a rebuilt index, an
    unwritable cache folder) are one line each on the ``ssd`` logger. Raises what :func:`load_dataset` raises, and a
    :class:`~ssd.errors.DataError` when ``splits[0]`` is missing.
    """
    key = _key(data, class_names)
    folder = cache_root() / "datasets" / json_hash([FOLDER_SCHEME, key["data"]])
    path, wanted = folder / INDEX_FILE.format(json_hash(class_names)), None if splits is None else list(splits)

    def build() -> Indexed:
        return _locked(data, key, class_names, wanted, recheck, path)

    # the other ranks take rank 0's index as it is (a file changed just now is -1 there), else build their own
    return ddp.leader_first(build, lambda indexed: indexed.digest,
                            lambda digest: _follow(path, key, wanted, digest) or build())


def _locked(data, key: dict, class_names, splits: list[str] | None, recheck: bool, path: Path) -> Indexed:
    lock = cache_lock(path.parent)  # held by another run: this one builds without storing
    try:
        with cyclic_gc_paused():  # the per-file results and records: many containers, no garbage
            return _indexed(data, key, class_names, splits, recheck, path, lock)
    finally:
        if lock is not None:
            lock.release()


def _follow(path: Path, key: dict, splits: list[str] | None, digest: str | None) -> Indexed | None:
    """The index rank 0 wrote or validated (``digest``: of what training reads), as it is; None when there is none
    (or another run replaced it since)."""
    try:
        stored = None if digest is None else StoredIndex(path, key)
    except INDEX_ERRORS:
        return None
    if stored is None or stored.digests["index"] != digest:
        return None
    return _as_stored(stored, stored.spec(), splits)


def _as_stored(stored: StoredIndex, spec: DatasetSpec, splits: list[str] | None) -> Indexed | None:
    """The stored index as it is (``spec``: its splits), when it holds the check of ``splits``; else None."""
    checked = stored.meta["checks"].get(_checked_key(spec, splits))
    if checked is None:
        return None
    _first_split(spec, splits)
    return Indexed(spec, issues_from(checked), [], True, stored.digests["index"])


def release_freed_heap() -> None:
    """Hand the heap freed while reading a dataset (file lists, arrays read and dropped) back to the system: glibc
    keeps it (about 1 kB per image, in every training process) unless asked. Elsewhere (no ``malloc_trim``) nothing
    to do."""
    with suppress(OSError, AttributeError, TypeError):  # no C library by that name, no such function
        ctypes.CDLL(None).malloc_trim(0)


def _indexed(data, key: dict, class_names, splits: list[str] | None, recheck: bool, path: Path,
             lock: DirectoryLock | None) -> Indexed:
    stored = None
    rebuild = functools.partial(_locked, data, key, class_names, splits, False, path)  # damaged message columns
    if path.is_file() and not recheck:
        try:
            stored = StoredIndex(path, key)
            stored.rebuild = rebuild
        except INDEX_ERRORS as e:
            LOGGER.warning(f"dataset cache: {path} is not a valid index ({damage_reason(e)}): rebuilding it")
    start_ns = time.time_ns() - RACY_NS
    files = None  # the stored dataset's files, before any read (its folder walked once in a run)
    if stored is not None:
        spec = stored.spec()
        with suppress(_NotIndexed):
            files = _Fingerprint(spec, start_ns)
        if files is not None and files.same(stored.files, stored.arrays["files.state"]) and (
                reused := _as_stored(stored, spec, splits)) is not None:
            return reused
    memo = FileMemo(stored.memo() if stored is not None else None if recheck else _sibling_memo(path), start_ns,
                    () if files is None else zip(files.paths, files.states.tolist()))
    with memo.active():
        spec = load_dataset(data, class_names=class_names)
        _first_split(spec, splits)
        tables = spec.splits  # a reader's tables (COCO) made records once: the check walks them several times
        spec.splits = {name: list(records) for name, records in tables.items()}
        issues = find_issues(spec, splits, decode_images=True)
    spec.splits = {name: RecordTable.from_records(records) for name, records in tables.items()}
    if lock is None:
        return Indexed(spec, issues, memo.reads)
    try:
        files = _Fingerprint(spec, start_ns, None if files is None else files.walked, memo.states)
    except _NotIndexed as e:
        LOGGER.warning(f"dataset cache: {e}: not indexed")
        return Indexed(spec, issues, memo.reads)
    checks = {_checked_key(spec, splits): issue_rows(issues)}
    if stored is not None and files.same(stored.files, stored.arrays["files.state"]):
        checks = stored.meta["checks"] | checks  # the same files: the other checks still hold
    try:
        stored = _save(path, key, spec, checks, memo, files)
    except OutputError as e:
        LOGGER.warning(f"dataset cache: {e}; working without a cache")
        return Indexed(spec, issues, memo.reads)
    stored.rebuild = rebuild
    return Indexed(stored.spec(), issues, memo.reads, True, stored.digests["index"])  # as a later run reads it


def _sibling_memo(path: Path) -> dict | None:
    """The per-file results of an index of the same dataset for another class list (``ssd val`` after ``ssd train``
    gives the model's names): they hold whatever the names (each entry is checked against its file's state)."""
    for other in sorted(set(path.parent.glob(INDEX_FILE.format("*"))) - {path}):
        with suppress(*INDEX_ERRORS):
            return read_memo(other)
    return None


def _checked_key(spec: DatasetSpec, splits: list[str] | None) -> str:
    """The key of the check of ``splits`` (those ``spec`` has; None: all) among an index's checks."""
    return ",".join(used_splits(spec, splits))


def _first_split(spec: DatasetSpec, splits: list[str] | None) -> None:
    """The caller's first split must exist (a clear error lists those there are)."""
    if splits:
        spec.records(splits[0])

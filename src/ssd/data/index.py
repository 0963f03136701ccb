"""The dataset index: a parsed and checked dataset, stored once in a cache folder and reused while its files are
unchanged, so that ``ssd train`` / ``ssd val`` on a known dataset read and decode nothing.

What is stored (:mod:`ssd.data.index_file`: plain arrays, never a pickle, in groups checked when read): every split as
a :class:`~ssd.data.table.RecordTable`, the reader's issues, the check's issues for each set of splits checked so far,
the per-file results of :mod:`ssd.data.memo` (image sizes, decodes, annotation files: in a file of their own beside
the index) and the dataset's file list
with each file's size, modification and status-change times and inode (a file rewritten in place with its size kept
and its modification time restored has a new status-change time). Where: ``$SSD_CACHE_DIR``, else
``$XDG_CACHE_HOME/ssd``, else ``~/.cache/ssd`` (never inside the dataset, which may be read-only), in a folder named
by a hash of the data path, one file per class list given (a new one starts from the per-file results of another).

Reuse: the file list is taken again (the dataset folder and the folders the readers watched outside it walked once,
files elsewhere stat'ed: :attr:`~ssd.data.records.DatasetSpec.watched`) and must equal the stored one; otherwise a few
edited files of a format with a file per image are patched in (:mod:`ssd.data.index_patch`), and anything else makes
the readers run again with the stored per-file results, so only the files that changed are read. A warm start reads and
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
import dataclasses
import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ssd.distributed as ddp
from ssd.data.check import check_parts, rules_version, used_splits
from ssd.data.fingerprint import Fingerprint, NotIndexed, stable_state, state_array
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
from ssd.data.index_patch import patch_index
from ssd.data.load import load_dataset
from ssd.data.memo import RACY_NS, FileMemo, cyclic_gc_paused
from ssd.data.records import DatasetSpec, Issue
from ssd.data.table import RecordTable
from ssd.errors import OutputError
from ssd.files import DirectoryLock, LockHeld, describe_os_error, remove_stale_temporaries
from ssd.log import LOGGER

__all__ = ["INDEX_VERSION", "CACHE_ENV", "cache_root", "cache_lock", "Indexed", "index_dataset", "release_freed_heap",
           "stable_state", "state_array", "json_hash"]

INDEX_VERSION = 4
"""Changes whenever what an index stores changes: an index of another version is rebuilt (with a notice)."""
FOLDER_SCHEME = 1
"""The index folder is named by a hash of this and the data path: it stays, so an older index is found and rebuilt."""
CACHE_ENV = "SSD_CACHE_DIR"
INDEX_FILE = "index-{}.npz"
"""One file per class list given, in one folder per dataset (and :data:`INDEX_VERSION`)."""
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


def json_hash(value) -> str:
    """32 hex digits of the SHA-256 of ``value`` as JSON: the name of a cache folder or file."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:32]


def _key(data: str | Path, class_names: list[str] | None) -> dict:
    return {"version": INDEX_VERSION, "data": os.path.abspath(data), "class_names": class_names}


def _save(path: Path, key: dict, spec: DatasetSpec, checks: tuple[dict, dict], memo: np.ndarray | str,
          files: Fingerprint, patched: tuple[dict[str, np.ndarray], int] = ({}, 0)) -> StoredIndex:
    """``checks``: the issue rows and the parts' sizes of each check (see :mod:`ssd.data.index_patch`); ``memo``: the
    per-file results (or the digest of those stored, kept); ``patched``: the arrays of the patches' results and how
    many."""
    meta = {"key": key, "root": str(spec.root), "format": spec.format, "class_names": spec.class_names,
            "category_ids": spec.category_ids, "sources": {k: str(v) for k, v in spec.sources.items()},
            "watched": [str(p) for p in spec.watched], "splits": list(spec.splits), "issues": issue_rows(spec.issues),
            "checks": checks[0], "parts": checks[1], "rules": rules_version(), "appended": patched[1]}
    arrays = {"meta": text_array(meta), **patched[0], "files.state": files.states, **files.packed.arrays("files")}
    for i, table in enumerate(spec.splits.values()):
        arrays |= table.arrays(f"split{i}.")
    return write_index(path, meta, arrays, memo)


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
        with suppress(NotIndexed):
            files = Fingerprint(spec, start_ns)
        if files is not None and files.same(stored.files, stored.arrays["files.state"]) and (
                reused := _as_stored(stored, spec, splits)) is not None:
            return reused
        if files is not None and lock is not None and (patched := _patched(stored, spec, splits, files, start_ns)):
            return patched
    memo = FileMemo(stored.memo() if stored is not None else None if recheck else _sibling_memo(path), start_ns,
                    () if files is None else zip(files.paths, files.states.tolist()))
    with memo.active():
        spec = load_dataset(data, class_names=class_names)
        _first_split(spec, splits)
        tables = spec.splits  # a reader's tables (COCO) made records once: the check walks them several times
        spec.splits = {name: list(records) for name, records in tables.items()}
        parts = check_parts(spec, splits, decode_images=True)
    issues = [issue for part in parts for issue in part]
    spec.splits = {name: RecordTable.from_records(records) for name, records in tables.items()}
    if lock is None:
        return Indexed(spec, issues, memo.reads)
    try:
        files = Fingerprint(spec, start_ns, None if files is None else files.walked, memo.states)
    except NotIndexed as e:
        LOGGER.warning(f"dataset cache: {e}: not indexed")
        return Indexed(spec, issues, memo.reads)
    checks = {_checked_key(spec, splits): issue_rows(issues)}, {_checked_key(spec, splits): list(map(len, parts[:3]))}
    if stored is not None and files.same(stored.files, stored.arrays["files.state"]):  # the other checks still hold
        checks = stored.meta["checks"] | checks[0], stored.meta.get("parts", {}) | checks[1]
    try:
        stored = _save(path, key, spec, checks, np.frombuffer(memo.used_json(), np.uint8), files)
    except OutputError as e:
        LOGGER.warning(f"dataset cache: {e}; working without a cache")
        return Indexed(spec, issues, memo.reads)
    stored.rebuild = rebuild
    return Indexed(stored.spec(), issues, memo.reads, True, stored.digests["index"])  # as a later run reads it


def _patched(stored: StoredIndex, spec: DatasetSpec, splits: list[str] | None, files: Fingerprint, start_ns: int
             ) -> Indexed | None:
    """The index patched for the few files that changed (:mod:`ssd.data.index_patch`) and stored; None when the
    change is left to the rebuild."""
    if _checked_key(spec, splits) not in stored.meta["checks"] or not files.same(stored.files, None):
        return None
    # message columns found damaged: the patch gives up (a DataError) and this run rebuilds, once the patch is gone
    rebuild, stored.rebuild = stored.rebuild, functools.partial(Indexed, spec, [])
    patch = patch_index(stored, stored.spec(), files.paths, files.states, start_ns)
    if patch is None:
        return None
    try:
        saved = _save(stored.path, stored.meta["key"], patch.spec, (patch.checks, patch.parts),
                      stored.digests["memo"], files, (patch.memo, patch.appended))
    except OutputError:  # the rebuild says why
        return None
    saved.rebuild = rebuild
    return dataclasses.replace(_as_stored(saved, saved.spec(), splits), reads=patch.reads)


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

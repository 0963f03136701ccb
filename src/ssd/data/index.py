"""The dataset index: a parsed and checked dataset, stored once in a cache folder and reused while its files are
unchanged, so that ``ssd train`` / ``ssd val`` on a known dataset read and decode nothing.

What is stored (one ``.npz`` of plain arrays, read with ``allow_pickle=False``; never a pickle): every split as a
:class:`~ssd.data.table.RecordTable`, the reader's issues, the check's issues for each set of splits checked so far,
the per-file results of :mod:`ssd.data.memo` (image sizes, decodes, annotation files) and the dataset's file list
with each file's size, modification time and inode. Where: ``$SSD_CACHE_DIR``, else ``$XDG_CACHE_HOME/ssd``, else
``~/.cache/ssd`` (never inside the dataset, which may be read-only), in a folder named by a hash of the data path
and :data:`INDEX_VERSION`, one file per class list given (a new one starts from the per-file results of another).

Reuse: the file list is taken again (the dataset folder walked, files elsewhere stat'ed) and must equal the stored
one; otherwise the readers run again with the stored per-file results, so only the files that changed are read.
A file that fails its digest, holds another dataset's key or does not load is rebuilt with a one-line notice. Two
processes never write one index at once (:class:`~ssd.files.DirectoryLock`; the second builds without storing) and
the file is replaced atomically. Under torchrun rank 0 builds first while the others wait. A cache folder that
cannot be written is said once; the data is then read as without an index.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import ssd.distributed as ddp
from ssd.data.check import find_issues
from ssd.data.load import load_dataset
from ssd.data.memo import RACY_NS, FileMemo, decode_parsed, encode_parsed, file_state
from ssd.data.records import DatasetSpec, Issue
from ssd.data.table import RecordTable, Strings
from ssd.errors import DataError, OutputError
from ssd.files import DirectoryLock, atomic_write, describe_os_error
from ssd.log import LOGGER

__all__ = ["INDEX_VERSION", "CACHE_ENV", "cache_root", "Indexed", "index_dataset"]

INDEX_VERSION = 1
"""Changes whenever what an index stores changes: an index of another version is rebuilt."""
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
    for), ``reads`` (the files read in this run, ``(kind, path)``: none when the index was reused) and ``stored``
    (whether an index file now holds it)."""

    spec: DatasetSpec
    issues: list[Issue]
    reads: list[tuple[str, str]] = field(default_factory=list)
    stored: bool = False


def _issue_rows(issues: Sequence[Issue]) -> list:
    return encode_parsed(([], list(issues)))[1]


def _issues(rows: list) -> list[Issue]:
    return decode_parsed([[], rows])[1]


class _Fingerprint:
    """The dataset's files and their states: ``paths`` sorted, ``states`` int64 ``[F, 3]`` (see
    :func:`~ssd.data.memo.file_state`; ``-1`` for a file that cannot be stat'ed or changed too recently)."""

    def __init__(self, spec: DatasetSpec, since_ns: int) -> None:
        own = {os.fspath(p) for p in spec.input_files()}
        states: dict[str, tuple[int, int, int]] = {}
        root = Path(spec.root)
        if root.is_dir():
            bound = EXTRA_FILES_FACTOR * len(own) + EXTRA_FILES
            for folder, dirs, files in os.walk(root):  # links to folders are listed, not followed: no loops
                for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
                    states[os.path.join(folder, name)] = _state(os.path.join(folder, name), since_ns)
                if len(states) > bound:
                    raise _NotIndexed(f"{root} holds more than {bound:,} files, most of them not the dataset's")
        for path in own - states.keys():
            states[path] = _state(path, since_ns)
        self.paths = sorted(states)
        self.states = np.array([states[p] for p in self.paths], np.int64).reshape(-1, 3)

    def same(self, paths: Strings, states: np.ndarray) -> bool:
        packed = Strings.pack(self.paths)
        return (np.array_equal(states, self.states) and np.array_equal(paths.offsets, packed.offsets)
                and paths.prefix == packed.prefix and np.array_equal(paths.blob, packed.blob))


class _NotIndexed(Exception):
    """Why this dataset is read without an index (said once)."""


def _state(path: str, since_ns: int) -> tuple[int, int, int]:
    state = file_state(path)
    return (-1, -1, -1) if state is None or state[1] >= since_ns else state


def _hash(value) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:32]


def _key(data: str | Path, class_names: list[str] | None) -> dict:
    return {"version": INDEX_VERSION, "data": os.path.abspath(data), "class_names": class_names}


def _text(value) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def _digest(arrays: Mapping, names: Iterable[str]) -> str:
    """SHA-256 of the arrays ``names`` of ``arrays`` (an opened ``.npz`` too: read one array at a time)."""
    h = hashlib.sha256()
    for name in sorted(names):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.data)
    return h.hexdigest()


class _IndexFile:
    """Reads ``names`` from the index file again (the detail columns, on first use), provided it is still the one
    of ``digest``."""

    def __init__(self, path: Path, digest: str, names: list[str]) -> None:
        self.path, self.digest, self.names = path, digest, names

    def __call__(self) -> dict:
        try:
            with np.load(self.path, allow_pickle=False) as z:
                if z["digest"].tobytes().decode() == self.digest:
                    return {name: z[name] for name in self.names}
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            pass
        raise DataError(f"the dataset index {self.path} changed while this run used it (rebuilt by another run?): "
                        "run again")


class _Stored:
    """An index file's content, checked (the key it was built for and a digest of every array); the detail columns
    of its tables and the per-file results are read from the file again when needed, never held."""

    def __init__(self, path: Path, key: dict) -> None:
        with np.load(path, allow_pickle=False) as z:
            digest = z["digest"].tobytes().decode()
            if digest != _digest(z, [name for name in z.files if name != "digest"]):
                raise ValueError("its digest does not match its content (edited or damaged)")
            meta = json.loads(z["meta"].tobytes())
            if meta.get("key") != key:
                raise ValueError("it was built for another dataset or version")
            self._hold(path, meta, z)

    @classmethod
    def written(cls, path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> _Stored:
        """The index just written from ``arrays``, as :meth:`__init__` would read it back."""
        stored = cls.__new__(cls)
        stored._hold(path, meta, arrays)
        return stored

    def _hold(self, path: Path, meta: dict, arrays: Mapping) -> None:
        """Keep what training reads (``arrays``: the file's arrays by name); leave the rest in the file."""
        names = list(arrays.keys())
        detail = [n for i in range(len(meta["splits"])) for n in RecordTable.detail_arrays(f"split{i}.", names)]
        self.arrays = {name: arrays[name] for name in names if name not in detail and name not in ("memo", "digest")}
        self.path, self.meta, self.digest, self.detail = path, meta, arrays["digest"].tobytes().decode(), detail
        self.files = Strings.from_arrays(self.arrays, "files")

    def memo(self) -> dict:
        return json.loads(_IndexFile(self.path, self.digest, ["memo"])()["memo"].tobytes())

    def spec(self) -> DatasetSpec:
        m, detail = self.meta, _IndexFile(self.path, self.digest, self.detail)
        splits = {name: RecordTable.from_arrays(self.arrays, f"split{i}.", detail)
                  for i, name in enumerate(m["splits"])}
        return DatasetSpec(Path(m["root"]), m["format"], m["class_names"], splits, _issues(m["issues"]),
                           m["category_ids"], {k: Path(v) for k, v in m["sources"].items()})


def _save(path: Path, key: dict, spec: DatasetSpec, checks: dict, memo: FileMemo, files: _Fingerprint) -> _Stored:
    meta = {"key": key, "root": str(spec.root), "format": spec.format, "class_names": spec.class_names,
            "category_ids": spec.category_ids, "sources": {k: str(v) for k, v in spec.sources.items()},
            "splits": list(spec.splits), "issues": _issue_rows(spec.issues), "checks": checks}
    arrays = {"meta": _text(meta), "memo": _text(memo.used), "files.state": files.states,
              **Strings.pack(files.paths).arrays("files")}
    for i, table in enumerate(spec.splits.values()):
        arrays |= table.arrays(f"split{i}.")
    arrays["digest"] = np.frombuffer(_digest(arrays, arrays).encode(), np.uint8)
    with atomic_write(path) as f:
        np.savez(f, **arrays)
    return _Stored.written(path, meta, arrays)


@contextmanager
def _main_first():
    """Under torchrun, rank 0 runs the block first while the other ranks wait; they run it once it is done (and
    then find its index)."""
    main = not ddp._active() or ddp.dist.get_rank() == 0
    if not main:
        ddp.barrier()
    try:
        yield
    finally:
        if main:
            ddp.barrier()


def _lock(folder: Path) -> DirectoryLock | None:
    """The index folder's lock; None (said once) when the folder cannot be written, or held by another process."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return DirectoryLock(folder, what="dataset index")
    except OSError as e:
        reason = describe_os_error(e, folder)
    except OutputError as e:
        if os.access(folder, os.W_OK):
            return None  # another process builds it now: this one builds without storing
        reason = str(e)
    if str(folder.parent) not in _told:
        _told.add(str(folder.parent))
        LOGGER.warning(f"dataset cache: {reason}; working without a cache (set {CACHE_ENV} to a writable folder)")
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
    folder = cache_root() / "datasets" / _hash([key["version"], key["data"]])
    with _main_first():
        lock = _lock(folder)
        try:
            return _indexed(data, key, class_names, None if splits is None else list(splits), recheck,
                            folder / INDEX_FILE.format(_hash(class_names)), lock)
        finally:
            if lock is not None:
                lock.release()


def _indexed(data, key: dict, class_names, splits: list[str] | None, recheck: bool, path: Path,
             lock: DirectoryLock | None) -> Indexed:
    stored = None
    if path.is_file() and not recheck:
        try:
            stored = _Stored(path, key)
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:  # zip, npy and JSON errors
            reason = (str(e) or type(e).__name__).splitlines()[0][:120]
            LOGGER.warning(f"dataset cache: {path} is not a valid index ({reason}): rebuilding it")
    start_ns = time.time_ns() - RACY_NS
    if stored is not None:
        spec = stored.spec()
        try:
            unchanged = _Fingerprint(spec, start_ns).same(stored.files, stored.arrays["files.state"])
        except _NotIndexed:
            unchanged = False
        checked = stored.meta["checks"].get(",".join(_used(spec, splits)))
        if unchanged and checked is not None:
            _first_split(spec, splits)
            return Indexed(spec, _issues(checked), [], True)
    memo = FileMemo(stored.memo() if stored is not None else None if recheck else _sibling_memo(path))
    with memo.active():
        spec = load_dataset(data, class_names=class_names)
        _first_split(spec, splits)
        issues = find_issues(spec, splits, decode_images=True)
    spec.splits = {name: RecordTable.from_records(records) for name, records in spec.splits.items()}
    if lock is None:
        return Indexed(spec, issues, memo.reads)
    try:
        files = _Fingerprint(spec, start_ns)
    except _NotIndexed as e:
        LOGGER.warning(f"dataset cache: {e}: not indexed")
        return Indexed(spec, issues, memo.reads)
    checks = {",".join(_used(spec, splits)): _issue_rows(issues)}
    if stored is not None and files.same(stored.files, stored.arrays["files.state"]):
        checks = stored.meta["checks"] | checks  # the same files: the other checks still hold
    try:
        stored = _save(path, key, spec, checks, memo, files)
    except OutputError as e:
        LOGGER.warning(f"dataset cache: {e}; working without a cache")
        return Indexed(spec, issues, memo.reads)
    return Indexed(stored.spec(), issues, memo.reads, True)  # as a later run reads it: details left in the file


def _sibling_memo(path: Path) -> dict | None:
    """The per-file results of an index of the same dataset for another class list (``ssd val`` after ``ssd train``
    gives the model's names): they hold whatever the names (each entry is checked against its file's state)."""
    for other in sorted(path.parent.glob(INDEX_FILE.format("*"))):
        try:
            with np.load(other, allow_pickle=False) as z:
                content = [n for n in z.files if n != "digest"]
                if other != path and z["digest"].tobytes().decode() == _digest(z, content):
                    return json.loads(z["memo"].tobytes())
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
            continue
    return None


def _used(spec: DatasetSpec, splits: list[str] | None) -> list[str]:
    return list(spec.splits) if splits is None else [s for s in splits if s in spec.splits]


def _first_split(spec: DatasetSpec, splits: list[str] | None) -> None:
    """The caller's first split must exist (a clear error lists those there are)."""
    if splits:
        spec.records(splits[0])

"""Per-file results remembered across runs, so that the dataset index (:mod:`ssd.data.index`) re-reads only the
files that changed since it was built.

The readers' per-file steps (an image header, an image's full decode, one annotation file) are wrapped by
:func:`remembered`. Inside ``with memo.active():`` each call looks its file up by path, a digest of its arguments
and state (size, modification and status-change times in nanoseconds, inode): a match returns the stored result (an
error is raised
again), anything else runs the step, counted in :attr:`FileMemo.reads`. Outside, the steps just run. A file modified
less than :data:`RACY_NS` before the run is never remembered: an edit within the file system's timestamp
granularity could leave its size and time unchanged (git's "racy" rule). Results are stored as JSON, never pickled.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import hashlib
import json
import multiprocessing
import operator
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from ssd.data.records import Issue, ObjectRecord

__all__ = ["FileMemo", "remembered", "map_in_processes", "unanswered", "file_state", "RACY_NS", "encode_parsed",
           "decode_parsed", "cyclic_gc_paused", "remembered_rules", "issue_rows", "issues_from", "object_rows",
           "json_digest"]

T, R = TypeVar("T"), TypeVar("R")

RACY_NS = 2_000_000_000
"""A file younger than this (nanoseconds) at the start of a run is read every time (see the module docstring)."""

_active: FileMemo | None = None  # a global, not a ContextVar: the image caches decode on thread pools
_UNSEEN = object()


def json_digest(args) -> str:
    """The arguments (JSON-able) by a digest: a YOLO label file's are the whole class list, which every key would
    repeat."""
    return hashlib.blake2b(json.dumps(args).encode(), digest_size=12).hexdigest()


_NO_ARGS = json_digest(((), []))  # the image steps' (most keys'): computed once


def file_state(path: str | os.PathLike) -> tuple[int, int, int, int] | None:
    """``(size, mtime_ns, inode, ctime_ns)`` of ``path`` (links followed), None when it cannot be stat'ed. The status
    change time is git's answer to a file rewritten in place with its size kept and its modification time restored
    (``cp -p``, ``touch -r``, ``rsync --inplace -t``): nothing can set it back."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Reading a dataset makes millions of containers, none of them garbage, and every full pass of the cyclic
    collector walks them all: paused, a large COCO file parses in a third of the time in a process that imported
    torch, and an index rebuilt from its per-file results in about three quarters."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class FileMemo:
    """Remembered results by ``kind``, path and arguments; ``entries`` as stored (:attr:`used` after a run).

    Attributes:
        used: the entries met or made in this run (what an index saves: files no longer read are forgotten); those
            made are kept as their JSON text, encoded (see :meth:`used_json`).
        reads: ``(kind, path)`` of every step that ran (a miss).
        states: the :func:`file_state` of every file looked up in this run (taken once, before its first read).
    """

    def __init__(self, entries: dict[str, list] | None = None, stable_before: int | None = None,
                 states: Iterable[tuple[str, Sequence[int]]] = ()) -> None:
        """``stable_before``: files modified at or after it (nanoseconds) are not remembered (default: :data:`RACY_NS`
        before now; the dataset index gives its run's own); ``states``: ``(path, state)`` of files stat'ed earlier in
        this run, before any read (the index's file list: not stat'ed again), a state of ``-1`` values for a file
        not to be remembered."""
        self.entries = entries or {}
        self.used: dict[str, list | bytes] = {}
        self.reads: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._stable_before = time.time_ns() - RACY_NS if stable_before is None else stable_before
        self._seen: dict[str, tuple[int, int, int, int] | None] = {}  # a forked memo's parent's states (not sent back)
        self.states: dict[str, tuple[int, int, int, int] | None] = {
            path: None if state[0] < 0 else tuple(state) for path, state in states}

    def used_json(self) -> bytes:
        """:attr:`used` as ``json.dumps(used).encode()`` would write it (new entries are kept as their JSON text),
        joined once: the largest buffer of a cold build (about 1.4 kB per VOC file), never also held as a str."""
        parts = [b"{"]
        for key, entry in self.used.items():
            encoded = entry if isinstance(entry, bytes) else json.dumps(entry).encode()
            parts += [b", " if len(parts) > 1 else b"", json.dumps(key).encode(), b": ", encoded]
        parts.append(b"}")
        return b"".join(parts)

    def forked(self) -> FileMemo:
        """A memo for a worker process: the same stored entries, run start and files stat'ed so far (never stat'ed
        again), nothing used, read or stat'ed of its own yet."""
        child = FileMemo(self.entries, self._stable_before)
        child._seen = self.states
        return child

    def absorb(self, used: dict[str, list | bytes], reads: list[tuple[str, str]],
               states: dict[str, tuple[int, int, int, int] | None]) -> None:
        """Take what a :meth:`forked` memo met, read and stat'ed (in a worker process) as this memo's own."""
        with self._lock:
            self.used.update(used)
            self.reads += reads
            for path, state in states.items():
                self.states.setdefault(path, state)  # a state taken first stays: it was read after it

    @contextmanager
    def active(self) -> Iterator[FileMemo]:
        """Make this memo the one the :func:`remembered` steps consult (restores the previous one on exit)."""
        global _active
        previous, _active = _active, self
        try:
            yield self
        finally:
            _active = previous

    def _entry(self, kind: str, path: str, args: tuple) -> tuple[str, tuple | None, list | None]:
        """``(key, state, entry)`` of a step: the file's state (stat'ed once per run) and the stored entry that
        answers for it, if any."""
        key = "\0".join((kind, path, _NO_ARGS if args == ((), []) else json_digest(args)))
        state = self.states.get(path, self._seen.get(path, _UNSEEN))
        if state is _UNSEEN:  # one stat per file and run: a state taken before reading is safe to store with the result
            state = self.states[path] = file_state(path)
        entry = self.entries.get(key)
        return key, state, entry if state is not None and entry is not None and tuple(entry[:4]) == state else None

    def lookup(self, kind: str, path: str | os.PathLike, args: tuple, compute: Callable[[], Any],
               encode: Callable[[Any], Any], decode: Callable[[Any], Any], error: type[Exception] | None,
               counted: bool = True) -> Any:
        """The step's stored result when it answers for ``path``'s state, else ``compute()`` (a read, listed in
        :attr:`reads` when ``counted``; a rule over results already read is not)."""
        path = os.fspath(path)
        key, state, entry = self._entry(kind, path, args)
        if entry is not None:
            with self._lock:
                self.used[key] = entry
            stored = entry[4]
            if isinstance(stored, dict) and "raise" in stored:
                raise error(*stored["raise"])
            return decode(stored)
        if counted:
            with self._lock:
                self.reads.append((kind, path))
        try:
            value = compute()
            stored = encode(value)
        except Exception as e:
            if error is None or not isinstance(e, error):
                raise
            value, stored = e, {"raise": [str(e), getattr(e, "code", None), getattr(e, "reason", None)]}
        if state is not None and state[1] < self._stable_before:
            text = json.dumps([*state, stored]).encode()  # at once: no long-lived lists for the garbage collector
            with self._lock:
                self.used[key] = text
        if isinstance(value, Exception):
            raise value
        return value


def remembered_rules(path: str | os.PathLike, args: Callable[[], tuple], compute: Callable[[], list[Issue]]
                     ) -> list[Issue]:
    """``compute()``'s issues, kept by the active memo (run as they are when none is) against ``path``'s state and
    ``args()``: JSON-able values that hold everything ``compute`` reads but that file (made only under a memo). The
    rules of an unchanged image are not applied again when the index is rebuilt for a change elsewhere."""
    memo = _active
    if memo is None:
        return compute()
    return memo.lookup("rules", path, args(), compute, issue_rows, issues_from, None, counted=False)


def unanswered(kind: str, paths: Sequence[str | os.PathLike]) -> int:
    """How many of ``paths`` the active memo cannot answer for the argument-less step ``kind`` (all of them with no
    memo active): the work a step over them will really do."""
    memo = _active
    if memo is None:
        return len(paths)
    return sum(memo._entry(kind, os.fspath(path), ((), []))[2] is None for path in paths)


def _in_worker(step: Callable[[T], R], chunk: T) -> tuple[R, tuple | None, list]:
    """``step(chunk)`` in a worker process of :func:`map_in_processes`, under a :meth:`~FileMemo.forked` copy of the
    memo active when the workers were forked; what that copy met, read and stat'ed and the warnings raised go back
    with the result."""
    parent = _active
    with warnings.catch_warnings(record=True) as caught:  # the filters stay the parent's: recorded, not shown here
        if parent is None:
            return step(chunk), None, _sendable(caught)
        memo = parent.forked()
        with memo.active():
            result = step(chunk)
    return result, (memo.used, memo.reads, memo.states), _sendable(caught)


def _sendable(caught: list[warnings.WarningMessage]) -> list[tuple]:
    return [(str(w.message), w.category, w.filename, w.lineno) for w in caught]


def map_in_processes(step: Callable[[T], R], chunks: Sequence[T], processes: int) -> Iterator[R]:
    """``step`` over ``chunks`` in ``processes`` forked worker processes, results in order, for per-file work that
    holds the GIL (small images: Pillow's header parsing, the rules), which threads cannot spread over cores. The
    workers inherit the active :class:`FileMemo` (forked: nothing is sent to them) and send back, with each result,
    the per-file results they met or made and the warnings they raised: the active memo absorbs the first and the
    second are raised again here, as if the steps had run here. ``step`` must be a module-level function (pickled
    by name) and must not use torch (a forked child must not start its thread pools). The workers ignore Ctrl-C
    (this process stops them). The steps run here instead on one process, off Linux (no fork on Windows; an unsafe
    one on macOS) and in a daemonic process (a ``multiprocessing`` worker, which may not start processes)."""
    if processes < 2 or not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        yield from map(step, chunks)
        return
    context = multiprocessing.get_context("fork")  # "spawn" would import torch again in every worker: seconds
    with ProcessPoolExecutor(processes, mp_context=context, initializer=signal.signal,
                             initargs=(signal.SIGINT, signal.SIG_IGN)) as pool:
        for result, made, warned in pool.map(functools.partial(_in_worker, step), chunks):
            if made is not None and _active is not None:
                _active.absorb(*made)
            for message, category, filename, line in warned:  # shown (or caught) here, as if raised here
                warnings.warn_explicit(message, category, filename, line)
            yield result


def remembered(kind: str, encode: Callable[[Any], Any] = lambda v: v, decode: Callable[[Any], Any] = lambda v: v,
               error: type[Exception] | None = None) -> Callable:
    """Decorate ``step(path, *args)`` (JSON-able ``args``) so the active :class:`FileMemo` answers for unchanged
    files. ``encode``/``decode``: the result to JSON-able data and back; ``error``: an exception type (built from
    ``(message, code, reason)``) that is remembered and raised again."""
    def wrap(step: Callable) -> Callable:
        @functools.wraps(step)
        def call(path, *args, **kwargs):
            memo = _active
            if memo is None:
                return step(path, *args, **kwargs)
            return memo.lookup(kind, path, (args, sorted(kwargs.items())), lambda: step(path, *args, **kwargs),
                               encode, decode, error)
        return call
    return wrap


_OBJECT_FIELDS = [f.name for f in dataclasses.fields(ObjectRecord)]
_ISSUE_FIELDS = [f.name for f in dataclasses.fields(Issue)]
_OBJECT_GETTER, _ISSUE_GETTER = operator.attrgetter(*_OBJECT_FIELDS), operator.attrgetter(*_ISSUE_FIELDS)


def encode_parsed(parsed: tuple[list[ObjectRecord], list[Issue]]) -> list:
    """An annotation file's ``(objects, issues)`` as JSON-able lists (paths as text)."""
    objects, issues = parsed

    def row(record: Any, fields: operator.attrgetter) -> list:  # one attrgetter call: a file's objects are many
        return [str(v) if isinstance(v, Path) else v for v in fields(record)]
    return [[row(o, _OBJECT_GETTER) for o in objects], [row(i, _ISSUE_GETTER) for i in issues]]


def issue_rows(issues: Sequence[Issue]) -> list:
    """``issues`` as JSON-able rows (see :func:`encode_parsed`)."""
    return encode_parsed(([], list(issues)))[1]


def issues_from(rows: list) -> list[Issue]:
    """The inverse of :func:`issue_rows`."""
    return decode_parsed([[], rows])[1]


def object_rows(objects: Sequence[ObjectRecord]) -> list:
    """``objects`` as JSON-able rows (see :func:`encode_parsed`)."""
    return encode_parsed((objects, []))[0]


def decode_parsed(stored: list) -> tuple[list[ObjectRecord], list[Issue]]:
    """The inverse of :func:`encode_parsed` (one ``Path`` per distinct text: a file's objects share their source,
    and parsing a path costs more than the rest of a row)."""
    objects, issues = [], []
    paths: dict[str | None, Path | None] = {None: None}
    for row in stored[0]:
        fields = dict(zip(_OBJECT_FIELDS, row))
        fields["box"] = tuple(fields["box"])
        source = fields["source"]
        fields["source"] = paths[source] if source in paths else paths.setdefault(source, Path(source))
        objects.append(ObjectRecord(**fields))
    for row in stored[1]:
        fields = dict(zip(_ISSUE_FIELDS, row))
        image = fields["image"]
        fields["image"] = paths[image] if image in paths else paths.setdefault(image, Path(image))
        issues.append(Issue(**fields))
    return objects, issues

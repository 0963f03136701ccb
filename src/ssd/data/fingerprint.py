"""The dataset index's file list: every file of a dataset with its state (size, modification and status-change times,
inode: :func:`~ssd.data.memo.file_state`), taken once per run, compared with the stored list to tell whether the
index still holds, or which files changed (:mod:`ssd.data.index_patch`)."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ssd.data.memo import file_state
from ssd.data.records import DatasetSpec
from ssd.data.table import Strings

__all__ = ["Fingerprint", "NotIndexed", "walk", "stable_state", "state_array", "EXTRA_FILES_FACTOR", "EXTRA_FILES"]

EXTRA_FILES_FACTOR, EXTRA_FILES = 4, 100_000
"""The dataset folder is walked for at most ``EXTRA_FILES_FACTOR`` times the dataset's own files plus
``EXTRA_FILES``: a folder that holds far more (a data.yaml whose ``path`` is ``/``) is not indexed."""


class Fingerprint:
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
        self.walked = {folder: (walked or {}).get(folder) or walk(Path(folder), len(own), since_ns, known)
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

    def same(self, paths: Strings, states: np.ndarray | None) -> bool:
        """Whether ``paths`` (and their ``states``, unless None: the list alone) are these."""
        packed = self.packed
        return ((states is None or np.array_equal(states, self.states))
                and np.array_equal(paths.offsets, packed.offsets) and paths.prefix == packed.prefix
                and np.array_equal(paths.blob, packed.blob))


class NotIndexed(Exception):
    """Why this dataset is read without an index (said once)."""


def walk(root: Path, own: int, since_ns: int, known: dict | None = None) -> dict[str, tuple[int, int, int, int]]:
    """The states of the files under ``root`` (a dataset of ``own`` files), by path (``known``: see
    :class:`Fingerprint`)."""
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
            raise NotIndexed(f"{root} holds more than {bound:,} files, most of them not the dataset's")
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

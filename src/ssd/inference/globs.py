"""Glob patterns of ``ssd predict`` sources, expanded with bounds.

:func:`expand_glob` matches like ``glob.glob(pattern, recursive=True)`` (``*``, ``?``, ``[...]`` within one name,
``**`` for any number of folders, hidden names only for a part that starts with a dot), but each ``**`` enters a
folder once, however many links lead to it: a folder that links to itself (or two that link to each other) is
followed once, where ``glob`` would list about ``2**40`` paths for two self-links. More than
:data:`ssd.limits.MAX_GLOB_PATHS` matches is an error, raised as soon as the bound is passed.
"""

from __future__ import annotations

import collections
import fnmatch
import glob
import os
from collections.abc import Iterator
from pathlib import Path

from ssd.errors import GlobLimitError
from ssd.limits import MAX_GLOB_PATHS

__all__ = ["expand_glob"]


def expand_glob(pattern: str, limit: int = MAX_GLOB_PATHS) -> list[Path]:
    """The paths ``pattern`` matches (files and folders, in no particular order), each folder entered once per ``**``.

    Raises:
        GlobLimitError: more than ``limit`` matches, naming the pattern and the bound.
    """
    parts = Path(pattern).parts
    first = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
    found: list[Path] = []

    def add(path: Path) -> None:
        found.append(path)
        if len(found) > limit:
            raise GlobLimitError(f"glob {pattern} matches more than {limit:,} paths (ssd.limits.MAX_GLOB_PATHS): "
                                 "give a narrower pattern, or a folder")

    def match(directory: Path, rest: tuple[str, ...]) -> None:
        part, rest = rest[0], rest[1:]
        if part == "**":
            for folder in _folders_once(directory):
                if rest:
                    match(folder, rest)
                else:
                    for entry in _entries(folder, "*"):
                        add(folder / entry.name)
        elif glob.has_magic(part):
            for entry in _entries(directory, part):
                if not rest:
                    add(directory / entry.name)
                elif _is_dir(entry):
                    match(directory / entry.name, rest)
        elif not rest:
            if os.path.lexists(directory / part):
                add(directory / part)
        elif (directory / part).is_dir():
            match(directory / part, rest)

    base = Path(*parts[:first]) if first else Path()
    if first == len(parts):
        return [base] if os.path.lexists(base) else []
    match(base, parts[first:])
    return found


def _entries(directory: Path, part: str) -> Iterator[os.DirEntry]:
    """The entries of ``directory`` whose names match ``part`` (hidden ones only for a part starting with a dot)."""
    try:
        with os.scandir(directory) as entries:
            listed = list(entries)
    except OSError:  # unreadable, or gone: glob skips it too
        return
    hidden = part.startswith(".")
    for entry in listed:
        if (hidden or not entry.name.startswith(".")) and fnmatch.fnmatchcase(entry.name, part):
            yield entry


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # a link to a folder counts, as for glob
    except OSError:
        return False


def _folders_once(top: Path) -> Iterator[Path]:
    """``top`` and every folder below it (links to folders followed), each real folder once: breadth first, names
    sorted, so a folder is reached by its shortest path (a link deeper down to a folder already seen is not entered)."""
    seen: set[tuple[int, int]] = set()
    queue = collections.deque([top])
    while queue:
        folder = queue.popleft()
        try:
            info = folder.stat()
        except OSError:
            continue
        if (info.st_dev, info.st_ino) in seen:
            continue
        seen.add((info.st_dev, info.st_ino))
        yield folder
        queue.extend(sorted(folder / e.name for e in _entries(folder, "*") if _is_dir(e)))

"""Where a dataset command writes: the output folder's checks, a staging folder renamed into place at the end (a
dataset is written whole or not at all), unique image names, and images linked or copied, never moved."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ssd.errors import DataError, OutputError
from ssd.files import check_output, fitted_name
from ssd.text import few

__all__ = ["IMAGE_MODES", "check_dataset_output", "staged", "UniqueNames", "image_placer",
           "missing_images"]

IMAGE_MODES = ("link", "copy", "none")
"""``link``: a hard link (a symbolic link across file systems); ``copy``; ``none``: annotation files only."""


def check_dataset_output(out: str | os.PathLike, inputs: Iterable[str | os.PathLike], what: str = "OUT") -> Path:
    """Refuse an output folder that exists and is not empty, or that is an input folder, lies inside one or holds
    one (its files would be read and written at once); before anything is written."""
    out = Path(out)
    check_output(out, inputs=list(inputs), kind="dir", what=what)
    resolved = out.resolve()
    for given in inputs:
        root = Path(given).resolve()
        root = root if root.is_dir() else root.parent
        if resolved == root or root in resolved.parents or resolved in root.parents:
            where = ("the input folder" if resolved == root else "inside the input folder"
                     if root in resolved.parents else "a folder above the input")
            raise OutputError(f"{what} {out} is {where} {given}: write a dataset to a new folder outside its inputs")
    if out.is_dir() and any(out.iterdir()):
        raise OutputError(f"{what} {out} exists and is not empty: name a new folder (a dataset is never written "
                          "over another)")
    return out


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A new folder beside ``out`` to write into, renamed to ``out`` when the block ends without error (removed when
    it fails): a reader never sees half a dataset."""
    stage = out.with_name(f".{fitted_name(out.name, limit=200)}.{secrets.token_hex(4)}.ssdtmp")
    stage.mkdir(parents=True)
    try:
        yield stage
        if out.is_dir():  # checked empty before the work: a folder made meanwhile is not replaced when it has files
            out.rmdir()
        os.rename(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


class UniqueNames:
    """An output file name per image, given as the images come: its own name, unless its stem is taken (two splits
    or folders with ``a.jpg``), then ``<stem>_2`` ... (VOC's Annotations/ and YOLO's labels/ pair files by stem).
    Without ``spaces``, white space becomes ``_`` (VOC's ImageSets lists are split at white space). With
    ``repeats`` (a dataset of several splits, where one image may be in two: VOC's trainval), an image met again
    keeps its name. Holds the taken stems (and with ``repeats`` each image's name): a few dozen bytes an image."""

    def __init__(self, spaces: bool = True, repeats: bool = True) -> None:
        self.spaces, self.taken = spaces, set()
        self.given: dict[str, str] | None = {} if repeats else None

    def __call__(self, path: Path) -> str:
        if self.given is not None and (known := self.given.get(str(path))) is not None:
            return known
        stem, suffix, n = path.stem, path.suffix, 1
        stem = stem if self.spaces else re.sub(r"\s", "_", stem)
        name = fitted_name(stem, suffix)
        while Path(name).stem.casefold() in self.taken:  # case-insensitive: the output may go to such a file system
            n += 1
            name = fitted_name(f"{stem}_{n}", suffix)
        self.taken.add(Path(name).stem.casefold())
        if self.given is not None:
            self.given[str(path)] = name
        return name


def missing_images(paths: Iterable[Path]) -> None:
    """Refuse, listing them, images that are not files (before anything is written)."""
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} image(s) not found: {few(missing)}")


def image_placer(mode: str) -> Callable[[Path, Path], None]:
    """``place(source, destination)`` for images written in ``mode``: hard-linked (a symbolic link to the absolute
    source when the two lie on different file systems), or copied; nothing for ``none``. An image already placed
    (one image in two splits) is placed once. Sources are never moved or changed."""
    if mode not in IMAGE_MODES:
        raise DataError(f"--images {mode!r}: choose one of {', '.join(IMAGE_MODES)}")
    made: set[Path] = set()  # the folders made: a few per dataset

    def place(source: Path, dest: Path) -> None:
        if mode == "none" or os.path.lexists(dest):
            return
        if dest.parent not in made:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.add(dest.parent)
        if mode == "copy":
            shutil.copyfile(source, dest)
            return
        try:
            os.link(source, dest)
        except OSError:  # another file system, or links not allowed there
            os.symlink(source.resolve(), dest)
    return place

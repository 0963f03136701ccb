"""Where a dataset command writes: the output folder's checks, a staging folder renamed into place at the end (a
dataset is written whole or not at all), unique image names, and images linked or copied, never moved."""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from ssd.data.records import ImageRecord
from ssd.errors import DataError, OutputError
from ssd.files import check_output, fitted_name
from ssd.text import few

__all__ = ["IMAGE_MODES", "check_dataset_output", "staged", "unique_names", "place_images", "missing_images"]

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


def unique_names(records: Iterable[ImageRecord], spaces: bool = True) -> list[str]:
    """An output file name per image: its own name, unless its stem is taken (two splits or folders with ``a.jpg``),
    then ``<stem>_2`` ... (VOC's Annotations/ and YOLO's labels/ pair files by stem); an image listed twice keeps
    one name. Without ``spaces``, white
    space becomes ``_`` (VOC's ImageSets lists are split at white space)."""
    taken: set[str] = set()
    names = []
    given: dict[Path, str] = {}
    for record in records:
        if record.path in given:  # one image in two splits (VOC's trainval): one name
            names.append(given[record.path])
            continue
        stem, suffix, n = record.path.stem, record.path.suffix, 1
        stem = stem if spaces else re.sub(r"\s", "_", stem)
        name = fitted_name(stem, suffix)
        while Path(name).stem.casefold() in taken:  # case-insensitive: the output may go to such a file system
            n += 1
            name = fitted_name(f"{stem}_{n}", suffix)
        taken.add(Path(name).stem.casefold())
        names.append(name)
        given[record.path] = name
    return names


def missing_images(records: Iterable[ImageRecord]) -> None:
    """Refuse, listing them, images that are not files (before anything is written)."""
    missing = [str(r.path) for r in records if not r.path.is_file()]
    if missing:
        raise DataError(f"{len(missing)} image(s) not found: {few(missing)}")


def place_images(pairs: Iterable[tuple[Path, Path]], mode: str) -> None:
    """Each ``(source, destination)``: hard-linked (a symbolic link to the absolute source when the two lie on
    different file systems), or copied; nothing for ``none``. Sources are never moved or changed."""
    if mode not in IMAGE_MODES:
        raise DataError(f"--images {mode!r}: choose one of {', '.join(IMAGE_MODES)}")
    if mode == "none":
        return
    made: set[Path] = set()
    for dest, source in {dest: source for source, dest in pairs}.items():  # an image in two splits: placed once
        if dest.parent not in made:
            dest.parent.mkdir(parents=True, exist_ok=True)
            made.add(dest.parent)
        if mode == "copy":
            shutil.copyfile(source, dest)
            continue
        try:
            os.link(source, dest)
        except OSError:  # another file system, or links not allowed there
            os.symlink(source.resolve(), dest)

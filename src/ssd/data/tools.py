"""The layouts of annotation tools' exports: which tool's export a folder holds (LabelMe files, a Label Studio
JSON, a CVAT ``annotations.xml``), and a folder whose split folders (``train/``, ``val/``, ``test/``) each hold one,
read as one dataset with those splits.

Told apart by their first bytes (:func:`ssd.data.shapes.peek`), never by parsing a whole file: a Label Studio export
is a JSON list of tasks (objects with ``data``, ``annotations`` or ``predictions``), a LabelMe file a JSON object
with ``shapes``, a CVAT file XML whose root is ``<annotations>``. A folder with several Label Studio or CVAT files
takes one split per file, named as COCO files are (:func:`ssd.data.coco.split_name`); a split folder holds one.

A data YAML may name export files as its splits (``train: train.json``, relative to the YAML's folder), with
``images:`` the folder where their images are looked up by file name, and ``names:`` the class list (else
``classes.txt``, else the sorted names read).
"""

from __future__ import annotations

import os
from pathlib import Path

from ssd.data.coco import split_name
from ssd.data.cvat import is_cvat, read_cvat_split
from ssd.data.labelme import is_labelme, read_labelme_split
from ssd.data.labelstudio import read_labelstudio_split
from ssd.data.records import DatasetSpec, ImageRecord, Issue
from ssd.data.shapes import peek, tool_dataset
from ssd.data.yolo import parse_names
from ssd.errors import DataError
from ssd.limits import value_text
from ssd.text import few

__all__ = ["TOOL_FORMATS", "tool_format", "tool_splits", "read_tools", "read_tool_file", "read_tool_yaml"]

TOOL_FORMATS = ("labelme", "labelstudio", "cvat")
"""The tools' formats: class names come from ``classes.txt``, else the annotations (as VOC's)."""
_ALIASES = {"valid": "val", "validation": "val"}
_YAML_SPLITS = {"train": "train", "val": "val", "valid": "val", "test": "test"}
_SPLIT_READERS = {"labelstudio": read_labelstudio_split, "cvat": read_cvat_split}
"""The formats of one file per split, and their readers ``(file, root, split, issues, image folder) -> (records, the
class names the file declares or None)``."""


def _file_format(path: Path) -> str | None:
    """The tool whose export file ``path`` is, by its first bytes (None: another file)."""
    if path.suffix.lower() == ".xml":
        return "cvat" if is_cvat(peek(path)) else None
    if path.suffix.lower() != ".json":
        return None
    head = peek(path)
    tasks = head.startswith("[") and any(f'"{key}"' in head for key in ("data", "annotations", "predictions"))
    return "labelstudio" if tasks else "labelme" if is_labelme(head) else None  # a list of COCO results is neither


def _export(folder: Path) -> tuple[str, list[Path]] | None:
    """``(format, its files)`` of the export directly in ``folder`` (LabelMe: the folder itself), else None."""
    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in (".json", ".xml") and p.is_file())
    jsons = [p for p in files if p.suffix.lower() == ".json"]
    xmls = [p for p in files if p.suffix.lower() == ".xml"]
    xml = [folder / "annotations.xml"] if folder / "annotations.xml" in xmls else xmls[:1]  # one, not every VOC file
    for path in jsons + xml:
        fmt = _file_format(path)
        if fmt == "labelme":
            return fmt, [folder]
        if fmt is not None:
            return fmt, [p for p in (jsons if fmt == "labelstudio" else xmls) if _file_format(p) == fmt]
    return None


def tool_format(folder: Path) -> str | None:
    """The tool whose export ``folder`` holds (its own files, not its subfolders'), else None."""
    found = _export(folder)
    return None if found is None else found[0]


def tool_splits(folder: Path, split_dirs: tuple[str, ...]) -> dict[str, Path]:
    """The split folders of ``folder`` (``split_dirs``; valid and validation are val) that hold a tool's export."""
    return {_ALIASES.get(p.name, p.name): p for p in sorted(folder.iterdir())
            if p.is_dir() and p.name in split_dirs and tool_format(p) is not None}


def _files_by_split(split: str, part: Path, files: list[Path], top: bool) -> dict[str, Path]:
    """The split of each export file: ``split`` for the one file of a folder; by file name for several in the
    dataset folder itself; several in a split folder are refused (which one is the split?)."""
    if len(files) == 1:
        return {split: files[0]}
    if not top:
        raise DataError(f"{part}: {len(files)} exports in one split folder ({few([f.name for f in files])}): keep "
                        "one, or move the others to split folders of their own")
    by_split: dict[str, Path] = {}
    for path in files:
        taken = by_split.setdefault(split_name(path), path)
        if taken != path:
            raise DataError(f"{taken.name} and {path.name} in {part} are both split {split_name(path)!r} (split "
                            "names are whole words of the file name: train, val, valid, validation, test; others "
                            "count as train): rename one, or give one as --data")
    return by_split


def _declared_names(declared: dict[Path, list[str] | None]) -> list[str] | None:
    """The class names the export files declare (CVAT's labels); files that declare different lists are refused."""
    lists = {path: names for path, names in declared.items() if names is not None}
    first = next(iter(lists.items()), None)
    for path, names in lists.items():
        if names != first[1]:
            raise DataError(f"{first[0]} and {path} declare different labels: {first[1]} vs {names} (the splits of "
                            "one dataset share one class list)")
    return None if first is None else first[1]


def read_tools(folder: Path, parts: dict[str, Path]) -> DatasetSpec:
    """The splits ``parts`` (split name -> the folder holding its export; the dataset's own folder for a dataset
    without split folders) as one dataset: class names from a ``classes.txt`` in ``folder``, else the sorted names of
    all splits' objects."""
    issues: list[Issue] = []
    splits: dict[str, list[ImageRecord]] = {}
    sources: dict[str, Path] = {}
    formats = set()
    declared: dict[Path, list[str] | None] = {}
    for split, part in parts.items():
        fmt, files = _export(part) or ("", [])
        formats.add(fmt)
        if fmt == "labelme":
            splits[split] = read_labelme_split(part, folder, split, issues)
            continue
        for name, path in _files_by_split(split, part, files, part == folder).items():
            splits[name], declared[path] = _SPLIT_READERS[fmt](path, folder, name, issues)
            sources[name] = path
    spec = tool_dataset(folder, "+".join(sorted(formats)), splits, issues, names=_declared_names(declared))
    spec.sources = sources
    return spec


def read_tool_file(path: Path) -> DatasetSpec | None:
    """The dataset of one export file (a split ``train``, or the split its name says), None for other files."""
    fmt = _file_format(path)
    if fmt == "labelme":
        raise DataError(f"{path} is one LabelMe file: give the folder that holds the LabelMe files (--data "
                        f"{path.parent})")
    if fmt is None:
        return None
    issues: list[Issue] = []
    split = split_name(path)
    records, names = _SPLIT_READERS[fmt](path, path.parent, split, issues)
    spec = tool_dataset(path.parent, fmt, {split: records}, issues, names=names)
    spec.sources = {split: path}
    return spec


def _yaml_folder(desc: dict, key: str, root: Path, yaml_path: Path) -> Path | None:
    value = desc.get(key)
    if value is None:
        return None
    folder = Path(os.path.abspath(root / value)) if isinstance(value, str) and value else None
    if folder is None or not folder.is_dir():
        raise DataError(f"{yaml_path}: {key!r} is {value_text(value)}, not a folder that exists (relative to the "
                        "YAML's folder)")
    return folder


def read_tool_yaml(desc, yaml_path: Path) -> DatasetSpec | None:
    """The dataset of a data YAML whose splits name tools' export files (see the module docstring); None for a YAML
    whose splits are something else (a YOLO data.yaml)."""
    entries = {split: desc[key] for key, split in _YAML_SPLITS.items() if isinstance(desc, dict) and desc.get(key)}
    if not entries or not all(isinstance(e, str) and Path(e).suffix.lower() in (".json", ".xml")
                              for e in entries.values()):
        return None
    root = yaml_path.parent
    image_root = _yaml_folder(desc, "images", root, yaml_path)
    issues: list[Issue] = []
    splits: dict[str, list[ImageRecord]] = {}
    sources: dict[str, Path] = {}
    formats = set()
    declared: dict[Path, list[str] | None] = {}
    for split, entry in entries.items():
        path = Path(os.path.abspath(root / entry))
        fmt = _file_format(path) if path.is_file() else None
        if fmt not in _SPLIT_READERS:
            raise DataError(f"{yaml_path}: split {split!r} names {path}, which is not a Label Studio JSON export or "
                            f"a CVAT XML file{'' if path.is_file() else ' (it does not exist)'}")
        formats.add(fmt)
        splits[split], declared[path] = _SPLIT_READERS[fmt](path, root, split, issues, image_root)
        sources[split] = path
    names = parse_names(desc["names"], yaml_path) if "names" in desc else _declared_names(declared)
    spec = tool_dataset(root, "+".join(sorted(formats)), splits, issues, names=names)
    spec.sources, spec.watched = sources, [image_root] if image_root else []
    return spec

"""Reading a data description: ``load_dataset`` (any layout -> :class:`DatasetSpec`), and ``validation_split`` (the
records a run trains and validates on). The gate that applies the ``ssd check`` rules is :mod:`ssd.data.gate`.

Detection for a folder, in order: a VOC ``Annotations/`` folder (itself, a child, or ``VOCdevkit/<child>``); a YAML
with ``names`` (YOLO); ``images/`` + ``labels/`` folders (YOLO, also per split); COCO JSON files (``annotations/*.json``
or ``*.json``, one split each); XML files beside images (flat VOC: in the folder, in its split folders, or in split
folders deeper down such as ``<a>/train`` + ``<b>/test``). A YOLO split whose images have no ``.txt`` labels but VOC
XML files beside them (a "Pascal VOC" export described by a ``data.yaml``) is read from the XML, with the YAML's names.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from ssd.data.coco import read_coco, split_name
from ssd.data.records import DatasetSpec, ImageRecord, relative_path
from ssd.data.table import select
from ssd.data.tools import TOOL_FORMATS, read_tool_file, read_tool_yaml, read_tools, tool_format, tool_splits
from ssd.data.voc import assign_labels, find_voc_root, parse_voc_xml, read_voc
from ssd.data.yolo import read_description, read_yolo_folder, read_yolo_yaml
from ssd.errors import DataError
from ssd.log import LOGGER
from ssd.names import closest_names
from ssd.text import few

__all__ = ["load_dataset", "validation_split"]

_SPLIT_DIRS = ("train", "val", "valid", "validation", "test")
"""Folder names the flat VOC reader and the annotation tools' layouts take as splits."""


def _read_file(path: Path, lazy: bool = False) -> DatasetSpec:
    """A ``data.yaml``, a COCO JSON or a tool's export file; ``spec.sources`` names the file for each split."""
    if path.suffix in (".yaml", ".yml"):
        desc = read_description(path)
        if (tool := read_tool_yaml(desc, path)) is not None:
            return tool
        spec = read_yolo_yaml(path, desc, lazy=lazy)
    elif (tool := read_tool_file(path)) is not None:
        return tool
    elif path.suffix == ".json":
        spec = read_coco(path)
    else:
        raise DataError(f"{path}: unsupported data file (expected .yaml/.yml, .json or a folder)")
    spec.sources = dict.fromkeys(spec.splits, path)
    return spec


def _read_coco_files(folder: Path, jsons: list[Path]) -> DatasetSpec:
    """One split per COCO JSON (see :func:`ssd.data.coco.split_name`); their categories must agree, and two files
    for one split are refused (neither may silently replace the other)."""
    by_split: dict[str, Path] = {}
    for path in jsons:
        taken = by_split.setdefault(split_name(path), path)
        if taken != path:
            raise DataError(f"COCO files {taken.name} and {path.name} in {taken.parent} are both split "
                            f"{split_name(path)!r} (split names are whole words of the file name: train, val, valid, "
                            "validation, test; others count as train): merge them, rename one, or give one as --data")
    specs = [_read_file(j) for j in jsons]
    first = specs[0]
    for other in specs[1:]:
        if other.class_names != first.class_names:
            raise DataError(f"COCO files in {folder} disagree on categories: {first.class_names} vs "
                            f"{other.class_names}")
        first.splits.update(other.splits)
        first.sources.update(other.sources)
        first.issues += other.issues
        first.watched += other.watched
    first.root = folder
    return first


def _read_xml_folders(folder: Path) -> DatasetSpec:
    """VOC XML beside images: in ``folder`` or its split folders (:func:`read_voc`), else in split folders deeper
    down (``<a>/train``, ``<b>/test``): each parent is read and the splits merged (names: the sorted union, unless
    the parts agree, e.g. from their ``classes.txt``). XML elsewhere only is refused, never read as 0 classes."""
    xml_dirs = sorted({p.parent for p in folder.rglob("*") if p.suffix.lower() == ".xml"})
    if any(d == folder or (d.parent == folder and d.name in _SPLIT_DIRS) for d in xml_dirs):
        return read_voc(folder)
    parents = sorted({d.parent for d in xml_dirs if d.name in _SPLIT_DIRS})
    if not parents:
        shown = few([str(d.relative_to(folder)) for d in xml_dirs])
        raise DataError(f"{folder}: XML files found only in {shown}, none of them a split folder "
                        f"({', '.join(_SPLIT_DIRS)}) or the folder itself; give the folder that holds the images "
                        "and their XML files")
    parts = [read_voc(p) for p in parents]
    names = parts[0].class_names
    if any(p.class_names != names for p in parts):
        names = sorted({n for p in parts for n in p.class_names})
    splits: dict = {}
    for part in parts:
        for split, records in part.splits.items():
            splits.setdefault(split, []).extend(records)
    assign_labels([r for records in splits.values() for r in records], names)
    return DatasetSpec(folder, "voc", names, splits, [i for p in parts for i in p.issues])


def _detect(folder: Path, lazy: bool = False) -> DatasetSpec:
    if find_voc_root(folder) is not None:
        return read_voc(folder)
    yamls = [p for p in sorted(folder.glob("*.y*ml")) if p.suffix in (".yaml", ".yml")]
    if yamls:
        return _read_file(next((p for p in yamls if p.stem == "data"), yamls[0]), lazy)
    if any((p / "images").is_dir() and (p / "labels").is_dir() for p in [folder, *folder.iterdir()]):
        return read_yolo_folder(folder)
    if tool_format(folder) is not None:
        return read_tools(folder, {"train": folder})
    if parts := tool_splits(folder, _SPLIT_DIRS):
        return read_tools(folder, parts)
    jsons = sorted((folder / "annotations").glob("*.json")) or sorted(folder.glob("*.json"))
    if jsons:
        return _read_coco_files(folder, jsons)
    if any(p.suffix.lower() == ".xml" for p in folder.rglob("*")):  # a.XML too
        return _read_xml_folders(folder)
    raise DataError(f"{folder}: no dataset format recognised (expected VOC Annotations/ + JPEGImages/, a YOLO "
                    "data.yaml or images/ + labels/, a COCO JSON, LabelMe JSON files, a CVAT annotations.xml or a "
                    "Label Studio JSON export; or train/ and val/ folders each holding one of those)")


def _read_xml_beside_images(spec: DatasetSpec, lazy: bool) -> None:
    """YOLO splits where no image has a ``.txt`` label but some have a VOC XML file beside them: read the XML. A
    ``lazy`` split stays an iterator: its records are held only until one has a label file (the first, mostly)."""
    for split, records in spec.splits.items():
        if lazy:
            spec.splits[split] = _xml_when_unlabelled(spec, split, records)
        else:
            _xml_split(spec, split, records)


def _xml_when_unlabelled(spec: DatasetSpec, split: str, records: Iterable[ImageRecord]) -> Iterator[ImageRecord]:
    """A lazy split's records, passed on from the first with a label file; a split without any is held whole and
    given :func:`_xml_split` (whose rule needs them all)."""
    held: list[ImageRecord] | None = []
    for record in records:
        if held is None:
            yield record
            continue
        held.append(record)
        if record.annotation is not None:
            yield from held
            held = None
    if held is not None:
        _xml_split(spec, split, held)
        yield from held


def _xml_split(spec: DatasetSpec, split: str, records: list[ImageRecord]) -> None:
    """:func:`_read_xml_beside_images` for one split's records."""
    xmls = {r.path: r.path.with_suffix(".xml") for r in records}
    if any(r.annotation is not None for r in records) or not any(x.is_file() for x in xmls.values()):
        return
    read = {path for path, xml in xmls.items() if xml.is_file()}
    spec.issues[:] = [i for i in spec.issues if not (i.code == "missing_label_file" and i.image in read)]
    for rec in records:
        if rec.path in read:
            rec.annotation = xmls[rec.path]
            rec.objects, found = parse_voc_xml(rec.annotation, relative_path(rec.annotation, spec.root))
            for issue in found:
                issue.split, issue.image = split, rec.path
            spec.issues += found
    assign_labels(records, spec.class_names)


def _no_classes(spec: DatasetSpec) -> str:
    source = next(iter(spec.sources.values()), spec.root)
    if spec.format == "coco":
        return f"{source}: 'categories' is empty: list the object classes (each with an 'id' and a 'name')"
    images = sum(len(r) for r in spec.splits.values())
    unread = [i.message for i in spec.issues if i.code == "parse_error"]
    why = f"; {len(unread)} annotation problem(s) found, the first: {unread[0]}" if unread else ""
    return (f"{spec.root}: no class names: no classes.txt, and no object in the annotations of the {images} "
            f"image(s) read ({spec.format}){why}")


def _apply_class_names(spec: DatasetSpec, class_names: list[str], declared: bool) -> None:
    """Use the caller's class list: it must equal the dataset's declared names; VOC names are relabelled."""
    class_names = list(class_names)
    if class_names == spec.class_names:
        return
    if declared:
        raise DataError(
            f"the class names given ({len(class_names)}): {class_names} disagree with the dataset's "
            f"({len(spec.class_names)}): {spec.class_names}; class names come from the dataset, give none or the "
            "same list")
    unknown = sorted(set(spec.class_names) - set(class_names))
    if unknown:
        hints = "; ".join(f"{u!r} (closest: {', '.join(map(repr, closest_names(u, class_names))) or 'none'})"
                          for u in unknown)
        raise DataError(f"the class names given: {class_names} do not cover the names in the annotations: "
                        f"{spec.class_names}; unknown: {hints}")
    spec.class_names = class_names
    assign_labels([r for recs in spec.splits.values() for r in recs], class_names)


def load_dataset(data: str | Path, split: str | None = None, class_names: list[str] | None = None,
                 lazy: bool = False) -> DatasetSpec:
    """Read a dataset: a YOLO ``data.yaml``, a dataset folder (format detected) or a COCO JSON.

    Args:
        data: the data description.
        split: keep only this split (error listing the available ones when absent).
        class_names: optional; must agree with the dataset's names (an error lists both). For VOC without a
            ``classes.txt``, it may reorder/extend the names found in the annotations (which fixes label order).
        lazy: the splits of a YOLO ``data.yaml`` as iterators that read each image as it is reached (once, in
            order; their issues appended to ``spec.issues`` meanwhile): what ``ssd data convert`` writes record by
            record. Other formats are read whole as always (a COCO table is compact; VOC and the tools' files are
            lists).

    Raises :class:`DataError` for a description that cannot be read, and for a dataset without class names.
    Per-file defects do not raise here; they are kept in the records / ``spec.issues`` for
    :func:`ssd.data.check.check_dataset`.
    """
    path = Path(data).expanduser()
    if not path.exists():
        raise DataError(f"dataset {path} does not exist (give a data.yaml, a dataset folder or a COCO JSON)")
    spec = _detect(path, lazy) if path.is_dir() else _read_file(path, lazy)
    if spec.format == "yolo":
        _read_xml_beside_images(spec, lazy)
    if not spec.class_names:
        raise DataError(_no_classes(spec))
    if class_names is not None:
        from_objects = set(spec.format.split("+")) <= {"voc", *TOOL_FORMATS}
        declared = not from_objects or (Path(spec.root) / "classes.txt").is_file() or any(
            (p / "classes.txt").is_file() for p in Path(spec.root).iterdir() if p.is_dir())
        _apply_class_names(spec, class_names, declared)
    if split is not None:
        spec.splits = {split: spec.records(split)}
        spec.issues = [i for i in spec.issues if i.split in (None, split)]
    return spec


def validation_split(spec: DatasetSpec, val_fraction: float | None = None, seed: int = 0
                     ) -> tuple[Sequence[ImageRecord], Sequence[ImageRecord]]:
    """``(training, validation)`` records: the ``val`` split (else ``test``), or with ``val_fraction`` a seeded share
    of ``train`` held out (reported on the ``ssd`` logger). A run never scores on its own training images.

    Raises:
        DataError: no split to validate on and no ``val_fraction`` (the message names both fixes), a
            ``val_fraction`` for data that has a validation split, or one that leaves either part empty.
    """
    train = spec.records("train")
    named = next((s for s in ("val", "test") if s in spec.splits), None)
    if val_fraction is None:
        if named is None:
            raise DataError(f"dataset {spec.root} has no validation split, and training never scores on its own "
                            "training images: name one (data.yaml `val: images/val`, a val folder or COCO file) or "
                            "hold out part of train with --val-fraction 0.1")
        return train, spec.records(named)
    if named is not None:
        raise DataError(f"--val-fraction {val_fraction} is for data without a validation split, but {spec.root} has "
                        f"{named!r}: drop --val-fraction or the split")
    held = round(len(train) * val_fraction)
    if not 1 <= held < len(train):
        raise DataError(f"--val-fraction {val_fraction} of {len(train)} training images holds out {held}: it must "
                        "leave at least one image on each side")
    chosen = set(random.Random(seed).sample(range(len(train)), held))
    LOGGER.info(f"validation: {held} of {len(train)} training images held out (--val-fraction {val_fraction}, "
                f"seed {seed}); training on the other {len(train) - held}")
    return select(train, [i for i in range(len(train)) if i not in chosen]), select(train, sorted(chosen))

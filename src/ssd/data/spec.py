"""``load_dataset``: one data description (YAML, dataset folder, COCO JSON) -> :class:`DatasetSpec`.

Detection for a folder, in order: a VOC ``Annotations/`` folder (itself, a child, or ``VOCdevkit/<child>``); a YAML
with ``names`` (YOLO); ``images/`` + ``labels/`` folders (YOLO, also per split); COCO JSON files (``annotations/*.json``
or ``*.json``, one split each); XML files beside images (flat VOC).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from ssd.data.coco import read_coco
from ssd.data.records import DataError, DatasetSpec
from ssd.data.voc import assign_labels, find_voc_root, read_voc
from ssd.data.yolo import read_yolo_folder, read_yolo_yaml

__all__ = ["load_dataset", "closest_names"]


def closest_names(name: str, known: list[str], n: int = 3) -> list[str]:
    """Known names closest to ``name`` (difflib; case-insensitive matches first)."""
    same_case = [k for k in known if k.lower() == name.lower() and k != name]
    return (same_case + [k for k in difflib.get_close_matches(name, known, n=n, cutoff=0.5) if k not in same_case])[:n]


def _detect(folder: Path) -> DatasetSpec:
    if find_voc_root(folder) is not None:
        return read_voc(folder)
    yamls = [p for p in sorted(folder.glob("*.y*ml")) if p.suffix in (".yaml", ".yml")]
    if yamls:
        return read_yolo_yaml(next((p for p in yamls if p.stem == "data"), yamls[0]))
    if any((p / "images").is_dir() and (p / "labels").is_dir() for p in [folder, *folder.iterdir()]):
        return read_yolo_folder(folder)
    jsons = sorted((folder / "annotations").glob("*.json")) or sorted(folder.glob("*.json"))
    if jsons:
        specs = [read_coco(j) for j in jsons]
        first = specs[0]
        for other in specs[1:]:
            if other.class_names != first.class_names:
                raise DataError(f"COCO files in {folder} disagree on categories: {first.class_names} vs "
                                f"{other.class_names}")
            first.splits.update(other.splits)
            first.issues += other.issues
        first.root = folder
        return first
    if any(folder.rglob("*.xml")):
        return read_voc(folder)
    raise DataError(f"{folder}: no dataset format recognised (expected VOC Annotations/ + JPEGImages/, a YOLO "
                    "data.yaml or images/ + labels/, or a COCO JSON)")


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


def load_dataset(data: str | Path, split: str | None = None, class_names: list[str] | None = None) -> DatasetSpec:
    """Read a dataset: a YOLO ``data.yaml``, a dataset folder (format detected) or a COCO JSON.

    Args:
        data: the data description.
        split: keep only this split (error listing the available ones when absent).
        class_names: optional; must agree with the dataset's names (an error lists both). For VOC without a
            ``classes.txt``, it may reorder/extend the names found in the annotations (which fixes label order).

    Per-file defects do not raise here; they are kept in the records / ``spec.issues`` for :func:`ssd.data.check`.
    """
    path = Path(data).expanduser()
    if not path.exists():
        raise DataError(f"dataset {path} does not exist (give a data.yaml, a dataset folder or a COCO JSON)")
    if path.is_dir():
        spec = _detect(path)
    elif path.suffix in (".yaml", ".yml"):
        spec = read_yolo_yaml(path)
    elif path.suffix == ".json":
        spec = read_coco(path)
    else:
        raise DataError(f"{path}: unsupported data file (expected .yaml/.yml, .json or a folder)")
    if class_names is not None:
        declared = spec.format != "voc" or (Path(spec.root) / "classes.txt").is_file() or any(
            (p / "classes.txt").is_file() for p in Path(spec.root).iterdir() if p.is_dir())
        _apply_class_names(spec, class_names, declared)
    if split is not None:
        spec.splits = {split: spec.records(split)}
        spec.issues = [i for i in spec.issues if i.split in (None, split)]
    return spec

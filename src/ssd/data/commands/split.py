"""``ssd data split``: every image of a dataset dealt into train / val / test, stratified by class by iterative
stratification (Sechidis et al., 2011: the rarest class first, each of its images to the split that still lacks most
of that class), so a rare class lands in every split in its share even when images hold several classes.

Written as list files over the source's own files (a YOLO ``data.yaml`` with image lists; VOC ``ImageSets/Main``
beside links to its ``JPEGImages`` and ``Annotations``), or as a new dataset in any format."""

from __future__ import annotations

import json
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from ssd.data.commands.convert import usable_records, write_dataset
from ssd.data.commands.output import check_dataset_output, staged
from ssd.data.load import load_dataset
from ssd.data.records import DatasetSpec, ImageRecord
from ssd.errors import DataError

__all__ = ["stratified_split", "split_dataset", "SplitSummary"]


def stratified_split(labels: Sequence[set[int]], shares: dict[str, float], seed: int = 0) -> dict[str, list[int]]:
    """Image indices per split, ``shares`` of the images each (summing to 1), stratified by the classes in
    ``labels`` (the set of classes of each image). Seeded: the same inputs give the same split."""
    rng = random.Random(seed)
    order = list(range(len(labels)))
    rng.shuffle(order)
    names = list(shares)
    wanted_total = {s: shares[s] * len(labels) for s in names}
    wanted: dict[str, dict[int, float]] = {s: {} for s in names}
    for image in labels:
        for k in image:
            for s in names:
                wanted[s][k] = wanted[s].get(k, 0.0) + shares[s]
    chosen: dict[str, list[int]] = {s: [] for s in names}
    left = set(order)

    def assign(i: int, rarest: int | None) -> None:  # to the split lacking most of ``rarest``, then most images
        best = max(names, key=lambda s: (wanted[s][rarest] if rarest is not None else 0, wanted_total[s],
                                         -names.index(s)))
        chosen[best].append(i)
        left.discard(i)
        wanted_total[best] -= 1
        for k in labels[i]:
            wanted[best][k] -= 1

    while any(labels[i] for i in left):
        counts: dict[int, int] = {}
        for i in left:
            for k in labels[i]:
                counts[k] = counts.get(k, 0) + 1
        rarest = min(counts, key=lambda k: (counts[k], k))
        for i in [i for i in order if i in left and rarest in labels[i]]:
            assign(i, rarest)
    for i in [i for i in order if i in left]:  # images without objects: by the splits' sizes alone
        assign(i, None)
    return {s: sorted(chosen[s]) for s in names}


@dataclass
class SplitSummary:
    """The split written: ``counts[split][class]`` objects, ``images[split]``, and where it went."""

    out: Path
    class_names: list[str]
    images: dict[str, int]
    counts: dict[str, list[int]]

    def __str__(self) -> str:
        splits = list(self.images)
        total = [sum(c[k] for c in self.counts.values()) for k in range(len(self.class_names))]
        rows = [f"{'class':<16} {'all':>8} " + " ".join(f"{s:>14}" for s in splits),
                f"{'images':<16} {sum(self.images.values()):>8} " + " ".join(f"{self.images[s]:>14}" for s in splits)]
        for k, name in enumerate(self.class_names):
            cells = [f"{self.counts[s][k]:>6} ({100 * self.counts[s][k] / max(total[k], 1):4.1f}%)" for s in splits]
            rows.append(f"{name[:16]:<16} {total[k]:>8} " + " ".join(cells))
        return "\n".join(rows) + f"\nwritten: {self.out}"


def _lists_yolo(out: Path, spec: DatasetSpec, parts: dict[str, list[ImageRecord]]) -> None:
    desc: dict = {s: f"{s}.txt" for s in parts}
    desc["names"] = list(spec.class_names)
    flags = [{"file": str(r.annotation), "line": o.line, "difficult": o.difficult, "iscrowd": o.iscrowd}
             for records in parts.values() for r in records for o in r.objects if o.difficult or o.iscrowd]
    for split, records in parts.items():
        (out / f"{split}.txt").write_text("".join(f"{os.path.abspath(r.path)}\n" for r in records), encoding="utf-8")
    if flags:
        desc["flags"] = "flags.jsonl"
        (out / "flags.jsonl").write_text("".join(json.dumps(f, ensure_ascii=False) + "\n" for f in flags),
                                         encoding="utf-8")
    (out / "data.yaml").write_text(yaml.safe_dump(desc, allow_unicode=True, sort_keys=False), encoding="utf-8")


def _lists_voc(out: Path, spec: DatasetSpec, parts: dict[str, list[ImageRecord]]) -> None:
    every = [r for records in parts.values() for r in records]
    folders = {r.path.parent for r in every}, {r.annotation.parent for r in every if r.annotation}
    if len(folders[0]) != 1 or len(folders[1]) != 1:
        raise DataError(f"{spec.root}: its images or XML files lie in several folders, which VOC ImageSets cannot "
                        "list: write a new dataset with --to voc")
    (out / "JPEGImages").symlink_to(folders[0].pop().resolve(), target_is_directory=True)
    (out / "Annotations").symlink_to(folders[1].pop().resolve(), target_is_directory=True)
    (out / "ImageSets" / "Main").mkdir(parents=True)
    for split, records in parts.items():
        (out / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{r.path.stem}\n" for r in records),
                                                                 encoding="utf-8")
    (out / "classes.txt").write_text("".join(f"{n}\n" for n in spec.class_names), encoding="utf-8")


def split_dataset(source: str | Path, out: str | Path, val: float = 0.2, test: float = 0.0, seed: int = 0,
                  to: str | None = None, images: str = "link") -> SplitSummary:
    """Pool every split of ``source`` (an image listed in two, as VOC's ``trainval``, once) and deal its images
    into ``train`` / ``val`` (/ ``test``), stratified by class; write the result to the new folder ``out`` as list
    files (``to="lists"``, the default for YOLO and VOC) or as a dataset in format ``to`` (images linked or copied
    as ``images`` says).

    Raises:
        DataError: a share that leaves a split without images, a dataset with errors, lists of a COCO dataset.
        OutputError: ``out`` not empty, or equal to, inside or above the source's folder.
    """
    spec = load_dataset(source)
    out = check_dataset_output(out, [source, spec.root])
    to = to or ("lists" if spec.format in ("yolo", "voc") else spec.format)
    if to == "lists" and spec.format not in ("yolo", "voc"):
        raise DataError(f"--to lists: list files are read for YOLO and VOC datasets, {spec.root} is "
                        f"{spec.format}: give --to {spec.format} (or another format) to write the split dataset")
    every = list({r.path: r for records in usable_records(spec).values() for r in records}.values())  # trainval
    shares = {"train": 1 - val - test, "val": val, **({"test": test} if test else {})}
    for name, share in shares.items():
        if round(share * len(every)) < 1 and share > 0:
            raise DataError(f"--{name} {share:g} of {len(every)} images is no image: give a larger share")
    index = stratified_split([{o.label for o in r.objects} for r in every], shares, seed)
    parts = {s: [every[i] for i in index[s]] for s in shares}
    if to == "lists":
        with staged(out) as stage:
            (_lists_yolo if spec.format == "yolo" else _lists_voc)(stage, spec, parts)
    else:
        write_dataset(parts, spec.class_names, out, to, images, spec.category_ids)
    counts = {s: [0] * spec.num_classes for s in parts}
    for s, records in parts.items():
        for r in records:
            for o in r.objects:
                counts[s][o.label] += 1
    return SplitSummary(out, spec.class_names, {s: len(r) for s, r in parts.items()}, counts)

"""The writers of ``ssd data convert``: VOC, COCO, YOLO and Label Studio, each from records to the layout its reader
(and the tool it comes from) takes. A writer gets the class names, per split an iterable of ``(record, name)``
pairs (``name``: the image's unique file name in the output) that it reads once, in order, writing each record as it
comes (nothing is held per image, so memory does not grow with the dataset), and ``place(image, destination)``
for each image to put in the output.

What each format keeps of an object: the box (floats written in their shortest exact text), the class name, and the
attributes of :data:`ATTRIBUTES` that :data:`HOLDS` lists for it: VOC ``<difficult>``, ``<truncated>``,
``<occluded>`` and ``<iscrowd>`` (not VOC's own: written for COCO crowds); COCO ``iscrowd``, ``difficult`` and
``attributes: {occluded, truncated, z_order}`` (as CVAT's COCO export writes ``occluded``); YOLO a ``flags.jsonl``
named by ``data.yaml`` (plain YOLO has no place for them; tools that do not know it ignore it); Label Studio none
(its rectangle labels have no such field). What a format cannot hold is counted, per attribute, in the summary of
:func:`ssd.data.commands.convert.write_dataset`. Images without objects are kept: an empty label file, an XML
without objects, a COCO image without annotations, a task with an empty result.
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from ssd.data.records import ImageRecord, ObjectRecord

__all__ = ["Target", "WRITERS", "ATTRIBUTES", "HOLDS", "number"]

Named = dict[str, Iterable[tuple[ImageRecord, str]]]
Place = Callable[[Path, Path], None]

ATTRIBUTES = {"difficult": "difficult flag", "iscrowd": "crowd flag", "occluded": "occluded flag",
              "truncated": "truncated flag", "z_order": "z_order value"}
"""The object attributes besides box and class that a conversion carries (set: true, or a z_order other than 0),
and how a report names one."""
HOLDS = {"voc": ("difficult", "iscrowd", "occluded", "truncated"), "coco": tuple(ATTRIBUTES),
         "yolo": tuple(ATTRIBUTES), "labelstudio": ()}
"""The attributes each format can write (VOC has no drawing order; Label Studio's rectangles no flags)."""


@dataclass
class Target:
    """What every writer needs besides the records: the class names and the COCO category id of each label."""

    class_names: list[str]
    category_ids: list[int]


def number(value: float) -> str:
    """A float as the shortest text that reads back to it (``12`` for a whole number)."""
    value = float(value)
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


def _voc_object(parent: ET.Element, obj: ObjectRecord) -> None:
    el = ET.SubElement(parent, "object")
    ET.SubElement(el, "name").text = obj.name
    ET.SubElement(el, "truncated").text = str(int(obj.truncated))
    ET.SubElement(el, "difficult").text = str(int(obj.difficult))
    if obj.occluded:
        ET.SubElement(el, "occluded").text = "1"
    if obj.iscrowd:
        ET.SubElement(el, "iscrowd").text = "1"
    box = ET.SubElement(el, "bndbox")
    for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), obj.box):
        ET.SubElement(box, tag).text = number(value + 1.0)  # VOC pixels are 1-based


def write_voc(out: Path, target: Target, named: Named, place: Place) -> None:
    """``JPEGImages/``, ``Annotations/<stem>.xml``, ``ImageSets/Main/<split>.txt``, ``classes.txt``."""
    (out / "Annotations").mkdir()
    (out / "ImageSets" / "Main").mkdir(parents=True)
    for split, items in named.items():
        with open(out / "ImageSets" / "Main" / f"{split}.txt", "w", encoding="utf-8") as listed:
            for record, name in items:
                root = ET.Element("annotation")
                ET.SubElement(root, "filename").text = name
                size = ET.SubElement(root, "size")
                for tag, value in (("width", record.width), ("height", record.height), ("depth", 3)):
                    ET.SubElement(size, tag).text = str(value)
                for obj in record.objects:
                    _voc_object(root, obj)
                ET.indent(root)
                ET.ElementTree(root).write(out / "Annotations" / f"{Path(name).stem}.xml", encoding="utf-8",
                                           xml_declaration=True)
                listed.write(Path(name).stem + "\n")
                place(record.path, out / "JPEGImages" / name)
    (out / "classes.txt").write_text("".join(n + "\n" for n in target.class_names), encoding="utf-8")


def _coco_annotation(obj: ObjectRecord, ann_id: int, image_id: int, category_id: int) -> dict:
    x1, y1, x2, y2 = obj.box
    ann = {"id": ann_id, "image_id": image_id, "category_id": category_id, "bbox": [x1, y1, x2 - x1, y2 - y1],
           "area": (x2 - x1) * (y2 - y1), "iscrowd": int(obj.iscrowd)}
    if obj.difficult:
        ann["difficult"] = 1
    attributes = {k: v for k, v in (("occluded", obj.occluded), ("truncated", obj.truncated),
                                    ("z_order", obj.z_order)) if v}
    if attributes:
        ann["attributes"] = attributes
    return ann


def write_coco(out: Path, target: Target, named: Named, place: Place) -> None:
    """``images/<split>/``, ``annotations/<split>.json``, in one pass: the images written to the file as they come,
    their annotations to a second file beside it, appended when the split ends (one image or annotation a line)."""
    (out / "annotations").mkdir()
    categories = [{"id": i, "name": n} for i, n in zip(target.category_ids, target.class_names)]
    for split, items in named.items():
        path, later = out / "annotations" / f"{split}.json", out / "annotations" / f".{split}.annotations"
        with open(path, "w", encoding="utf-8") as f, open(later, "w+", encoding="utf-8") as anns:
            f.write('{"categories": ' + json.dumps(categories, ensure_ascii=False) + ',\n"images": [')
            ann_id = 0
            for index, (record, name) in enumerate(items, start=1):
                entry = {"id": index, "file_name": f"{split}/{name}", "width": record.width, "height": record.height}
                f.write(("," if index > 1 else "") + "\n" + json.dumps(entry, ensure_ascii=False))
                for obj in record.objects:
                    ann_id += 1
                    ann = _coco_annotation(obj, ann_id, index, target.category_ids[obj.label])
                    anns.write(("," if ann_id > 1 else "") + "\n" + json.dumps(ann))
                place(record.path, out / "images" / split / name)
            f.write('],\n"annotations": [')
            anns.seek(0)
            shutil.copyfileobj(anns, f)
            f.write("]}\n")
        later.unlink()


class _Flags:
    """``flags.jsonl``, opened at the first object with an attribute set: ``{"file", "line", "difficult",
    "iscrowd"}`` a line, and ``occluded``, ``truncated``, ``z_order`` when set."""

    def __init__(self, path: Path) -> None:
        self.path, self.file = path, None

    def add(self, obj: ObjectRecord, label_file: str, line: int) -> None:
        if not (obj.difficult or obj.iscrowd or obj.occluded or obj.truncated or obj.z_order):
            return
        if self.file is None:
            self.file = open(self.path, "w", encoding="utf-8")  # noqa: SIM115 (closed by close())
        entry = {"file": label_file, "line": line, "difficult": obj.difficult, "iscrowd": obj.iscrowd}
        entry.update((k, v) for k, v in (("occluded", obj.occluded), ("truncated", obj.truncated),
                                         ("z_order", obj.z_order)) if v)
        self.file.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def close(self) -> bool:
        """Close the file; whether there was one."""
        if self.file is not None:
            self.file.close()
        return self.file is not None


def write_yolo(out: Path, target: Target, named: Named, place: Place) -> None:
    """``images/<split>/``, ``labels/<split>/<stem>.txt`` (``class cx cy w h`` normalized), ``data.yaml``, and
    ``flags.jsonl`` when some object has an attribute set (see :class:`_Flags`)."""
    flags = _Flags(out / "flags.jsonl")
    try:
        for split, items in named.items():
            (out / "labels" / split).mkdir(parents=True)
            for record, name in items:
                w, h, label_file = record.width, record.height, f"labels/{split}/{Path(name).stem}.txt"
                lines = []
                for obj in record.objects:
                    x1, y1, x2, y2 = obj.box
                    lines.append(" ".join([str(obj.label), *map(number, ((x1 + x2) / 2 / w, (y1 + y2) / 2 / h,
                                                                          (x2 - x1) / w, (y2 - y1) / h))]))
                    flags.add(obj, label_file, len(lines))
                (out / label_file).write_text("".join(s + "\n" for s in lines), encoding="utf-8")
                place(record.path, out / "images" / split / name)
    finally:
        written = flags.close()
    desc: dict = {split: f"images/{split}" for split in named}
    desc["names"] = list(target.class_names)
    if written:
        desc["flags"] = "flags.jsonl"
    (out / "data.yaml").write_text(yaml.safe_dump(desc, allow_unicode=True, sort_keys=False), encoding="utf-8")


def _labelstudio_task(record: ImageRecord, reference: str) -> dict:
    w, h = record.width, record.height
    result = [{"id": f"r{i}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
               "original_width": w, "original_height": h, "image_rotation": 0,
               "value": {"x": 100 * o.box[0] / w, "y": 100 * o.box[1] / h, "width": 100 * (o.box[2] - o.box[0]) / w,
                         "height": 100 * (o.box[3] - o.box[1]) / h, "rotation": 0, "rectanglelabels": [o.name]}}
              for i, o in enumerate(record.objects)]
    return {"data": {"image": reference}, "annotations": [{"result": result}]}


def write_labelstudio(out: Path, target: Target, named: Named, place: Place) -> None:
    """``<split>/<image>``, ``<split>/tasks.json``: the tasks Label Studio's JSON import takes (``data.image`` a
    local-files URL, ``annotations[0].result`` rectangle labels in percent of ``original_width/height``), and
    ``classes.txt`` (the class order, which the tasks do not hold)."""
    for split, items in named.items():
        (out / split).mkdir()
        with open(out / split / "tasks.json", "w", encoding="utf-8") as f:
            f.write("[")
            for index, (record, name) in enumerate(items):
                task = _labelstudio_task(record, f"/data/local-files/?d={split}/{name}")
                f.write(("," if index else "") + "\n" + json.dumps(task, ensure_ascii=False))
                place(record.path, out / split / name)
            f.write("\n]\n")
    (out / "classes.txt").write_text("".join(n + "\n" for n in target.class_names), encoding="utf-8")


WRITERS: dict[str, Callable[[Path, Target, Named, Place], None]] = {
    "voc": write_voc, "coco": write_coco, "yolo": write_yolo, "labelstudio": write_labelstudio}

"""The writers of ``ssd data convert``: VOC, COCO, YOLO and Label Studio, each from records to the layout its reader
(and the tool it comes from) takes. A writer gets the class names and, per split, ``(record, name)`` pairs (``name``:
the image's unique file name in the output) and returns ``(image, destination)`` pairs for the images to place.

What each format keeps of an object: the box (floats written in their shortest exact text), the class name, and
``difficult`` / ``iscrowd``: VOC ``<difficult>`` / ``<iscrowd>``, COCO ``difficult`` / ``iscrowd``, YOLO a
``flags.jsonl`` named by ``data.yaml`` (plain YOLO has no place for them; tools that do not know it ignore it), Label
Studio none (its rectangle labels have no such flag: objects with one are counted in a warning). Images without
objects are kept: an empty label file, an XML without objects, a COCO image without annotations, a task with an empty
result.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from ssd.data.records import ImageRecord, ObjectRecord

__all__ = ["Target", "WRITERS", "number"]

Pairs = list[tuple[Path, Path]]
Named = dict[str, list[tuple[ImageRecord, str]]]


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
    ET.SubElement(el, "difficult").text = str(int(obj.difficult))
    if obj.iscrowd:
        ET.SubElement(el, "iscrowd").text = "1"
    box = ET.SubElement(el, "bndbox")
    for tag, value in zip(("xmin", "ymin", "xmax", "ymax"), obj.box):
        ET.SubElement(box, tag).text = number(value + 1.0)  # VOC pixels are 1-based


def write_voc(out: Path, target: Target, named: Named) -> Pairs:
    """``JPEGImages/``, ``Annotations/<stem>.xml``, ``ImageSets/Main/<split>.txt``, ``classes.txt``."""
    pairs: Pairs = []
    (out / "Annotations").mkdir()
    (out / "ImageSets" / "Main").mkdir(parents=True)
    for split, items in named.items():
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
            pairs.append((record.path, out / "JPEGImages" / name))
        (out / "ImageSets" / "Main" / f"{split}.txt").write_text(
            "".join(Path(name).stem + "\n" for _, name in items), encoding="utf-8")
    (out / "classes.txt").write_text("".join(n + "\n" for n in target.class_names), encoding="utf-8")
    return pairs


def write_coco(out: Path, target: Target, named: Named) -> Pairs:
    """``images/<split>/``, ``annotations/<split>.json`` (written as it goes: one image or annotation a line)."""
    pairs: Pairs = []
    (out / "annotations").mkdir()
    categories = [{"id": i, "name": n} for i, n in zip(target.category_ids, target.class_names)]
    for split, items in named.items():
        with open(out / "annotations" / f"{split}.json", "w", encoding="utf-8") as f:
            f.write('{"categories": ' + json.dumps(categories, ensure_ascii=False) + ',\n"images": [')
            for index, (record, name) in enumerate(items):
                entry = {"id": index + 1, "file_name": f"{split}/{name}", "width": record.width,
                         "height": record.height}
                f.write(("," if index else "") + "\n" + json.dumps(entry, ensure_ascii=False))
                pairs.append((record.path, out / "images" / split / name))
            f.write('],\n"annotations": [')
            ann_id = 0
            for index, (record, _) in enumerate(items):
                for obj in record.objects:
                    x1, y1, x2, y2 = obj.box
                    ann = {"id": ann_id + 1, "image_id": index + 1, "category_id": target.category_ids[obj.label],
                           "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1),
                           "iscrowd": int(obj.iscrowd)}
                    if obj.difficult:
                        ann["difficult"] = 1
                    f.write(("," if ann_id else "") + "\n" + json.dumps(ann))
                    ann_id += 1
            f.write("]}\n")
    return pairs


def write_yolo(out: Path, target: Target, named: Named) -> Pairs:
    """``images/<split>/``, ``labels/<split>/<stem>.txt`` (``class cx cy w h`` normalized), ``data.yaml``, and
    ``flags.jsonl`` when some object is difficult or crowd (``{"file", "line", "difficult", "iscrowd"}`` a line)."""
    pairs: Pairs = []
    flags = []
    for split, items in named.items():
        (out / "labels" / split).mkdir(parents=True)
        for record, name in items:
            w, h = record.width, record.height
            lines = []
            for obj in record.objects:
                x1, y1, x2, y2 = obj.box
                lines.append(" ".join([str(obj.label), *map(number, ((x1 + x2) / 2 / w, (y1 + y2) / 2 / h,
                                                                      (x2 - x1) / w, (y2 - y1) / h))]))
                if obj.difficult or obj.iscrowd:
                    flags.append({"file": f"labels/{split}/{Path(name).stem}.txt", "line": len(lines),
                                  "difficult": obj.difficult, "iscrowd": obj.iscrowd})
            (out / "labels" / split / f"{Path(name).stem}.txt").write_text("".join(s + "\n" for s in lines),
                                                                            encoding="utf-8")
            pairs.append((record.path, out / "images" / split / name))
    desc: dict = {split: f"images/{split}" for split in named}
    desc["names"] = list(target.class_names)
    if flags:
        desc["flags"] = "flags.jsonl"
        (out / "flags.jsonl").write_text("".join(json.dumps(f, ensure_ascii=False) + "\n" for f in flags),
                                         encoding="utf-8")
    (out / "data.yaml").write_text(yaml.safe_dump(desc, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return pairs


def _labelstudio_task(record: ImageRecord, reference: str) -> dict:
    w, h = record.width, record.height
    result = [{"id": f"r{i}", "type": "rectanglelabels", "from_name": "label", "to_name": "image",
               "original_width": w, "original_height": h, "image_rotation": 0,
               "value": {"x": 100 * o.box[0] / w, "y": 100 * o.box[1] / h, "width": 100 * (o.box[2] - o.box[0]) / w,
                         "height": 100 * (o.box[3] - o.box[1]) / h, "rotation": 0, "rectanglelabels": [o.name]}}
              for i, o in enumerate(record.objects)]
    return {"data": {"image": reference}, "annotations": [{"result": result}]}


def write_labelstudio(out: Path, target: Target, named: Named) -> Pairs:
    """``<split>/<image>``, ``<split>/tasks.json``: the tasks Label Studio's JSON import takes (``data.image`` a
    local-files URL, ``annotations[0].result`` rectangle labels in percent of ``original_width/height``), and
    ``classes.txt`` (the class order, which the tasks do not hold)."""
    pairs: Pairs = []
    for split, items in named.items():
        (out / split).mkdir()
        with open(out / split / "tasks.json", "w", encoding="utf-8") as f:
            f.write("[")
            for index, (record, name) in enumerate(items):
                task = _labelstudio_task(record, f"/data/local-files/?d={split}/{name}")
                f.write(("," if index else "") + "\n" + json.dumps(task, ensure_ascii=False))
                pairs.append((record.path, out / split / name))
            f.write("\n]\n")
    (out / "classes.txt").write_text("".join(n + "\n" for n in target.class_names), encoding="utf-8")
    return pairs


WRITERS: dict[str, Callable[[Path, Target, Named], Pairs]] = {
    "voc": write_voc, "coco": write_coco, "yolo": write_yolo, "labelstudio": write_labelstudio}

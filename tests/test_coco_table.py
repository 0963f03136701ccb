"""The COCO reader's table: built from columns, with the records, issues and file:line messages of the per-object
reader it replaced."""

from __future__ import annotations

import json
import math

import numpy as np
from PIL import Image

from ssd.data.index import index_dataset
from ssd.data.load import load_dataset
from ssd.data.table import RecordTable

COCO_DEFECTS = [  # (annotation, the old reader's message for it or None when it is an object)
    ({"id": 1, "image_id": 11, "category_id": 1, "bbox": [5, 5, 30, 25]}, None),
    ({"id": 2, "image_id": 10, "category_id": 2, "bbox": [2.25, 3, 10, 7], "iscrowd": 1.0}, None),
    ({"id": 3, "image_id": 99, "category_id": 1, "bbox": [2, 3, 4, 5]}, "annotation id 3: image_id 99 is not in "
     "'images'"),
    ({"id": 4, "image_id": [1], "category_id": 1, "bbox": [2, 3, 4, 5]}, "annotation id 4: image_id [1] is not in "
     "'images'"),
    ({"id": 5, "image_id": 11, "category_id": 1, "bbox": [2, 3, True, 5]}, "annotation id 5: bbox [2, 3, True, 5] is "
     "not [x, y, w, h] numbers"),
    ({"id": 6, "image_id": 11, "category_id": 1, "bbox": "2 3 4 5"}, "annotation id 6: bbox '2 3 4 5' is not [x, y, "
     "w, h] numbers"),
    ({"id": 7, "image_id": 10, "category_id": 1, "bbox": [10, 5, 35, 28]}, "annotation id 7: bbox [10, 5, 35, 28] "
     "passes the 40x30 image as [x, y, width, height] but fits it as [x1, y1, x2, y2]; COCO bboxes are [x, y, width, "
     "height] (write width = x2 - x1, height = y2 - y1)"),
    ({"id": "8", "image_id": 11, "category_id": 1, "bbox": [1, 1, 4, 4]}, "annotations[7]: id '8' is not an "
     "integer"),
    ({"id": 9, "image_id": 11, "category_id": 1, "bbox": [1, 1, 4, 4], "iscrowd": "1"}, "annotation id 9: iscrowd "
     "'1' is not 0 or 1"),
    ({"id": 1, "image_id": 10, "category_id": 1, "bbox": [1, 1, 4, 4]}, "annotation id 1: id 1 is also "
     "annotations[0] (annotation ids must be unique)"),
    ({"id": 2**70, "image_id": 10, "category_id": 7, "bbox": [0.1, 0.2, 0.30000000000000004, 10**400]}, None),
    ({"id": -5, "image_id": 11, "category_id": True, "bbox": [-1, 0.1, 4, 4.333333333333333]}, None),
]


def test_the_coco_reader_keeps_its_records_and_messages(tmp_path):
    """The COCO reader builds its table from columns: the same records, issues and file:line messages as the
    per-object reader it replaced (its output on this file, written out here), objects grouped by image."""
    (tmp_path / "images").mkdir()
    for i in range(2):
        Image.new("RGB", (40 + 8 * i, 30)).save(tmp_path / "images" / f"{i}.jpg")
    coco = {"images": [{"id": 10, "file_name": "0.jpg"}, {"id": 11, "file_name": "1.jpg"}],
            "annotations": [a for a, _ in COCO_DEFECTS], "categories": [{"id": 2, "name": "dog"},
                                                                       {"id": 1, "name": "cat"}]}
    path = tmp_path / "instances_train.json"
    path.write_text(json.dumps(coco))
    spec = load_dataset(path)
    assert [(i.code, i.message, i.line, i.image) for i in spec.issues] == [
        ("parse_error", f"instances_train.json {message}", a["id"] if isinstance(a["id"], int) else None,
         None if a["image_id"] not in (10, 11) else tmp_path / "images" / f"{a['image_id'] - 10}.jpg")
        for a, message in COCO_DEFECTS if message]
    table = spec.records("train")
    assert isinstance(table, RecordTable) and table.boxes.dtype == np.float64  # the values as written
    objects = [[(o.box, o.label, o.name, o.iscrowd, o.line, o.source, o.where, o.raw) for o in r.objects]
               for r in table]
    assert objects == [
        [((2.25, 3.0, 12.25, 10.0), 1, "dog", True, 2, path, "instances_train.json annotation id 2",
          "bbox [2.25, 3, 10, 7]"),
         ((0.1, 0.2, 0.4, math.inf), -1, "category 7", False, 2**63 - 1, path,
          f"instances_train.json annotation id {2**70}", f"bbox [0.1, 0.2, 0.30000000000000004, {10**400}]")],
        [((5.0, 5.0, 35.0, 30.0), 0, "cat", False, 1, path, "instances_train.json annotation id 1",
          "bbox [5, 5, 30, 25]"),
         ((-1.0, 0.1, 3.0, 4.433333333333333), -1, "category True", False, -5, path,
          "instances_train.json annotation id -5", "bbox [-1, 0.1, 4, 4.333333333333333]")]]
    assert [(r.path.name, r.annotation, r.width, r.height, r.image_id) for r in table] == [
        ("0.jpg", path, 40, 30, 10), ("1.jpg", path, 48, 30, 11)]
    indexed = index_dataset(path, splits=("train",)).spec.records("train")
    assert indexed.boxes.dtype == np.float32 and np.array_equal(indexed.boxes, table.boxes.astype(np.float32))

"""Ground truths of dataset records in the per-image form every metric of :mod:`ssd.evaluation` takes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ssd.data.records import ImageRecord

__all__ = ["ground_truths_from_records"]


def ground_truths_from_records(records: Sequence[ImageRecord]) -> list[dict[str, Any]]:
    """One dict per record: ``boxes [M, 4]`` float32 pixel xyxy, ``labels [M]`` int64, ``difficult [M]`` bool
    (VOC difficult or COCO crowd: ignored by evaluation), ``image_size`` ``(h, w)`` and ``image_id``.

    Records must have their ``width`` / ``height`` (as the readers give them).
    """
    out = []
    for record in records:
        if record.width is None or record.height is None:
            raise ValueError(f"{record.path}: image size unknown (read the dataset with ssd.data.load_dataset)")
        out.append({"boxes": torch.tensor([o.box for o in record.objects], dtype=torch.float32).reshape(-1, 4),
                    "labels": torch.tensor([o.label for o in record.objects], dtype=torch.int64),
                    "difficult": torch.tensor([o.ignore for o in record.objects], dtype=torch.bool),
                    "image_size": (record.height, record.width), "image_id": record.image_id})
    return out

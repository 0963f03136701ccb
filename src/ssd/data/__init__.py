"""Datasets (VOC, COCO, YOLO), the ``ssd check`` doctor and training gate, SSD augmentation and the data loader.

The names below are imported on first use (PEP 562), so that reading an image (:mod:`ssd.data.images`) loads
neither torch nor the loader: the runtime install without PyTorch decodes its inputs with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "CheckReport": "ssd.data.check_report", "check_dataset": "ssd.data.check", "find_issues": "ssd.data.check",
    "read_image_size": "ssd.data.images", "read_image": "ssd.data.images", "DatasetSpec": "ssd.data.records",
    "ImageRecord": "ssd.data.records", "Issue": "ssd.data.records", "ObjectRecord": "ssd.data.records",
    "load_dataset": "ssd.data.load", "load_training_data": "ssd.data.gate", "SHAPE_NAMES": "ssd.data.synthetic",
    "generate_synthetic": "ssd.data.synthetic", "DetectionDataset": "ssd.data.loader",
    "SeededSampler": "ssd.data.loader", "build_dataloader": "ssd.data.loader", "collate": "ssd.data.loader",
    "build_transform": "ssd.data.transforms",
}

__all__ = ["CheckReport", "check_dataset", "find_issues", "read_image_size", "read_image", "DatasetSpec",
           "ImageRecord", "Issue", "ObjectRecord", "load_dataset", "load_training_data", "SHAPE_NAMES",
           "generate_synthetic", "DetectionDataset", "SeededSampler", "build_dataloader", "collate", "build_transform"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ssd.data' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from ssd.data.check import check_dataset, find_issues
    from ssd.data.check_report import CheckReport
    from ssd.data.gate import load_training_data
    from ssd.data.images import read_image, read_image_size
    from ssd.data.load import load_dataset
    from ssd.data.loader import DetectionDataset, SeededSampler, build_dataloader, collate
    from ssd.data.records import DatasetSpec, ImageRecord, Issue, ObjectRecord
    from ssd.data.synthetic import SHAPE_NAMES, generate_synthetic
    from ssd.data.transforms import build_transform

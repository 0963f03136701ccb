"""Datasets (VOC, COCO, YOLO), the ``ssd check`` doctor, SSD augmentation and the data loader."""

from ssd.data.check import CheckReport, check, find_issues, prior_coverage, validate_spec
from ssd.data.images import read_image, read_image_size
from ssd.data.loader import DetectionDataset, SeededSampler, build_dataloader, collate
from ssd.data.records import DataError, DatasetSpec, ImageRecord, Issue, ObjectRecord
from ssd.data.spec import load_dataset
from ssd.data.synthetic import SHAPE_NAMES, generate_synthetic
from ssd.data.transforms import build_transform

__all__ = ["CheckReport", "check", "find_issues", "prior_coverage", "validate_spec", "read_image_size", "read_image",
           "DataError", "DatasetSpec", "ImageRecord", "Issue", "ObjectRecord", "load_dataset", "SHAPE_NAMES",
           "generate_synthetic", "DetectionDataset", "SeededSampler", "build_dataloader", "collate", "build_transform"]

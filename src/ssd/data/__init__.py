"""Datasets (VOC, COCO, YOLO), the ``ssd check`` doctor and training gate, SSD augmentation and the data loader."""

from ssd.data.check import check_dataset, find_issues
from ssd.data.check_report import CheckReport
from ssd.data.gate import load_training_data
from ssd.data.images import read_image, read_image_size
from ssd.data.load import load_dataset
from ssd.data.loader import DetectionDataset, SeededSampler, build_dataloader, collate
from ssd.data.records import DatasetSpec, ImageRecord, Issue, ObjectRecord
from ssd.data.synthetic import SHAPE_NAMES, generate_synthetic
from ssd.data.transforms import build_transform

__all__ = ["CheckReport", "check_dataset", "find_issues", "read_image_size", "read_image", "DatasetSpec",
           "ImageRecord", "Issue", "ObjectRecord", "load_dataset", "load_training_data", "SHAPE_NAMES",
           "generate_synthetic", "DetectionDataset", "SeededSampler", "build_dataloader", "collate", "build_transform"]

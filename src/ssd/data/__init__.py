"""Datasets (VOC, COCO, YOLO), the ``ssd check`` doctor, SSD augmentation and the data loader."""

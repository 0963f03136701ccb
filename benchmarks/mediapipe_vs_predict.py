"""MediaPipe's ``ObjectDetector`` against ``ssd predict`` on the same ``.tflite`` file and the same images: how many of
MediaPipe's detections are one of ours (same class, IoU above 0.5, matched greedily by score), how many of those
are the same detection (IoU at least 0.9, score within 1e-3), the median and smallest IoU and the largest score
difference of the matched pairs. Two runs: the validation images resized to the network size first
(both sides see the same pixels) and as they are (each side resizes its own way: MediaPipe without antialiasing).
Prints a Markdown table for ``benchmarks/README.md``.
Run: ``.venv/bin/python benchmarks/mediapipe_vs_predict.py --model best.tflite --data DATA [--images 50]``.
"""

from __future__ import annotations

import argparse

import mediapipe as mp
import numpy as np
import torch
from mediapipe.tasks.python import BaseOptions, vision
from torchvision.ops import box_iou
from torchvision.transforms.v2 import functional as TF

from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.inference.detector import load

SCORE = 0.3


def mediapipe_boxes(detector, image: torch.Tensor, names: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MediaPipe's detections of ``image [3, H, W]`` uint8: boxes ``[N, 4]`` pixel xyxy, scores, labels."""
    pixels = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
    found = detector.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels)).detections
    boxes = [[d.bounding_box.origin_x, d.bounding_box.origin_y, d.bounding_box.origin_x + d.bounding_box.width,
              d.bounding_box.origin_y + d.bounding_box.height] for d in found]
    return (torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
            torch.tensor([d.categories[0].score for d in found]),
            torch.tensor([names.index(d.categories[0].category_name) for d in found], dtype=torch.int64))


def compare(model: str, images: list[torch.Tensor], names: list[str]) -> dict:
    ours = load(model).predict(images, score_threshold=SCORE, max_detections=100)
    options = vision.ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=model), score_threshold=SCORE,
                                           max_results=100)
    total = matched = 0
    ious, score_diffs = [], []
    with vision.ObjectDetector.create_from_options(options) as detector:
        for image, result in zip(images, ours):
            boxes, scores, labels = mediapipe_boxes(detector, image, names)
            total += len(scores)
            taken = torch.zeros(len(result.scores), dtype=torch.bool)
            overlap = box_iou(boxes, result.boxes) if len(scores) and len(result.scores) else None
            for i in scores.argsort(descending=True).tolist():
                if overlap is None:
                    break
                candidates = (result.labels == labels[i]) & ~taken & (overlap[i] > 0.5)
                if candidates.any():
                    j = int(torch.where(candidates, overlap[i], -1).argmax())
                    taken[j] = True
                    matched += 1
                    ious.append(float(overlap[i, j]))
                    score_diffs.append(abs(float(scores[i] - result.scores[j])))
    same = sum(iou >= 0.9 and diff <= 1e-3 for iou, diff in zip(ious, score_diffs))
    return dict(mediapipe=total, ours=sum(len(r.scores) for r in ours), matched=matched, same=same,
                median_iou=float(np.median(ious)) if ious else float("nan"),
                min_iou=min(ious, default=float("nan")), max_score_diff=max(score_diffs, default=float("nan")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", required=True, help="an `ssd export --format tflite` file (FP32 or FP16)")
    parser.add_argument("--data", required=True, help="dataset whose validation images are used")
    parser.add_argument("--images", type=int, default=50)
    args = parser.parse_args()
    card = load(args.model).card
    images = [read_image(r.path) for r in load_dataset(args.data).records("val")[:args.images]]
    resized = [TF.resize(image.unsqueeze(0), list(card.image_size), antialias=True)[0] for image in images]
    print("| images | MediaPipe detections | ssd predict detections | MediaPipe's matched (IoU > 0.5) | the same (IoU "
          ">= 0.9, score within 1e-3) | median IoU | smallest IoU | largest score difference |")
    print("|---|---|---|---|---|---|---|---|")
    for what, batch in (("at the network size", resized), ("as they are", images)):
        row = compare(args.model, batch, list(card.class_names))
        print(f"| {len(batch)} {what} | {row['mediapipe']} | {row['ours']} | {row['matched']} | {row['same']} | "
              f"{row['median_iou']:.4f} | {row['min_iou']:.4f} | {row['max_score_diff']:.2e} |")


if __name__ == "__main__":
    main()

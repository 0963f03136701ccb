"""Run-directory figures are valid PNGs; drawn detections change the pixels of their boxes only."""

import csv

import numpy as np
import pytest
import torch
from PIL import Image

from ssd.engine.metrics import evaluate_voc
from ssd.engine.plots import (RESULTS_COLUMNS, class_color, draw_detections, plot_label_stats, plot_pr_curves,
                              plot_results, save_image)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    with Image.open(path) as im:
        im.verify()
        return im.size


def test_plot_results(tmp_path):
    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=RESULTS_COLUMNS)
        writer.writeheader()
        for epoch in range(1, 4):
            writer.writerow({"epoch": epoch, "train/loss": 5 / epoch, "train/loc_loss": 2 / epoch,
                             "train/cls_loss": 3 / epoch, "lr": 0.01, "val/mAP": "" if epoch == 1 else 0.3 * epoch,
                             "time": 10 * epoch})
    width, height = _is_png(plot_results(path, tmp_path / "results.png"))
    assert width > 500 and height > 200


def test_plot_pr_curves_and_label_stats(tmp_path):
    boxes = torch.tensor([[0, 0, 10, 10], [20, 20, 50, 40], [5, 5, 30, 20.0]])
    labels = torch.tensor([0, 1, 1])
    dets = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8, 0.3]), "labels": labels}]
    result = evaluate_voc(dets, [{"boxes": boxes[:2], "labels": labels[:2]}], 3, ["a", "b", "c"])
    _is_png(plot_pr_curves(result, ["a", "b", "c"], tmp_path / "pr.png"))
    _is_png(plot_label_stats(boxes, labels, ["a", "b", "c"], tmp_path / "sub" / "labels.png"))
    with pytest.raises(ValueError, match="3 boxes but 2 labels"):
        plot_label_stats(boxes, labels[:2], ["a", "b", "c"], tmp_path / "x.png")


def test_draw_detections_changes_pixels_inside_boxes():
    image = torch.full((3, 120, 200), 128, dtype=torch.uint8)
    boxes = torch.tensor([[20.0, 50, 80, 110], [150, 0, 230, 40]])  # the second one runs off the right edge
    out = draw_detections(image, boxes, torch.tensor([0, 1]), torch.tensor([0.9, 0.5]), ["cat", "dog"])
    assert out.dtype == torch.uint8 and out.shape == image.shape
    assert torch.equal(image, torch.full_like(image, 128))  # input untouched
    changed = (out != image).any(dim=0)
    assert changed[50, 20:81].all() and changed[50:111, 20].all()  # the first box's outline
    assert tuple(out[:, 80, 20].tolist()) == class_color(0)
    assert changed[:, 150:].any()  # the clipped box and its label are drawn
    assert not changed[115:, 100:140].any()  # far from both boxes and labels
    assert changed[30:50, 20:60].any() and not changed[:30, :140].any()  # the first label sits just above its box
    empty = draw_detections(image, torch.zeros(0, 4), torch.zeros(0, dtype=torch.int64), None, ["cat"])
    assert torch.equal(empty, image)
    with pytest.raises(ValueError, match="uint8 tensor"):
        draw_detections(image.float(), boxes, torch.tensor([0, 1]), None, ["cat", "dog"])


def test_save_image_round_trip(tmp_path):
    image = torch.randint(0, 256, (3, 16, 24), dtype=torch.uint8)
    path = save_image(image, tmp_path / "a" / "b.png")
    assert _is_png(path) == (24, 16)
    np.testing.assert_array_equal(np.asarray(Image.open(path)), image.permute(1, 2, 0).numpy())
    save_image(image, tmp_path / "c.jpg")
    assert Image.open(tmp_path / "c.jpg").size == (24, 16)
    with pytest.raises(ValueError, match="c.png: image must be a uint8 tensor"):
        save_image(image[0], tmp_path / "c.png")

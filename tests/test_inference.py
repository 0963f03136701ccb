"""The one inference pipeline: :func:`detect_batch` on a module or a backend gives ``SSD.predict``'s detections,
:func:`to_pixels` scales by each image's own size, thresholds are checked by name."""

import pytest
import torch

from conftest import biased_model, random_images
from ssd.inference.backends import TorchBackend
from ssd.inference.pipeline import Detector, detect_batch
from ssd.preprocess import preprocess, to_pixels

OPTS = dict(score_threshold=0.3, iou_threshold=0.45, max_detections=20)


@pytest.fixture(scope="module")
def tiny():
    return biased_model("ssd_tiny")


def test_detect_batch_equals_model_predict(tiny):
    images = random_images(3)
    expected = tiny.predict(images, **OPTS)
    batch, sizes = preprocess(images, tiny.image_size, tiny.config.mean, tiny.config.std)
    assert sizes.tolist() == [[120, 160], [90, 70], [64, 64]]
    for backend in (tiny, TorchBackend(tiny), Detector(tiny).backend):
        got = detect_batch(backend, batch, sizes, **OPTS)
        for g, w in zip(got, expected, strict=True):
            assert len(g["scores"]) == len(w["scores"]) > 0
            torch.testing.assert_close(g["boxes"], w["boxes"], atol=1e-4, rtol=0)
            torch.testing.assert_close(g["scores"], w["scores"], atol=1e-6, rtol=0)
            assert g["labels"].tolist() == w["labels"].tolist()
    results = Detector(tiny).detect(images, **OPTS)
    assert [(r.width, r.height) for r in results] == [(160, 120), (70, 90), (64, 64)]
    assert [r.names for r in results] == [w["names"] for w in expected]


def test_to_pixels_scales_each_image_by_its_own_size():
    detections = [{"boxes": torch.tensor([[0.1, 0.2, 0.5, 1.0]])}, {"boxes": torch.zeros(0, 4)}]
    scaled = to_pixels(detections, torch.tensor([[100, 200], [50, 50]]))
    assert scaled[0]["boxes"].tolist() == [[20.0, 20.0, 100.0, 100.0]] and scaled[1]["boxes"].shape == (0, 4)


def test_thresholds_are_checked_by_name(tiny):
    batch, sizes = preprocess(random_images(1), tiny.image_size, tiny.config.mean, tiny.config.std)
    for options, message in ((dict(max_detections=0), r"^max_detections must be a positive integer, got 0$"),
                             (dict(score_threshold=1.5), r"^score_threshold must be a number in \[0, 1\], got 1.5$"),
                             (dict(iou_threshold=-0.1), r"^iou_threshold must be a number in \[0, 1\], got -0.1$")):
        with pytest.raises(ValueError, match=message):
            detect_batch(tiny, batch, sizes, **{**OPTS, **options})
    with pytest.raises(ValueError, match=r"^batch_size must be a positive integer, got 0$"):
        Detector(tiny).predict(random_images(1), batch_size=0)

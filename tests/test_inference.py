"""The one inference pipeline: :func:`detect_batch` on a module or a backend gives ``SSD.predict``'s detections,
:func:`to_pixels` scales by each image's own size, thresholds are checked by name; :func:`open_backend` picks the
runtime by artifact kind, and a registered runtime is opened like the built-in ones."""

import pytest
import torch

from builders import biased_model, random_images
from ssd.card import ModelCard
from ssd.detect import detect_batch
from ssd.errors import CheckpointError, ConfigError
from ssd.inference import backends
from ssd.inference.backends import BACKENDS, backend_kind, open_backend, register_backend
from ssd.inference.backends.pytorch import TorchBackend
from ssd.inference.detector import Detector, load
from ssd.preprocess import preprocess, to_pixels
from ssd.settings import PREDICT, Thresholds
from ssd.weights.checkpoint import save_checkpoint

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


def test_predict_defaults_are_the_predict_settings(tiny):
    images = random_images(2)
    expected = [d["scores"] for d in tiny.predict(images, **PREDICT.as_kwargs())]
    assert [len(s) for s in expected] != [0, 0] and float(torch.cat(expected).min()) > PREDICT.score_threshold
    for got in ([d["scores"] for d in tiny.predict(images)], [r.scores for r in Detector(tiny).predict(images)]):
        for g, w in zip(got, expected, strict=True):
            torch.testing.assert_close(g, w, atol=1e-6, rtol=0)


def test_to_pixels_scales_each_image_by_its_own_size():
    detections = [{"boxes": torch.tensor([[0.1, 0.2, 0.5, 1.0]])}, {"boxes": torch.zeros(0, 4)}]
    scaled = to_pixels(detections, torch.tensor([[100, 200], [50, 50]]))
    assert scaled[0]["boxes"].tolist() == [[20.0, 20.0, 100.0, 100.0]] and scaled[1]["boxes"].shape == (0, 4)


def test_thresholds_are_checked_by_name(tiny):
    batch, sizes = preprocess(random_images(1), tiny.image_size, tiny.config.mean, tiny.config.std)
    for options, message in ((dict(max_detections=0), r"^max_detections must be a positive integer, got 0$"),
                             (dict(score_threshold=1.5), r"^score_threshold must be a number in \[0, 1\], got 1.5$"),
                             (dict(iou_threshold=-0.1), r"^iou_threshold must be a number in \[0, 1\], got -0.1$")):
        with pytest.raises(ConfigError, match=message):
            detect_batch(tiny, batch, sizes, **{**OPTS, **options})
    with pytest.raises(ConfigError, match=r"^batch_size must be a positive integer, got 0$"):
        Detector(tiny).predict(random_images(1), batch_size=0)


def test_open_backend_picks_the_runtime_by_artifact_kind(tiny, tmp_path):
    assert backend_kind("m.onnx") == "onnx" and backend_kind("m.ONNX") == "onnx"
    assert backend_kind("best.pt") == backend_kind("ssd300.pth") == backend_kind("weights.bin") == "torch"
    run = tmp_path / "run"
    save_checkpoint(run / "weights" / "best.pt", tiny)
    backend = open_backend(run)
    assert (backend.name, backend.source, backend.card.nms) == ("torch", run / "weights" / "best.pt", None)
    assert backend.device == torch.device("cpu") and backend.card.class_names == tuple(tiny.class_names)
    module_backend = open_backend(tiny)
    assert (module_backend.name, module_backend.source) == ("torch", None)
    assert open_backend(module_backend) is module_backend
    with pytest.raises(CheckpointError, match=r"weights file .*missing\.onnx does not exist$"):
        open_backend(tmp_path / "missing.onnx")


class FakeBackend:
    """A registered runtime: one fixed detection per image, from a graph with NMS inside."""

    name, device = "fake", torch.device("cpu")
    card = ModelCard("fake", ("cat", "dog"), (32, 32), (0.5,) * 3, (0.25,) * 3, (0.1, 0.2),
                     nms=Thresholds(0.0, 0.45, 100))  # the thresholds fixed in its graph; no stored best-F1 point

    def __init__(self, path, device, half):
        self.source, self.half = path, half

    def nms_detections(self, batch, *, score_threshold, iou_threshold, max_detections):
        found = {"boxes": torch.tensor([[0.25, 0.5, 0.75, 1.0]]), "scores": torch.tensor([0.9]),
                 "labels": torch.tensor([1])}
        return [found] * len(batch)


def test_a_registered_runtime_is_opened_by_suffix_and_runs_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.setattr(backends, "BACKENDS", dict(BACKENDS))
    register_backend("fake", [".FAKE"], FakeBackend)
    path = tmp_path / "model.fake"
    path.write_bytes(b"")
    detector = load(path)
    assert isinstance(detector.backend, FakeBackend) and detector.backend.source == path
    [result] = detector.predict(torch.zeros(3, 40, 80, dtype=torch.uint8))
    assert result.boxes.tolist() == [[20.0, 20.0, 60.0, 40.0]] and result.names == ["dog"]
    with pytest.raises(ValueError, match=r"^backend 'other': suffix \.onnx is already opened by backend 'onnx'$"):
        register_backend("other", [".onnx", ".xml"], FakeBackend)

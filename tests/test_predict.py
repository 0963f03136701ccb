"""Inference: input types, folder runs with a corrupt image, JSON/COCO contents against ``SSD.predict``, the ONNX
detector against the checkpoint, a video round trip, clear errors for bad weights."""

import json

import cv2
import numpy as np
import pytest
import torch
from PIL import Image

from builders import biased_model, random_images
from conftest import requires_cuda
from ssd.data.images import read_image
from ssd.errors import CheckpointError
from ssd.export.onnx import export_onnx
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.detector import Detector, load
from ssd.inference.sources import predict_source
from ssd.schemas import PredictConfig
from ssd.weights.checkpoint import save_checkpoint

CONF, IOU, MAX_DET = 0.3, 0.45, 20
OPTS = dict(score_threshold=CONF, iou_threshold=IOU, max_detections=MAX_DET)


@pytest.fixture(scope="module")
def tiny():
    return biased_model("ssd_tiny")


@pytest.fixture(scope="module")
def weights(tiny, tmp_path_factory):
    return save_checkpoint(tmp_path_factory.mktemp("weights") / "best.pt", tiny)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three PNG images, a corrupt JPEG and a text file (ignored)."""
    root = tmp_path_factory.mktemp("images")
    for i, image in enumerate(random_images(3)):
        Image.fromarray(image.permute(1, 2, 0).numpy()).save(root / f"img{i}.png")
    (root / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    (root / "notes.txt").write_text("not an image")
    return root


def assert_same(results, expected, atol=1e-5):
    assert len(results) == len(expected)
    for got, want in zip(results, expected):
        assert len(got.scores) == len(want["scores"]) > 0
        torch.testing.assert_close(got.boxes, want["boxes"], atol=atol, rtol=0)
        torch.testing.assert_close(got.scores, want["scores"], atol=atol, rtol=0)
        assert got.labels.tolist() == want["labels"].tolist()
        assert got.names == want["names"]


def test_inputs_path_pil_numpy_tensor_agree(tiny, weights, folder):
    detector = load(weights)
    path = folder / "img0.png"
    image = read_image(path)
    expected = tiny.predict([image], **OPTS)
    array = image.permute(1, 2, 0).numpy()
    for source in (path, str(path), Image.open(path), array, image):
        [result] = detector.predict(source, **OPTS)
        assert_same([result], expected)
        assert (result.width, result.height) == (image.shape[2], image.shape[1])
    assert detector.predict(path, **OPTS)[0].path == str(path)
    assert detector.predict(array, **OPTS)[0].path is None

    scaled = image.float() / 255  # float tensors in 0..1 take the model's float path
    expected = tiny.predict([scaled], **OPTS)
    assert_same(detector.predict([scaled], **OPTS), expected)

    images = random_images(3)
    batched = detector.predict(images, **OPTS, batch_size=2)
    assert_same(batched, tiny.predict(images, **OPTS))


def test_bad_inputs_are_named(weights):
    detector = load(weights)
    with pytest.raises(ValueError,
                       match=r"input 1: numpy image must be HWC uint8 RGB .*got shape \[4, 5, 3\] dtype float"):
        detector.predict([np.zeros((4, 5, 3), np.uint8), np.zeros((4, 5, 3), np.float32)])
    with pytest.raises(ValueError, match="input 0: unsupported type int"):
        detector.predict(3)
    with pytest.raises(ValueError, match="half precision needs a CUDA device"):
        load(weights, device="cpu", half=True)


def test_folder_with_corrupt_image_json_equals_model(tiny, weights, folder, tmp_path, capsys, ssd_messages):
    summary = predict_source(PredictConfig(weights=weights, source=folder, save_dir=tmp_path / "out", **OPTS,
                                           batch_size=2), progress=False)
    assert summary.images == 3
    assert [name for name, _ in summary.skipped] == [str(folder / "broken.jpg")]
    assert "skipped 1 unreadable file" in str(summary) and "broken.jpg" in str(summary)
    assert any("broken.jpg" in message for message in ssd_messages())  # reported while running, on the logger
    assert capsys.readouterr() == ("", "")  # a library prints nothing
    for i in range(3):
        assert (tmp_path / "out" / f"img{i}.png").is_file()

    content = json.loads(summary.results_file.read_text())
    assert summary.results_file == tmp_path / "out" / "predictions.json"
    assert content["class_names"] == tiny.class_names
    entries = content["images"]
    assert [e["file"] for e in entries] == [str(folder / f"img{i}.png") for i in range(3)]
    images = [read_image(folder / f"img{i}.png") for i in range(3)]
    expected = tiny.predict(images, **OPTS)
    assert summary.detections == sum(len(d["scores"]) for d in expected)
    for entry, image, want in zip(entries, images, expected):
        assert (entry["width"], entry["height"]) == (image.shape[2], image.shape[1])
        dets = entry["detections"]
        assert len(dets) == len(want["scores"]) > 0
        np.testing.assert_allclose([d["box"] for d in dets], want["boxes"].numpy(), atol=1e-4)
        np.testing.assert_allclose([d["score"] for d in dets], want["scores"].numpy(), atol=1e-6)
        assert [d["label"] for d in dets] == want["labels"].tolist()
        assert [d["name"] for d in dets] == want["names"]


def test_coco_format_glob(tiny, weights, folder, tmp_path):
    summary = predict_source(PredictConfig(weights=weights, source=str(folder / "img*.png"), save_dir=tmp_path, **OPTS,
                                           save_images=False, fmt="coco", exist_ok=True), progress=False)
    assert summary.images == 3 and not summary.skipped
    assert not list(tmp_path.glob("*.png"))
    results = json.loads((tmp_path / "predictions_coco.json").read_text())
    images = [read_image(folder / f"img{i}.png") for i in range(3)]
    expected = tiny.predict(images, **OPTS)
    assert len(results) == summary.detections == sum(len(d["scores"]) for d in expected)
    first = [r for r in results if r["image_id"] == 0]
    x1, y1, x2, y2 = expected[0]["boxes"][0].tolist()
    assert first[0]["bbox"] == pytest.approx([x1, y1, x2 - x1, y2 - y1], abs=1e-4)
    assert first[0]["category_id"] == expected[0]["labels"][0].item()


@pytest.mark.slow
def test_onnx_detector_equals_checkpoint(weights, folder, tmp_path):
    onnx_path = export_onnx(weights, tmp_path / "best.onnx", dynamic_batch=True)
    detector = load(onnx_path)
    assert isinstance(detector.backend, OnnxBackend) and detector.card.nms is None
    images = [folder / f"img{i}.png" for i in range(3)] + random_images(2)
    got = detector.predict(images, **OPTS, batch_size=4)
    want = load(weights).predict(images, **OPTS, batch_size=4)
    assert_same(got, [{"boxes": r.boxes, "scores": r.scores, "labels": r.labels, "names": r.names} for r in want],
                atol=1e-3)

    summary = predict_source(PredictConfig(source=folder, save_dir=tmp_path / "onnx", **OPTS, save_images=False),
                             detector, progress=False)
    assert summary.images == 3 and len(summary.skipped) == 1


def write_video(path, frames: int, size=(96, 64)) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10.0, size)
    generator = np.random.default_rng(0)
    for _ in range(frames):
        writer.write(generator.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    writer.release()


def test_video_round_trip(weights, tmp_path):
    source = tmp_path / "clip.avi"
    write_video(source, frames=5)
    (tmp_path / "broken.mp4").write_bytes(b"not a video")
    detector = load(weights)
    out = tmp_path / "out"
    summary = predict_source(PredictConfig(source=str(tmp_path / "*.*"), save_dir=out, **OPTS, batch_size=2),
                             detector, progress=False)
    assert (summary.videos, summary.frames, summary.images) == (1, 5, 0)
    assert [name for name, _ in summary.skipped] == [str(tmp_path / "broken.mp4")]

    capture = cv2.VideoCapture(str(source))
    frames = [torch.from_numpy(cv2.cvtColor(capture.read()[1], cv2.COLOR_BGR2RGB)).permute(2, 0, 1) for _ in range(5)]
    capture.release()
    entries = json.loads(summary.results_file.read_text())["images"]
    assert [e["frame"] for e in entries] == list(range(5))
    assert all(e["file"] == str(source) and (e["width"], e["height"]) == (96, 64) for e in entries)
    expected = detector.predict(frames, **OPTS)
    for entry, want in zip(entries, expected):
        assert len(entry["detections"]) == len(want.scores) > 0
        np.testing.assert_allclose([d["box"] for d in entry["detections"]], want.boxes.numpy(), atol=1e-4)

    written = cv2.VideoCapture(str(out / "clip.avi"))
    assert int(written.get(cv2.CAP_PROP_FRAME_COUNT)) == 5
    assert (int(written.get(cv2.CAP_PROP_FRAME_WIDTH)), int(written.get(cv2.CAP_PROP_FRAME_HEIGHT))) == (96, 64)
    written.release()


def test_missing_and_foreign_weights(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load(tmp_path / "missing.pt")
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"conv.weight": torch.zeros(1)}}, foreign)
    with pytest.raises(CheckpointError, match="not an ssd checkpoint"):
        load(foreign)
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="cannot load ONNX model"):
        load(not_onnx)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        predict_source(PredictConfig(weights=foreign, source=tmp_path / "nowhere", save_dir=tmp_path))  # first


@requires_cuda
def test_half_precision_on_cuda(tiny, weights):
    images = random_images(2)
    got = load(weights, device="cuda", half=True).predict(images, **OPTS)
    want = Detector(tiny).predict(images, **OPTS)
    for g, w in zip(got, want):
        assert g.boxes.device.type == "cpu" and abs(len(g.scores) - len(w.scores)) <= 2

"""The runtime without PyTorch (``pip install 'ssd-detect[runtime]'``): an exported graph with the pipeline inside
runs on numpy and its runtime, in a process where importing torch fails, and gives what the PyTorch path gives."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from builders import predicts_as_pytorch_without_it, run_without_torch, write_png_images
from ssd.arrays import detect_arrays, preprocess_arrays
from ssd.card import ModelCard
from ssd.errors import MissingDependencyError
from ssd.preprocess import preprocess
from ssd.settings import Thresholds

pytest.importorskip("onnxruntime")

@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint as ONNX with NMS inside (any batch), float or uint8 NHWC input, without NMS, and three
    images."""
    from ssd.export.onnx import export_onnx

    folder = tmp_path_factory.mktemp("runtime")
    images = write_png_images(folder)
    nms = export_onnx(tiny_checkpoint, folder / "nms.onnx", nms=True, dynamic_batch=True, check=False,
                      score_threshold=0.05)
    uint8 = export_onnx(tiny_checkpoint, folder / "uint8.onnx", nms=True, dynamic_batch=True, check=False,
                        score_threshold=0.05, uint8_input=True)
    plain = export_onnx(tiny_checkpoint, folder / "plain.onnx", dynamic_batch=True, check=False)
    return {"nms": nms, "uint8": uint8, "plain": plain, "images": images, "folder": folder}


@pytest.mark.slow
def test_predict_an_onnx_file_on_a_machine_without_pytorch(exported):
    """`ssd predict` and `ssd.load(p).predict` on an ONNX file with NMS inside: torch is never imported, and the
    boxes are those of the PyTorch path (same graph; the resize may differ by one pixel level)."""
    stderr = predicts_as_pytorch_without_it(exported["nms"], exported["folder"], 0.47)
    assert "drawn copies (--save-images, --show) need PyTorch" in stderr


@pytest.mark.slow
def test_predict_a_plain_onnx_file_on_a_machine_without_pytorch(exported):
    """A graph exported without --nms returns head outputs: numpy post-processes them, as PyTorch does."""
    predicts_as_pytorch_without_it(exported["plain"], exported["folder"], 0.3)


def test_numpy_preprocessing_normalizes_as_the_pytorch_path():
    """A white and a black image at the network size: (1 - mean) / std and -mean / std exactly, as in PyTorch."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    images = [np.full((3, 8, 6), 255, np.uint8), np.zeros((3, 8, 6), np.uint8)]
    batch, sizes = preprocess_arrays(images, (8, 6), mean, std)
    expected, torch_sizes = preprocess([torch.from_numpy(i) for i in images], (8, 6), mean, std)
    assert batch.shape == (2, 3, 8, 6) and batch.dtype == np.float32
    assert sizes.tolist() == torch_sizes.tolist() == [[8, 6], [8, 6]]
    np.testing.assert_allclose(batch, expected.numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch[0, :, 0, 0], (1 - np.array(mean)) / np.array(std), rtol=1e-6)


def test_numpy_preprocessing_names_a_bad_image():
    with pytest.raises(ValueError, match=r"^image 1 must be a uint8 \[3, H, W\] numpy array \(RGB, channels first\) "
                                         r"without PyTorch, got ndarray \[8, 6, 3\] uint8$"):
        preprocess_arrays([np.zeros((3, 8, 6), np.uint8), np.zeros((8, 6, 3), np.uint8)], 8, (0, 0, 0), (1, 1, 1))


class _GraphWithNms:
    """A backend whose graph returns two detections per image, xyxy normalized."""

    source = "fake.onnx"

    def __init__(self, nms: bool):
        self.card = ModelCard(model_name="fake", class_names=("a", "b"), image_size=(4, 4), mean=(0, 0, 0),
                              std=(1, 1, 1), variances=(0.1, 0.2), nms=Thresholds(0.1, 0.5, 10) if nms else None)

    def nms_arrays(self, batch, **options):
        boxes = np.array([[0.0, 0.0, 0.5, 0.25], [0.5, 0.5, 1.0, 1.0]], np.float32)
        return [{"boxes": boxes, "scores": np.array([0.9, 0.2], np.float32), "labels": np.array([1, 0])}
                for _ in batch]


def test_graph_detections_are_scaled_to_each_original_image():
    images = [np.zeros((3, 10, 20), np.uint8), np.zeros((3, 40, 8), np.uint8)]
    first, second = detect_arrays(_GraphWithNms(True), images, score_threshold=0.1, iou_threshold=0.5,
                                  max_detections=10)
    assert first["boxes"].tolist() == [[0, 0, 10, 2.5], [10, 5, 20, 10]]  # width 20, height 10
    assert second["boxes"].tolist() == [[0, 0, 4, 10], [4, 20, 8, 40]]  # width 8, height 40


def test_classes_filter_the_detections_of_a_graph_with_nms():
    """The graph cut to max_detections already: its detections of other classes are dropped after it."""
    (only,) = detect_arrays(_GraphWithNms(True), [np.zeros((3, 4, 4), np.uint8)], score_threshold=0.1,
                            iou_threshold=0.5, max_detections=10, classes=[0])
    assert only["labels"].tolist() == [0] and only["scores"].tolist() == [np.float32(0.2)]
    assert only["boxes"].tolist() == [[2, 2, 4, 4]]


class _HeadOutputs:
    """A backend returning head outputs for two priors (xyxy [0, 0, 0.5, 0.5] and [0.5, 0.5, 1, 1]), fed pixels."""

    source = "fake.tflite"
    uint8_input = True

    def __init__(self):
        self.card = ModelCard(model_name="fake", class_names=("a", "b"), image_size=(4, 4), mean=(0, 0, 0),
                              std=(1, 1, 1), variances=(0.1, 0.2))
        self.batches = []

    def head_arrays(self, batch):
        self.batches.append(batch)
        scores = np.array([[0.9, 0.05], [0.3, 0.6]], np.float32)  # prior 0: class a; prior 1: class b
        priors = np.array([[0.25, 0.25, 0.5, 0.5], [0.75, 0.75, 0.5, 0.5]], np.float32)
        return np.zeros((len(batch), 2, 4), np.float32), np.stack([scores] * len(batch)), priors


def test_head_outputs_are_post_processed_in_numpy_and_scaled_to_each_image():
    """The numpy path: the pixels at the network size in (no normalization), the head outputs post-processed, the
    classes kept before the max_detections cut, the boxes in each original image's pixels."""
    network = _HeadOutputs()
    images = [np.zeros((3, 10, 20), np.uint8), np.zeros((3, 40, 8), np.uint8)]
    first, second = detect_arrays(network, images, score_threshold=0.1, iou_threshold=0.5, max_detections=1,
                                  classes=[1])
    (batch,) = network.batches
    assert batch.dtype == np.uint8 and batch.shape == (2, 4, 4, 3)
    assert first["labels"].tolist() == second["labels"].tolist() == [1]
    assert first["scores"].tolist() == [np.float32(0.6)]
    assert first["boxes"].tolist() == [[10, 5, 20, 10]]  # width 20, height 10
    assert second["boxes"].tolist() == [[4, 20, 8, 40]]  # width 8, height 40


def test_a_backend_without_arrays_is_refused_before_running():
    """Neither the graph's detections nor head outputs as arrays: a PyTorch-only backend."""
    with pytest.raises(MissingDependencyError, match=r"^fake\.onnx runs with PyTorch only \(not installed\): "
                                                     r"export it \(`ssd export --format onnx`, tflite, openvino or "
                                                     r"ncnn\), or pip install ssd-detect \(with PyTorch\)$"):
        detect_arrays(_GraphWithNms(False), [np.zeros((3, 4, 4), np.uint8)], score_threshold=0.1,
                      iou_threshold=0.5, max_detections=10)


@pytest.mark.slow
def test_serve_an_onnx_file_on_a_machine_without_pytorch(exported):
    """The server answers JSON detections without PyTorch, and refuses a drawn answer (PyTorch draws) with 501."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    code = f"""
        import json
        from fastapi.testclient import TestClient
        import ssd
        from ssd.serve.app import create_app

        app = create_app(ssd.load({str(exported['nms'])!r}), score_threshold=0.47)
        image = open("images/im0.png", "rb").read()
        with TestClient(app) as client:
            plain = client.post("/predict", files={{"file": ("im0.png", image, "image/png")}})
            drawn = client.post("/predict?draw=1", files={{"file": ("im0.png", image, "image/png")}})
        print(json.dumps({{"plain": [plain.status_code, plain.json()], "drawn": [drawn.status_code, drawn.json()],
                          "torch": "torch" in sys.modules}}))
    """
    done = run_without_torch(code, exported["folder"])
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"] is False
    assert report["plain"][0] == 200 and report["plain"][1]["width"] == 160 and report["plain"][1]["detections"]
    assert report["drawn"] == [501, {"error": "draw=1 needs PyTorch, which this server's runtime lacks (ask for the "
                                              "JSON detections, without draw)"}]


def test_the_client_takes_its_results_without_the_detector_or_pytorch(tmp_path):
    """``ssd.client`` imports the result types (:mod:`ssd.inference.results`), not the detector stack: with PyTorch
    installed it loads neither ``torch`` nor ``ssd.inference.detector``, and without it a ``/predict`` answer
    becomes a :class:`Result` of numpy arrays, exactly the values sent."""
    code = """
        import json, sys
        import ssd.client

        loaded = [m for m in ("torch", "ssd.inference.detector", "ssd.inference.backends") if m in sys.modules]
        answer = {"width": 64, "height": 48, "detections": [{"box": [1.5, 2.0, 30.25, 40.0], "score": 0.75,
                                                             "label": 2, "name": "c"}]}
        result = ssd.client._result(answer, "a.png")
        print(json.dumps({"loaded": loaded, "kind": type(result.boxes).__module__, "result": result.to_dict(),
                          "dtypes": [str(result.boxes.dtype), str(result.labels.dtype)]}))
    """
    src = str(Path(__file__).resolve().parents[1] / "src")
    with_torch = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                                timeout=60, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"})
    assert with_torch.returncode == 0, with_torch.stderr
    without = run_without_torch(code, tmp_path)
    assert without.returncode == 0, without.stderr
    sent = {"file": "a.png", "width": 64, "height": 48,
            "detections": [{"box": [1.5, 2.0, 30.25, 40.0], "score": 0.75, "label": 2, "name": "c"}]}
    assert json.loads(with_torch.stdout)["loaded"] == [] and json.loads(with_torch.stdout)["kind"] == "torch"
    assert json.loads(without.stdout) == {"loaded": [], "kind": "numpy", "result": sent,
                                          "dtypes": ["float32", "int64"]}


@pytest.mark.slow
def test_a_graph_taking_uint8_pixels_detects_as_the_float_graph_on_both_paths(exported):
    """``--uint8-input``: the numpy path only resizes (no normalization outside the graph), the PyTorch path's
    normalized batch is turned back into the same pixels; both give the float graph's detections."""
    import ssd
    from ssd.inference.backends.onnx import OnnxBackend

    uint8, floating = OnnxBackend(exported["uint8"]), OnnxBackend(exported["nms"])
    assert uint8.uint8_input and not floating.uint8_input
    images = [np.asarray(__import__("PIL.Image").Image.open(p)).transpose(2, 0, 1).copy()
              for p in sorted(exported["images"].glob("*.png"))]
    options = dict(score_threshold=0.3, iou_threshold=uint8.card.nms.iou_threshold, max_detections=100)
    for a, b in zip(detect_arrays(uint8, images, **options), detect_arrays(floating, images, **options)):
        assert a["labels"].tolist() == b["labels"].tolist() and len(a["labels"]) > 0
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-5)
        np.testing.assert_allclose(a["boxes"], b["boxes"], atol=1e-3)
    got, expected = (ssd.load(p).predict(sorted(exported["images"].glob("*.png")), score_threshold=0.3)
                     for p in (exported["uint8"], exported["nms"]))
    for a, b in zip(got, expected):
        assert a.labels.tolist() == b.labels.tolist()
        assert (a.scores - b.scores).abs().max() < 1e-5 and (a.boxes - b.boxes).abs().max() < 1e-3


@pytest.mark.slow
def test_an_openvino_graph_taking_uint8_pixels_detects_as_the_float_graph(exported, tiny_checkpoint, tmp_path):
    """``--format openvino --uint8-input``: the IR takes the pixels (NHWC uint8) and normalizes them itself; both
    paths (numpy's post-processing, PyTorch's) give the detections of the float ONNX graph."""
    pytest.importorskip("openvino")
    import ssd
    from ssd.export import export
    from ssd.inference.backends.onnx import OnnxBackend
    from ssd.inference.backends.openvino import OpenVinoBackend

    folder = export(tiny_checkpoint, "openvino", out_path=tmp_path / "uint8_openvino", uint8_input=True, check=False)
    uint8, floating = OpenVinoBackend(folder), OnnxBackend(exported["plain"])
    assert uint8.uint8_input and not floating.uint8_input
    assert uint8.session.get_inputs()[0].shape == [1, 128, 128, 3]
    images = [np.asarray(__import__("PIL.Image").Image.open(p)).transpose(2, 0, 1).copy()
              for p in sorted(exported["images"].glob("*.png"))]
    options = dict(score_threshold=0.3, iou_threshold=0.45, max_detections=100)
    for a, b in zip(detect_arrays(uint8, images, **options), detect_arrays(floating, images, **options)):
        assert a["labels"].tolist() == b["labels"].tolist() and len(a["labels"]) > 0
        np.testing.assert_allclose(a["scores"], b["scores"], atol=1e-5)
        np.testing.assert_allclose(a["boxes"], b["boxes"], atol=1e-3)
    got, expected = (ssd.load(p).predict(sorted(exported["images"].glob("*.png")), score_threshold=0.3)
                     for p in (folder, exported["plain"]))
    for a, b in zip(got, expected):
        assert a.labels.tolist() == b.labels.tolist()
        assert (a.scores - b.scores).abs().max() < 1e-5 and (a.boxes - b.boxes).abs().max() < 1e-3


def test_uint8_input_is_refused_outside_fp32_onnx(tiny_checkpoint):
    from ssd.export import export

    with pytest.raises(ValueError, match=r"^--uint8-input applies to FP32 ONNX and OpenVINO exports \(--format onnx "
                                         r"or openvino, without --int8\)$"):
        export(tiny_checkpoint, "pt2", uint8_input=True)

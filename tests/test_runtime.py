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

from ssd.arrays import detect_arrays, preprocess_arrays
from ssd.card import ModelCard
from ssd.errors import MissingDependencyError
from ssd.preprocess import preprocess
from ssd.settings import Thresholds

pytest.importorskip("onnxruntime")

# Installed first in the subprocess: any import of torch or torchvision fails, as on a machine without them.
NO_TORCH = textwrap.dedent("""
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "torchvision"):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
""")


def run_without_torch(code: str, cwd: Path) -> subprocess.CompletedProcess:
    src = Path(__file__).resolve().parents[1] / "src"
    return subprocess.run([sys.executable, "-c", NO_TORCH + textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=240, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    """The tiny checkpoint as ONNX with NMS inside (any batch), float or uint8 NHWC input, and three images."""
    from PIL import Image

    from ssd.export.onnx import export_onnx

    folder = tmp_path_factory.mktemp("runtime")
    images = folder / "images"
    images.mkdir()
    rng = np.random.default_rng(0)
    for index, (h, w) in enumerate([(96, 160), (128, 128), (200, 150)]):
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images / f"im{index}.png")
    nms = export_onnx(tiny_checkpoint, folder / "nms.onnx", nms=True, dynamic_batch=True, check=False,
                      score_threshold=0.05)
    uint8 = export_onnx(tiny_checkpoint, folder / "uint8.onnx", nms=True, dynamic_batch=True, check=False,
                        score_threshold=0.05, uint8_input=True)
    return {"nms": nms, "uint8": uint8, "images": images, "folder": folder}


@pytest.mark.slow
def test_predict_an_onnx_file_on_a_machine_without_pytorch(exported):
    """`ssd predict` and `ssd.load(p).predict` on an ONNX file with NMS inside: torch is never imported, and the
    boxes are those of the PyTorch path (same graph; the resize may differ by one pixel level)."""
    import ssd

    code = f"""
        import json
        import ssd
        from ssd.cli import main

        code = main(["predict", "--weights", {str(exported['nms'])!r}, "--source", "images", "--project", "runs",
                     "--conf", "0.47", "--quiet"])
        results = ssd.load({str(exported['nms'])!r}).predict(sorted(__import__("glob").glob("images/*.png")),
                                                              score_threshold=0.47)
        print(json.dumps({{"code": code, "torch": "torch" in sys.modules, "api": [r.to_dict() for r in results]}}))
    """
    done = run_without_torch(code, exported["folder"])
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["code"] == 0 and report["torch"] is False
    assert "drawn copies (--save-images, --show) need PyTorch" in done.stderr
    lines = (exported["folder"] / "runs" / "exp" / "predictions.jsonl").read_text().splitlines()
    cli = sorted((json.loads(line) for line in lines), key=lambda r: r["file"])
    api = report["api"]
    expected = ssd.load(exported["nms"]).predict(sorted(exported["images"].glob("*.png")), score_threshold=0.47)
    assert [r["file"] for r in cli] == [f"images/im{i}.png" for i in range(3)]
    for from_cli, from_api, torch_result in zip(cli, api, expected):
        assert from_cli["detections"] == from_api["detections"]  # one path, two front ends
        assert (from_api["width"], from_api["height"]) == (torch_result.width, torch_result.height)
        got = from_api["detections"]
        assert len(got) == len(torch_result.scores) > 0
        scores = np.array([d["score"] for d in got])
        assert np.abs(scores - torch_result.scores.numpy()).max() < 0.01
        # near-equal scores may swap places: each box has its twin (same label, within a pixel) on the other side,
        # but for those that compete with a score 0.01 away for the last of the max_det places
        boxes, labels = np.array([d["box"] for d in got]), np.array([d["label"] for d in got])
        twins = np.abs(boxes[:, None] - torch_result.boxes.numpy()[None]).max(-1) < 1.0
        twins &= labels[:, None] == torch_result.labels.numpy()[None]
        sure = scores > scores[-1] + 0.01 if len(scores) == 100 else np.ones(len(scores), bool)
        assert sure.sum() >= 5 and twins.any(1)[sure].all() and twins.any(0)[sure].all()


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


def test_graph_without_nms_is_refused_before_running():
    with pytest.raises(MissingDependencyError, match=r"^fake\.onnx returns head outputs, whose post-processing "
                                                     r"needs PyTorch \(not installed\)"):
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


def test_uint8_input_is_refused_outside_fp32_onnx(tiny_checkpoint):
    from ssd.export import export

    with pytest.raises(ValueError, match=r"^--uint8-input applies to FP32 ONNX exports \(--format onnx, without "
                                         r"--int8\)$"):
        export(tiny_checkpoint, "pt2", uint8_input=True)

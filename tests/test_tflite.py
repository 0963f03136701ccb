"""TFLite export (litert-torch) and its backend (ai-edge-litert): parity with PyTorch, the model card inside the file
and its checksum, MediaPipe's ObjectDetector on the same file, and the refusals (options, converter failures, a
missing runtime)."""

import importlib.util
import io
import json
import re
import sys
import zipfile

import numpy as np
import pytest
import torch

import ssd.limits as limits
from builders import biased_model, predicts_as_pytorch_without_it, random_images, write_png_images
from ssd.boxes import decode
from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.errors import ExportCheckError, MissingDependencyError, OnnxModelError
from ssd.export import export
from ssd.export import tflite as tflite_export
from ssd.export.tflite import converter_error
from ssd.inference.backends.tflite import METADATA_FILE, TfliteBackend, split_tflite
from ssd.inference.detector import Detector, load
from ssd.models.load import model_from_checkpoint

if importlib.util.find_spec("litert_torch") is None:  # looked up, not imported: the converter runs in a child process
    pytest.skip("TFLite export needs litert-torch (pip install 'ssd-detect[tflite]')", allow_module_level=True)
pytest.importorskip("ai_edge_litert", reason="TFLite inference needs ai-edge-litert (pip install 'ssd-detect[tflite]')")


@pytest.fixture(scope="module")
def tiny_tflite(tiny_checkpoint, tmp_path_factory):
    """``ssd export --format tflite`` of the tiny checkpoint (checked against PyTorch on two images); the converter
    (and the JAX it imports) ran in a child process, never in this one."""
    before = set(sys.modules)
    path = export(tiny_checkpoint, fmt="tflite", out_path=tmp_path_factory.mktemp("tflite") / "best.tflite",
                  sample_images=random_images(2))
    assert not {name for name in set(sys.modules) - before if name.split(".")[0] in ("litert_torch", "jax")}
    return path


def rewritten(path, target, **changes):
    """``path``'s file at ``target`` with associated files replaced (``name=bytes``, ``name=None`` removes it)."""
    flatbuffer, files = split_tflite(path.read_bytes(), str(path))
    files.update(changes)
    archive = io.BytesIO()
    archive.write(flatbuffer)
    with zipfile.ZipFile(archive, "a") as zf:
        for name, data in files.items():
            if data is not None:
                zf.writestr(name, data)
    target.write_bytes(archive.getvalue())
    return target


@pytest.mark.slow
def test_tflite_export_takes_uint8_nhwc_and_matches_pytorch(tiny_checkpoint, tiny_tflite):
    backend = load(tiny_tflite).backend
    assert isinstance(backend, TfliteBackend) and backend.card.precision == "fp32"
    model = model_from_checkpoint(tiny_checkpoint).eval()
    assert backend.card.class_names == ("circle", "square", "triangle") and backend.card.image_size == (128, 128)
    details = backend.interpreter.get_input_details()[0]
    assert details["dtype"] == np.uint8 and list(details["shape"]) == [1, 128, 128, 3]
    assert torch.equal(backend.priors, model.priors)
    images = random_images(3)
    expected = Detector(model).predict(images, score_threshold=0.3)
    got = load(tiny_tflite).predict(images, score_threshold=0.3)
    for a, b in zip(expected, got):
        assert len(a.scores) == len(b.scores) > 0 and torch.equal(a.labels, b.labels)
        assert torch.allclose(a.boxes, b.boxes, atol=1e-2) and torch.allclose(a.scores, b.scores, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("member, data, message", [
    ("labels.txt", b"circle\nsquare\nhexagon", r"the network \(weights or graph\) does not match the checksum"),
    (METADATA_FILE, "class_names", r"class_names \(\['circle', 'square', 'hexagon'\]\) is not what was written"),
    (METADATA_FILE, None, r"has no model card \(ssd\.json among its associated files\)"),
])
def test_an_edited_tflite_file_is_refused_naming_the_file_and_what_changed(tiny_tflite, tmp_path, member, data,
                                                                            message):
    if data == "class_names":
        card = json.loads(split_tflite(tiny_tflite.read_bytes(), "")[1][METADATA_FILE])
        data = json.dumps({**card, "class_names": json.dumps(["circle", "square", "hexagon"])}).encode()
    edited = rewritten(tiny_tflite, tmp_path / "edited.tflite", **{member: data})
    with pytest.raises(OnnxModelError, match=rf"^{tmp_path}/edited\.tflite.*{message}"):
        load(edited)


@pytest.mark.slow
def test_a_tflite_file_predicts_without_pytorch_as_with_it(tiny_tflite, tmp_path):
    """The runtime without PyTorch: the graph's probabilities post-processed in numpy, torch never imported."""
    write_png_images(tmp_path)
    predicts_as_pytorch_without_it(tiny_tflite, tmp_path, 0.3)


@pytest.mark.slow
def test_a_tflite_graph_over_the_memory_bound_is_refused_before_allocating(tiny_tflite, monkeypatch):
    """The bound is the bytes of every tensor the graph states (shape x dtype size), summed before allocation."""
    from ai_edge_litert.interpreter import Interpreter

    graph = Interpreter(model_content=split_tflite(tiny_tflite.read_bytes(), "")[0])
    needed = sum(int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize for d in graph.get_tensor_details())
    assert 2**20 < needed < 2**24  # ssd_tiny at 128 px: a few MiB
    monkeypatch.setattr(limits, "MAX_GRAPH_BYTES", needed)
    TfliteBackend(tiny_tflite)
    monkeypatch.setattr(limits, "MAX_GRAPH_BYTES", needed - 1)
    with pytest.raises(OnnxModelError, match=rf"^{re.escape(str(tiny_tflite))} is refused: its graph's tensors take "
                                             r"0\.0 GiB at batch 1, more than limits\.MAX_GRAPH_BYTES \("):
        TfliteBackend(tiny_tflite)


@pytest.mark.slow
def test_flipped_weight_bytes_of_a_tflite_file_fail_the_checksum(tiny_tflite, tmp_path):
    data = bytearray(tiny_tflite.read_bytes())
    data[len(data) // 3] ^= 0x10  # inside the flatbuffer's weights (the zip is a few KB at the end)
    damaged = tmp_path / "damaged.tflite"
    damaged.write_bytes(bytes(data))
    with pytest.raises(OnnxModelError, match=r"damaged\.tflite: the network \(weights or graph\) does not match"):
        load(damaged)


@pytest.mark.slow
def test_mediapipe_object_detector_runs_the_file_as_it_is(tiny_tflite):
    """MediaPipe decodes with the anchors of the metadata, keeps each box's best class and runs its own NMS: each of
    its detections is one of ours (same class, score, box within its whole-pixel rounding). The images are at the
    network size: MediaPipe resizes without antialiasing, so other sizes give it other pixels."""
    pytest.importorskip("mediapipe", reason="MediaPipe is not installed (pip install 'ssd-detect[tflite]')")
    import mediapipe as mp
    from mediapipe.tasks.python import BaseOptions, vision
    from torchvision.ops import box_iou

    options = vision.ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=str(tiny_tflite)),
                                           score_threshold=0.3, max_results=20)
    generator = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 128, 128), dtype=torch.uint8, generator=generator) for _ in range(2)]
    ours = load(tiny_tflite).predict(images, score_threshold=0.3, max_detections=100)
    with vision.ObjectDetector.create_from_options(options) as detector:
        for image, result in zip(images, ours):
            pixels = np.ascontiguousarray(image.permute(1, 2, 0).numpy())
            found = detector.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels)).detections
            assert len(found) > 0
            for detection in found:
                box = detection.bounding_box
                xyxy = torch.tensor([[box.origin_x, box.origin_y, box.origin_x + box.width,
                                      box.origin_y + box.height]], dtype=torch.float32)
                category = detection.categories[0]
                label = ["circle", "square", "triangle"].index(category.category_name)
                close = ((result.labels == label) & ((result.scores - category.score).abs() < 1e-4)
                         & (box_iou(xyxy, result.boxes)[0] > 0.5))
                assert close.any(), (category, box)


def test_tflite_options_are_refused_before_any_work(tiny_checkpoint, tmp_path):
    with pytest.raises(ValueError, match=r"^--nms applies to ONNX and OpenVINO exports: a TFLite file is the edge "
                                         r"pipeline"):
        export(tiny_checkpoint, fmt="tflite", out_path=tmp_path / "m.tflite", nms=True)
    with pytest.raises(ValueError, match=r"^--fp16 applies to TFLite exports without --int8"):
        export(tiny_checkpoint, fmt="onnx", out_path=tmp_path / "m.onnx", fp16=True)
    with pytest.raises(ValueError, match=r"must end in \.tflite"):
        export(tiny_checkpoint, fmt="tflite", out_path=tmp_path / "m.onnx")
    assert not list(tmp_path.iterdir())


def test_a_converter_failure_is_one_line_and_writes_nothing():
    error = converter_error(RuntimeError("Traceback (most recent call last):\n  File x\nerror: 'tfl.foo' op is not "
                                         "supported"), "ssd_tiny")
    assert str(error) == ("litert-torch could not convert ssd_tiny to TFLite (RuntimeError: error: 'tfl.foo' op is not "
                          "supported); nothing was written")


@pytest.mark.parametrize("script, message", [
    ("import sys; print('progress'); sys.stderr.write('absl: noise\\nssd-converter-error: litert-torch could not "
     "convert ssd_tiny (E: x); nothing was written\\n'); sys.exit(1)",
     "litert-torch could not convert ssd_tiny (E: x); nothing was written"),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
     "the TFLite converter process was killed by signal 9 before it finished (out of memory?); nothing was written"),
    ("import sys; sys.exit(3)", "the TFLite converter process exited with code 3 before it finished"),
])
def test_the_converter_process_failing_or_killed_is_one_line_and_writes_nothing(tiny_checkpoint, tmp_path,
                                                                                 monkeypatch, script, message):
    monkeypatch.setattr(tflite_export, "converter_command", lambda *args: [sys.executable, "-c", script])
    with pytest.raises(ExportCheckError, match=f"^{re.escape(message)}"):
        export(tiny_checkpoint, fmt="tflite", out_path=tmp_path / "m.tflite")
    assert not list(tmp_path.iterdir())


def test_a_missing_runtime_names_the_tflite_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)
    with pytest.raises(MissingDependencyError, match=r"running a TFLite model needs ai_edge_litert\.interpreter, "
                                                     r"from the optional 'tflite' dependencies: pip install "
                                                     r"'ssd-detect\[tflite\]'"):
        TfliteBackend(tmp_path / "m.tflite")


@pytest.mark.slow
def test_int8_export_is_full_integer_and_close_to_fp32(tiny_checkpoint, tiny_tflite, synthetic_voc, tmp_path,
                                                       ssd_messages):
    """Every tensor an integer (uint8 pixels in, int8 inside, uint8 out), under a third of the size, on validation
    images the tolerance stated for ONNX Runtime INT8 (scores within 0.03, decoded boxes within 1% of the image),
    and MediaPipe runs it too."""
    from ssd.export.tflite_int8 import float_ops

    path = export(tiny_checkpoint, fmt="tflite", out_path=tmp_path / "m.int8.tflite", int8=True,
                  data=synthetic_voc, calib_images=8)
    assert "INT8: every op of the graph is integer, its input and outputs included" in ssd_messages()
    flatbuffer, _ = split_tflite(path.read_bytes(), str(path))
    assert float_ops(flatbuffer) == []
    assert float_ops(split_tflite(tiny_tflite.read_bytes(), "")[0])[0].startswith("CAST (")  # FP32: uint8 -> float
    int8, fp32 = TfliteBackend(path), TfliteBackend(tiny_tflite)
    assert int8.card.precision == "int8" and int8.interpreter.get_input_details()[0]["quantization"] == (1.0, 0)
    assert [d["dtype"] for d in int8.interpreter.get_output_details()] == [np.uint8, np.uint8]
    assert path.stat().st_size <= 0.3 * tiny_tflite.stat().st_size
    images = [read_image(record.path) for record in load_dataset(synthetic_voc).records("val")[:8]]
    batch = Detector(fp32).preprocess(images)[0]
    (loc, logits), (loc8, logits8) = fp32(batch), int8(batch)
    assert (logits8.softmax(-1) - logits.softmax(-1)).abs().max() <= 0.03
    variances = fp32.card.variances
    assert (decode(loc8, fp32.priors, variances) - decode(loc, fp32.priors, variances)).abs().max() <= 0.01
    if importlib.util.find_spec("mediapipe") is not None:
        import mediapipe as mp
        from mediapipe.tasks.python import BaseOptions, vision

        options = vision.ObjectDetectorOptions(base_options=BaseOptions(model_asset_path=str(path)))
        with vision.ObjectDetector.create_from_options(options) as detector:
            pixels = np.ascontiguousarray(images[0].permute(1, 2, 0).numpy())
            detector.detect(mp.Image(image_format=mp.ImageFormat.SRGB, data=pixels))


@pytest.mark.slow
def test_ssdlite_int8_export_is_full_integer_and_close_to_pytorch(synthetic_voc, tmp_path, ssd_messages):
    """MobileNetV3's batch norms, in-place activations, hard sigmoids and residual sums all quantize: no op of
    SSDLite's INT8 graph is left in float, and on validation images it keeps the INT8 tolerance against PyTorch."""
    from ssd.export.tflite_int8 import float_ops
    from ssd.weights.checkpoint import save_checkpoint

    model = biased_model("ssdlite320_mobilenet_v3_large", class_names=["circle", "square", "triangle"],
                         image_size=160)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # batch norms that change the convolutions they fold into, boxes that move
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.uniform_(-0.2, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
        for head in model.heads:
            [m for m in head.loc.modules() if isinstance(m, torch.nn.Conv2d)][-1].weight.normal_(
                0, 0.05, generator=generator)
    weights = save_checkpoint(tmp_path / "lite.pt", model)
    path = export(weights, fmt="tflite", out_path=tmp_path / "lite.int8.tflite", int8=True, data=synthetic_voc,
                  calib_images=16)
    assert "INT8: every op of the graph is integer, its input and outputs included" in ssd_messages()
    assert float_ops(split_tflite(path.read_bytes(), str(path))[0]) == []
    int8 = TfliteBackend(path)
    images = [read_image(record.path) for record in load_dataset(synthetic_voc).records("val")[:4]]
    batch = Detector(int8).preprocess(images)[0]
    (loc8, logits8) = int8(batch)
    with torch.no_grad():
        loc, logits = model.eval()(batch)
    assert (logits8.softmax(-1) - logits.softmax(-1)).abs().max() <= 0.03
    variances = int8.card.variances
    assert (decode(loc8, int8.priors, variances) - decode(loc, int8.priors, variances)).abs().max() <= 0.01


def test_int8_with_fewer_images_than_asked_says_how_many_it_found(tiny_checkpoint, synthetic_voc, tmp_path):
    with pytest.raises(ValueError, match=r"^INT8 calibration asked for 100 images \(--calib-images\) but the "
                                         r"training split of .* has 48"):
        export(tiny_checkpoint, fmt="tflite", out_path=tmp_path / "m.tflite", int8=True, data=synthetic_voc,
               calib_images=100)
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_ssd_val_and_predict_take_a_tflite_file(tiny_tflite, synthetic_voc, tmp_path, capsys):
    from ssd.cli import main

    assert main(["val", "--weights", str(tiny_tflite), "--data", str(synthetic_voc), "--project", str(tmp_path),
                 "--name", "val"]) == 0
    image = next((synthetic_voc / "JPEGImages").iterdir())
    assert main(["predict", "--weights", str(tiny_tflite), "--source", str(image), "--project", str(tmp_path),
                 "--name", "predict"]) == 0
    captured = capsys.readouterr()
    assert "1 image, " in captured.out + captured.err

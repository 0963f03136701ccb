"""ONNX export: parity with PyTorch (ssd_tiny and SSD300, batch 1 and dynamic batch), in-graph NMS against
``postprocess_detections``, metadata, the parity check failing loudly, torch.export."""

import inspect
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from builders import biased_model, random_images
from ssd.cli import main
from ssd.errors import ConfigError, ExportCheckError, OnnxModelError, OutputError
from ssd.export import check_export_folder, export
from ssd.export.onnx import export_onnx
from ssd.export.parity import check_onnx
from ssd.export.pt2 import export_pt2
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.backends.pt2 import ExportedProgramBackend
from ssd.inference.detector import Detector, load
from ssd.postprocess import CANDIDATES_PER_CLASS, postprocess_detections
from ssd.schemas import ExportConfig
from ssd.weights.checkpoint import save_checkpoint


def run_raw(path, batch: torch.Tensor) -> list[torch.Tensor]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return [torch.from_numpy(v) for v in session.run(None, {"images": batch.numpy()})]


@pytest.fixture(scope="module")
def tiny():
    return biased_model("ssd_tiny")


@pytest.fixture(scope="module")
def tiny_onnx(tiny, tmp_path_factory):
    """``ssd export`` of a checkpoint: batch 1, no NMS, checked with ONNX Runtime on two images."""
    weights = save_checkpoint(tmp_path_factory.mktemp("export") / "best.pt", tiny)
    return export(weights, fmt="onnx", sample_images=random_images(2))


@pytest.mark.slow
def test_tiny_onnx_batch1_matches_pytorch(tiny, tiny_onnx):
    assert tiny_onnx.name == "best.onnx" and tiny_onnx.with_suffix(".pt").is_file()  # next to the weights
    batch, _ = tiny.preprocess(random_images(1))
    with torch.no_grad():
        loc, logits = tiny(batch)
    got_loc, got_logits, priors = run_raw(tiny_onnx, batch)
    torch.testing.assert_close(got_loc, loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got_logits, logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(priors, tiny.priors)

    session = ort.InferenceSession(str(tiny_onnx), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape == [1, 3, tiny.image_size, tiny.image_size]
    assert [o.name for o in session.get_outputs()] == ["loc", "logits", "priors"]
    meta = session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["class_names"]) == tiny.class_names
    assert int(meta["image_size"]) == tiny.image_size
    assert json.loads(meta["mean"]) == pytest.approx(tiny.config.mean)
    assert json.loads(meta["std"]) == pytest.approx(tiny.config.std)
    assert json.loads(meta["variances"]) == pytest.approx(tiny.config.variances)
    assert json.loads(meta["nms"]) is False


@pytest.mark.slow
def test_ssd300_dynamic_batch_onnx_matches_pytorch(tmp_path):
    model = biased_model("ssd300_vgg16", num_classes=2)
    path = export_onnx(model, tmp_path / "ssd300.onnx", dynamic_batch=True)  # the parity check runs inside too
    batch, _ = model.preprocess(random_images(2))
    with torch.no_grad():
        loc, logits = model(batch)
    got_loc, got_logits, priors = run_raw(path, batch)
    assert got_loc.shape == (2, 8732, 4) and priors.shape == (8732, 4)
    torch.testing.assert_close(got_loc, loc, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(got_logits.softmax(-1), logits.softmax(-1), atol=1e-4, rtol=0)


@pytest.mark.slow
def test_nms_export_equals_postprocess_batch1_and_dynamic(tiny, tmp_path):
    conf, iou, max_det = 0.3, 0.45, 50
    path = export_onnx(tiny, tmp_path / "nms.onnx", dynamic_batch=True, nms=True, score_threshold=conf,
                       iou_threshold=iou, max_detections=max_det)
    meta = ort.InferenceSession(str(path)).get_modelmeta().custom_metadata_map
    assert (float(meta["score_threshold"]), float(meta["iou_threshold"]), int(meta["max_det"])) == (conf, iou, max_det)
    for count in (1, 3):
        batch, _ = tiny.preprocess(random_images(count))
        with torch.no_grad():
            loc, logits = tiny(batch)
        expected = postprocess_detections(loc, logits, tiny.priors, score_threshold=conf, iou_threshold=iou,
                                          max_detections=max_det)
        rows, counts = run_raw(path, batch)
        assert rows.shape == (count, max_det, 6) and counts.dtype == torch.int64
        for image, (want, got, n) in enumerate(zip(expected, rows, counts.tolist())):
            assert n == len(want["scores"]) > 0, f"image {image} of {count}"
            torch.testing.assert_close(got[:n, :4], want["boxes"], atol=1e-4, rtol=0)
            torch.testing.assert_close(got[:n, 4], want["scores"], atol=1e-5, rtol=0)
            assert got[:n, 5].long().tolist() == want["labels"].tolist()
            padding = got[n:]
            assert (padding[:, :5] == 0).all() and (padding[:, 5] == -1).all()

    detector = load(path)  # stricter conf and fewer detections are applied to the graph's output
    images = random_images(2)
    want = Detector(tiny).predict(images, score_threshold=0.35, iou_threshold=iou, max_detections=10)
    got = detector.predict(images, score_threshold=0.35, iou_threshold=iou, max_detections=10)
    for result, expected in zip(got, want):
        assert result.labels.tolist() == expected.labels.tolist() and len(result.labels) > 0
        torch.testing.assert_close(result.boxes, expected.boxes, atol=1e-3, rtol=0)
    with pytest.raises(ValueError, match=r"exported with NMS at score_threshold=0.3, iou_threshold=0.45, "
                                         r"max_detections=50; got score_threshold=0.1"):
        detector.predict(images, score_threshold=0.1)


def test_check_fails_loudly_when_outputs_differ(tiny_onnx):
    changed = biased_model("ssd_tiny", seed=1)  # same architecture, other weights
    with pytest.raises(ExportCheckError, match="differ from PyTorch's: largest box difference"):
        check_onnx(changed, tiny_onnx)


def test_parity_accepts_a_swap_at_the_max_detections_cut_and_nothing_else():
    """Two detections kept of many near-tied ones: the second differs between the runtimes, its score equal within the
    tolerance to the other side's lowest. Accepted while the other side is full (a tie at the cut), refused when the
    other side kept fewer than ``max_detections`` (then it is a missing detection)."""
    from types import SimpleNamespace

    from ssd.export.parity import _unmatched
    from ssd.settings import Thresholds

    def result(boxes, scores):
        return SimpleNamespace(boxes=torch.tensor(boxes, dtype=torch.float32), scores=torch.tensor(scores),
                               labels=torch.zeros(len(scores), dtype=torch.int64))

    onnx = result([[0, 0, 10, 10], [50, 50, 60, 60]], [0.9, 0.26195])
    torch_side = result([[0, 0, 10, 10], [80, 80, 90, 90]], [0.9, 0.26194])
    scale = torch.tensor([100.0, 100, 100, 100])
    full = Thresholds(0.01, 0.45, 2)
    assert _unmatched(onnx, torch_side, scale, full, 1e-3, 1e-4) is None
    assert _unmatched(torch_side, onnx, scale, full, 1e-3, 1e-4) is None
    room = Thresholds(0.01, 0.45, 3)
    assert _unmatched(onnx, torch_side, scale, room, 1e-3, 1e-4) == (
        "detection 1 (label 0, score 0.261950, box [50.0, 50.0, 60.0, 60.0])")
    stronger = result([[0, 0, 10, 10], [50, 50, 60, 60]], [0.9, 0.5])  # well above the cut: a real difference
    assert _unmatched(stronger, torch_side, scale, full, 1e-3, 1e-4) == (
        "detection 1 (label 0, score 0.500000, box [50.0, 50.0, 60.0, 60.0])")


def test_pytorch_program_exports_refuse_graph_options(tiny, tmp_path):
    weights = save_checkpoint(tmp_path / "best.pt", tiny)
    with pytest.raises(ValueError, match=r"^--nms and --int8 apply to ONNX and OpenVINO exports: a torch\.export "
                                         r"program is the network alone \(any batch size"):
        export(weights, fmt="pt2", nms=True, int8=True)
    with pytest.raises(ValueError, match=r"^TorchScript export is retired \(torch\.jit is deprecated by PyTorch\): "
                                         r"use --format pt2"):
        export(weights, fmt="torchscript")
    assert not list(tmp_path.glob("best.*[!t]"))


def test_export_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="unknown export format 'tfjs'"):
        export(tmp_path / "best.pt", fmt="tfjs")


@pytest.mark.slow
def test_pt2_export_matches_pytorch_at_any_batch_size(tiny, tmp_path):
    backend = ExportedProgramBackend(export_pt2(tiny, tmp_path / "tiny.pt2"))
    for count in (1, 3):
        batch, _ = tiny.preprocess(random_images(count))
        with torch.no_grad():
            for got, want in zip(backend(batch), tiny(batch)):
                torch.testing.assert_close(got, want)
    assert torch.equal(backend.priors, tiny.priors)
    assert backend.card == tiny.card.sealed(backend.card.checksum["network"])


def test_onnx_nms_strict_score_threshold():
    """The eager op follows ONNX NonMaxSuppression: scores equal to the threshold are dropped, IoU > iou suppresses."""
    boxes = torch.tensor([[[0, 0, 10, 10], [0, 0, 10, 9], [20, 20, 30, 30], [40, 40, 50, 50]]], dtype=torch.float32)
    scores = torch.tensor([[[0.9, 0.8, 0.5, 0.3]]])
    kept = torch.ops.ssd.onnx_nms(boxes, scores, 0.5, 0.3)
    assert kept.tolist() == [[0, 0, 0], [0, 0, 2]]
    session_kept = _ort_nms(boxes, scores, 0.5, 0.3)
    assert sorted(map(tuple, session_kept.tolist())) == [(0, 0, 0), (0, 0, 2)]


def _ort_nms(boxes, scores, iou, score):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("NonMaxSuppression", ["boxes", "scores", "max", "iou", "score"], ["kept"])
    graph = helper.make_graph(
        [node], "nms",
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("kept", TensorProto.INT64, None)],
        [helper.make_tensor("max", TensorProto.INT64, [1], [100]),
         helper.make_tensor("iou", TensorProto.FLOAT, [1], [iou]),
         helper.make_tensor("score", TensorProto.FLOAT, [1], [score])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(onnx.shape_inference.infer_shapes(model).SerializeToString())
    return session.run(None, {"boxes": boxes.numpy(), "scores": scores.numpy()})[0].astype(np.int64)


@pytest.mark.slow
def test_in_graph_nms_equals_postprocess_on_the_same_outputs(tiny, tmp_path):
    """Both graphs run on one batch; ``postprocess_detections`` of the raw graph's outputs must give the NMS graph's
    rows, in the
    regime where the candidate cap binds (every prior of every class above the threshold)."""
    conf, iou, max_det = 0.05, 0.45, 200
    raw = export_onnx(tiny, tmp_path / "raw.onnx", dynamic_batch=True, check=False)
    nms = export_onnx(tiny, tmp_path / "nms.onnx", dynamic_batch=True, nms=True, check=False, score_threshold=conf,
                      iou_threshold=iou, max_detections=max_det)
    meta = ort.InferenceSession(str(nms)).get_modelmeta().custom_metadata_map
    assert int(meta["candidates_per_class"]) == CANDIDATES_PER_CLASS
    batch, _ = tiny.preprocess(random_images(3))
    loc, logits, priors = run_raw(raw, batch)
    assert int((logits.softmax(-1)[..., 1:] > conf).sum(1).min()) > CANDIDATES_PER_CLASS
    expected = postprocess_detections(loc, logits, priors, score_threshold=conf, iou_threshold=iou,
                                      max_detections=max_det)
    rows, counts = run_raw(nms, batch)
    for want, got, n in zip(expected, rows, counts.tolist()):
        assert n == len(want["scores"]) == max_det
        torch.testing.assert_close(got[:n, :4], want["boxes"], atol=1e-5, rtol=0)
        torch.testing.assert_close(got[:n, 4], want["scores"], atol=1e-6, rtol=0)
        assert got[:n, 5].long().tolist() == want["labels"].tolist()


def test_export_refuses_to_overwrite_the_weights(tiny, tmp_path, capsys):
    weights = save_checkpoint(tmp_path / "best.pt", tiny)
    before = weights.read_bytes()
    link = tmp_path / "link.onnx"
    link.symlink_to(weights)
    for out in (weights, link, tmp_path / "." / "best.pt"):
        with pytest.raises(ValueError, match=r"--output .* is the input .*best\.pt \(the same file\); choose "
                                             r"another --output so the input is kept"):
            export(weights, out_path=out)
    with pytest.raises(ValueError, match=r"is the input .*best\.pt \(the same file\)"):
        export(weights, fmt="pt2", out_path=weights)
    with pytest.raises(ValueError, match=r"--output .*best\.pt is the input .*best\.pt \(the same file\)"):
        export_onnx(weights, weights)
    assert main(["export", "--weights", str(weights), "--output", str(weights)]) == 1
    assert "(the same file)" in capsys.readouterr().err
    assert weights.read_bytes() == before


def with_metadata(source, target, **changes):
    """A copy of an ONNX file with metadata keys changed (``None`` removes one); the graph is untouched."""
    proto = onnx.load(str(source))
    props = {p.key: p.value for p in proto.metadata_props}
    props.update(changes)
    onnx.helper.set_model_props(proto, {k: v for k, v in props.items() if v is not None})
    onnx.save(proto, str(target))
    return target


@pytest.mark.parametrize("changes, message", [
    (dict(image_size=None), r"the model card lacks image_size \(has "),
    (dict(mean=None, std=None), r"the model card lacks mean, std \(has "),
    (dict(nms=None), r"the model card lacks nms \(has "),
    (dict(class_names=None, image_size=None), r"was not written by `ssd export` \(no class_names or image_size"),
    (dict(class_names='["a", "b"]'), r"class_names \(\['a', 'b'\]\) is not what was written with the model"),
    (dict(image_size="300"), r"image_size \(300\) is not what was written with the model"),
    (dict(mean="[0.5]"), r"mean=\[0.5\] is not a list of 3 finite numbers"),
    (dict(class_names="cat, dog"), r"metadata class_names='cat, dog' is not JSON"),
    (dict(nms="true"), r"the model card lacks score_threshold, iou_threshold, max_det"),
    (dict(nms="true", score_threshold="0.3", iou_threshold="0.45", max_det="100"),
     r"nms \(True\) is not what was written with the model"),
    (dict(category_ids="[1, 2]"), r"category_ids must be 3 integers \(one per class\), got \[1, 2\]"),
    (dict(checksum=None), r"the model card has no checksum \(the one `ssd export` stores\)"),
    (dict(precision='"int4"'), r"precision='int4' is not \"fp32\" or \"int8\""),
    (dict(operating_point="0.3"), r"operating_point must be a dict of score_threshold .*, got 0\.3"),
    (dict(operating_point='{"score_threshold": 1.0, "precision": 1, "recall": 1, "f1": 1, "split": "val"}'),
     r"edited\.onnx: operating_point must be a dict of score_threshold in \[0, 1\)"),
])
def test_onnx_metadata_problems_are_named(tiny_onnx, tmp_path, changes, message):
    path = with_metadata(tiny_onnx, tmp_path / "edited.onnx", **changes)
    with pytest.raises(OnnxModelError, match=message) as error:
        load(path)
    assert str(error.value).startswith(str(path))


def test_onnx_backend_knows_its_priors_and_settings(tiny, tiny_onnx):
    backend = OnnxBackend(tiny_onnx)
    assert torch.equal(backend.priors, tiny.priors)  # before any batch ran
    assert backend.card == tiny.card.sealed(backend.card.checksum["network"])  # every field, checksum included
    assert backend.card.image_size == (256, 256) and backend.card.category_ids is None


def test_flipped_weight_bytes_fail_the_checksum(tiny_onnx, tmp_path):
    proto = onnx.load(str(tiny_onnx))
    assert proto.graph.initializer
    weight = max(proto.graph.initializer, key=lambda t: len(t.raw_data)).raw_data
    data = bytearray(tiny_onnx.read_bytes())
    at = data.find(weight[:64])
    assert at > 0 and data.find(weight[:64], at + 1) == -1
    data[at + 40] ^= 0x10
    damaged = tmp_path / "damaged.onnx"
    damaged.write_bytes(bytes(data))
    ort.InferenceSession(str(damaged))  # ONNX Runtime alone runs it silently
    with pytest.raises(OnnxModelError, match=r"damaged\.onnx: the network \(weights or graph\) does not match the "
                                             r"checksum stored with it"):
        load(damaged)


def test_every_list_of_formats_derives_from_the_one_artifact_table():
    from ssd.artifacts import ARTIFACTS, BENCHMARK_ROWS, EXPORT_FORMATS, resolve
    from ssd.export import FORMATS, benchmark
    from ssd.inference.backends import BACKENDS

    assert list(BACKENDS) == [runtime for kind in ARTIFACTS.values() for runtime in kind.runtimes]
    assert list(FORMATS) == list(EXPORT_FORMATS) == ["pt2", "onnx", "openvino", "ncnn", "tflite"]
    assert FORMATS["openvino"] == ("_openvino", True) and BACKENDS["openvino"].folder_file == "model.xml"
    assert list(benchmark.RUNTIMES) == list(BENCHMARK_ROWS)
    assert benchmark.RUNTIMES["opencv"][0] == "onnx" and benchmark.RUNTIMES["openvino-int8"][0] == "openvino-int8"
    assert BACKENDS["opencv"].suffixes == () and BACKENDS["onnx"].suffixes == (".onnx",)
    for kind in ARTIFACTS.values():  # every exporter and opener the table names exists
        assert all(callable(resolve(target)) for target in [*kind.runtimes.values(), kind.exporter] if target)


def test_an_existing_folder_that_is_no_export_of_ssd_is_refused_naming_a_few_of_its_files(tmp_path):
    for name in ("a", "b", "c", "d", "e", "f", "g"):
        (tmp_path / f"{name}.txt").write_text("mine")
    with pytest.raises(OutputError, match=r"^--output .* is an existing folder that is not an OpenVINO export of ssd "
                                          r"\(it holds a\.txt, b\.txt, c\.txt, d\.txt, e\.txt, \.\.\. \(2 more\)\): "
                                          r"choose a new folder$"):
        check_export_folder(tmp_path, exist_ok=True)


@pytest.mark.slow
def test_an_export_whose_parity_check_fails_or_is_killed_leaves_nothing_at_the_output(tiny, tmp_path, monkeypatch):
    from ssd.export import onnx as onnx_export

    weights = save_checkpoint(tmp_path / "best.pt", tiny)

    def failing(model, path, sample_images=None):
        assert path.name == "best.onnx" and path.is_file() and path.parent != tmp_path  # a temporary copy
        raise ExportCheckError(f"{path}: image 0: detection 3 has no counterpart")

    monkeypatch.setattr(onnx_export, "check_onnx", failing)
    with pytest.raises(ExportCheckError, match=rf"^{tmp_path}/best\.onnx: image 0: detection 3 has no counterpart; "
                                               "nothing was written$"):
        export(weights)
    monkeypatch.setattr(onnx_export, "check_onnx", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # a kill during the check
        export(weights)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_max_det_of_an_nms_export_is_bounded_before_anything_is_written(tiny, tmp_path):
    weights = save_checkpoint(tmp_path / "best.pt", tiny)
    with pytest.raises(ValueError, match=r"^--max-det 1000000 is above 10000 \(limits\.MAX_DETECTIONS\), the most "
                                         r"detections per image ssd keeps \(an exported NMS graph allocates"):
        export(weights, nms=True, max_detections=10**6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_export_python_entry_takes_its_schema_defaults_and_checks_alike(tmp_path):
    parameters = inspect.signature(export).parameters
    defaults = {k: p.default for k, p in parameters.items() if k not in ("weights", "sample_images")}
    defaults["output"] = defaults.pop("out_path")
    assert defaults == ExportConfig(weights="w").values("weights")
    with pytest.raises(ConfigError, match=r"^--calib-images must be a positive integer, got 0$"):
        export(tmp_path / "missing.pt", int8=True, calib_images=0)  # the schema's, before the weights are read


def test_export_options_are_checked_before_the_calibration_data_is_read(tiny, tmp_path, capsys):
    weights, missing = save_checkpoint(tmp_path / "best.pt", tiny), tmp_path / "no-such-data"
    with pytest.raises(ValueError, match=r"^--max-det 1000000 is above 10000 \(limits\.MAX_DETECTIONS\)"):
        export(weights, nms=True, max_detections=10**6, int8=True, data=missing)
    with pytest.raises(ValueError, match=r"^opset 99 cannot be written: torch\.onnx writes opsets 7 to 2\d"):
        export(weights, opset=99, int8=True, data=missing)
    assert main(["export", "--weights", str(weights), "--nms", "--max-det", "1000000", "--int8", "--data",
                 str(missing)]) == 2
    assert capsys.readouterr().err.startswith("error: ssd export: --max-det 1000000 is above 10000 (limits.")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt"]


def test_export_onnx_checks_its_own_options(tiny, tmp_path):
    with pytest.raises(ValueError, match=r"^max_detections 1000000 is above 10000"):
        export_onnx(tiny, tmp_path / "nms.onnx", nms=True, max_detections=10**6)
    with pytest.raises(ValueError, match=r"^opset 6 cannot be written"):
        export_onnx(tiny, tmp_path / "old.onnx", opset=6)
    with pytest.raises(ValueError, match=r"^score_threshold must be a number in \[0, 1\], got 1\.5"):
        export_onnx(tiny, tmp_path / "conf.onnx", score_threshold=1.5)
    assert not list(tmp_path.iterdir())


def test_a_valid_onnx_file_given_to_export_says_what_it_is(tiny_onnx, tmp_path, capsys):
    assert main(["export", "--weights", str(tiny_onnx), "--output", str(tmp_path / "again.onnx")]) == 1
    assert "is not PyTorch weights: it is an ONNX model: ONNX exports of this library run as they are" in (
        capsys.readouterr().err)


HOSTILE = r'''
import sys
import numpy as np, onnx, torch
from onnx import TensorProto, helper
import ssd.limits
from ssd.card import ModelCard
from ssd.export.onnx import onnx_metadata
from ssd.inference.backends.onnx import graph_digest
from ssd.inference.detector import load

ssd.limits.MAX_ONNX_RUNTIME_BYTES = 64 * 2**20
# a graph with a valid card and checksum that tiles its 8x8 input to 3 x 8000 x 8000 floats (768 MB)
const = lambda name, values: helper.make_tensor(name, TensorProto.INT64, [len(values)], values)
nodes = [helper.make_node("Tile", ["images", "reps"], ["big"]),
         helper.make_node("ReduceSum", ["big"], ["sum"], keepdims=0),
         *[helper.make_node("Expand", ["sum", f"{name}_shape"], [name]) for name in ("loc", "logits", "priors")]]
shapes = {"loc": [1, 1, 4], "logits": [1, 1, 3], "priors": [1, 4]}
graph = helper.make_graph(
    nodes, "hostile", [helper.make_tensor_value_info("images", TensorProto.FLOAT, [1, 3, 8, 8])],
    [helper.make_tensor_value_info(name, TensorProto.FLOAT, shape) for name, shape in shapes.items()],
    [const("reps", [1, 1, 1000, 1000]), *[const(f"{name}_shape", shape) for name, shape in shapes.items()]])
proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
card = ModelCard("hostile", ("a", "b"), (8, 8), (0.5,) * 3, (0.25,) * 3, (0.1, 0.2))
onnx.helper.set_model_props(proto, onnx_metadata(card.sealed(graph_digest(proto))))
onnx.save(proto, sys.argv[1])
try:
    load(sys.argv[1]).predict(torch.zeros(3, 8, 8, dtype=torch.uint8))
except ValueError as e:
    print(e)
'''


@pytest.mark.slow
def test_an_onnx_graph_that_allocates_beyond_the_runtime_ceiling_fails_with_one_line(tmp_path):
    """Its checksum is valid, so only the arena limit (lowered to 64 MB in a process of its own) stops it."""
    import subprocess
    import sys

    path = tmp_path / "hostile.onnx"
    done = subprocess.run([sys.executable, "-c", HOSTILE, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (f"{path}: running the graph needs more memory than ONNX Runtime may take "
                                   "(limits.MAX_ONNX_RUNTIME_BYTES, 0.0625 GiB); a graph of `ssd export` needs far "
                                   "less at this batch size")

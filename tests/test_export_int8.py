"""INT8 export with ONNX Runtime: calibrated on the dataset's training images, the network quantized and the
post-processing left in float, the metadata carried over with its own checksum, bad calibration input refused."""

import shutil
from collections import Counter
from pathlib import Path

import onnx
import pytest
import torch

from ssd.boxes import decode
from ssd.cli import main
from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.errors import ConfigError
from ssd.export import export, int8_runtime
from ssd.export.benchmark import run_benchmark
from ssd.export.int8_runtime import cpu_kind, int8_advice
from ssd.export.quantize import calibration_paths, network_nodes, quantize_onnx
from ssd.inference.backends.onnx import OnnxBackend, graph_digest
from ssd.preprocess import preprocess
from ssd.schemas import BenchmarkConfig, ExportConfig


@pytest.fixture(scope="module")
def weights(tiny_checkpoint, tmp_path_factory):
    """A copy of the checkpoint in a folder of this module, where the exports land next to it."""
    return Path(shutil.copy(tiny_checkpoint, tmp_path_factory.mktemp("int8") / "best.pt"))


@pytest.fixture(scope="module")
def int8_pair(weights, synthetic_voc):
    """``(fp32, int8)`` exports of the same checkpoint, the INT8 one through the CLI on 16 calibration images."""
    fp32 = export(weights, fmt="onnx", check=False)
    assert main(["export", "--weights", str(weights), "--int8", "--data", str(synthetic_voc),
                 "--calib-images", "16"]) == 0
    return fp32, weights.with_suffix(".int8.onnx")


def val_batch(data, backend) -> torch.Tensor:
    images = [read_image(r.path) for r in load_dataset(data).records("val")[:8]]
    card = backend.card
    return preprocess(images, card.image_size, card.mean, card.std)[0]


@pytest.mark.slow
def test_int8_export_is_a_quarter_of_the_size_and_close_to_fp32(int8_pair, synthetic_voc):
    fp32_path, int8_path = int8_pair
    fp32, int8 = OnnxBackend(fp32_path), OnnxBackend(int8_path)  # the checksum of the INT8 graph is verified
    assert int8_path.stat().st_size <= 0.3 * fp32_path.stat().st_size
    batch = val_batch(synthetic_voc, fp32)
    (loc, logits), (loc8, logits8) = fp32(batch), int8(batch)
    # the stated tolerance of INT8 on this model: class scores within 0.03, decoded boxes within 1% of the image
    assert (logits8.softmax(-1) - logits.softmax(-1)).abs().max() <= 0.03
    variances = fp32.card.variances
    assert (decode(loc8, fp32.priors, variances) - decode(loc, fp32.priors, variances)).abs().max() <= 0.01
    assert torch.equal(int8.priors, fp32.priors)


def test_int8_file_carries_the_fp32_card_with_its_own_checksum(int8_pair):
    fp32, int8 = (onnx.load(str(p)) for p in int8_pair)
    card, card8 = (OnnxBackend(p).card for p in int8_pair)
    assert (card.precision, card8.precision) == ("fp32", "int8")
    assert card8.checksum["network"] == graph_digest(int8) != card.checksum["network"] == graph_digest(fp32)
    assert card8.replace(precision="fp32") == card.replace()
    assert sum(n.op_type == "QuantizeLinear" for n in int8.graph.node) > 0


@pytest.mark.parametrize("flags, kind, advice", [
    ({"avx2", "avx512f", "avx512_vnni"}, "vnni", {"onnx": "tflite"}),
    ({"avx2", "avx_vnni"}, "vnni", {"onnx": "tflite"}),
    ({"avx2", "fma"}, "avx2", {"onnx": "tflite"}),
    ({"avx2", "avx512_vnni", "amx_tile", "amx_int8"}, "amx", {"tflite": "onnx"}),
    ({"neon", "asimd"}, None, {}), (set(), None, {}),
])
def test_int8_advice_names_the_faster_int8_runtime_of_the_cpu(flags, kind, advice):
    assert cpu_kind(flags) == kind
    for fmt in ("onnx", "tflite", "openvino"):
        said = int8_advice(fmt, flags)
        assert (said is None) == (fmt not in advice)
        if said is not None:
            assert said.endswith(f"for speed, export with --format {advice[fmt]} --int8")


@pytest.mark.slow
def test_int8_nms_export_quantizes_the_network_and_keeps_nms_in_float(weights, synthetic_voc, tmp_path, monkeypatch,
                                                                      ssd_messages):
    monkeypatch.setattr(int8_runtime, "cpu_flags", lambda: {"avx2", "avx512_vnni"})
    path = export(weights, fmt="onnx", out_path=tmp_path / "nms.int8.onnx", int8=True, data=synthetic_voc,
                  calib_images=4, nms=True)
    assert ("INT8 on this CPU (VNNI): TFLite (XNNPACK) is the faster INT8 runtime end to end (benchmarks/README.md); "
            "for speed, export with --format tflite --int8") in ssd_messages()
    graph = onnx.load(str(path)).graph
    dequantized = {o for n in graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    float_only = [n.op_type for n in graph.node if n.op_type in ("Softmax", "TopK", "NonMaxSuppression")]
    assert float_only and not [n.op_type for n in graph.node
                               if n.op_type in ("Softmax", "TopK", "NonMaxSuppression") and set(n.input) & dequantized]
    assert any(n.op_type == "Conv" and set(n.input) & dequantized for n in graph.node)
    backend = OnnxBackend(path)
    assert backend.card.nms is not None and backend.card.nms.score_threshold == 0.25


@pytest.mark.slow
def test_int8_quantizes_the_network_up_to_its_last_convolutions(int8_pair, synthetic_voc, tmp_path):
    """What ``--int8`` writes against the remedies benchmarks/deploy.py measures (convolutions only, nodes kept in
    float, the QOperator format): each changes what is quantized, and each file loads."""
    fp32_path, _ = int8_pair
    first = next(n.name for n in onnx.load(str(fp32_path)).graph.node if n.op_type == "Conv")

    def quantized(name, **options):
        path = quantize_onnx(fp32_path, tmp_path / name, calibration_paths(synthetic_voc, 4), **options)
        OnnxBackend(path)  # metadata and checksum hold
        graph = onnx.load(str(path)).graph
        network = network_nodes(graph)
        qdq = [n for n in graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
        float_ops = [n for n in graph.node if n.name in network and n.op_type not in ("Conv", "QuantizeLinear",
                                                                                     "DequantizeLinear")]
        return graph, len(float_ops), sum(n.name not in network for n in qdq)

    default, float_in_network, after_network = quantized("default.onnx")
    _, convs_float, convs_after = quantized("convs.onnx", op_types=["Conv"])
    assert float_in_network < convs_float  # the activations between convolutions are quantized too
    assert after_network == convs_after  # but nothing after the last convolutions (reshapes, concatenations)
    kept, _, _ = quantized("first_in_float.onnx", exclude=[first])
    dequantized = {o for n in default.node if n.op_type == "DequantizeLinear" for o in n.output}
    kept_dequantized = {o for n in kept.node if n.op_type == "DequantizeLinear" for o in n.output}
    assert next(set(n.input) for n in default.node if n.name == first) & dequantized
    assert not next(set(n.input) for n in kept.node if n.name == first) & kept_dequantized  # stays float
    operators, _, _ = quantized("qoperator.onnx", operator_format=True)
    assert Counter(n.op_type for n in operators.node)["QLinearConv"] == sum(n.op_type == "Conv" for n in default.node)


def test_int8_without_data_says_calibration_needs_images(weights, tmp_path, capsys):
    out = tmp_path / "x.int8.onnx"
    assert main(["export", "--weights", str(weights), "--int8", "--output", str(out)]) == 1
    assert capsys.readouterr().err.strip() == ("error: INT8 calibration needs images: give a dataset with --data DATA "
                                              "(its training split is used)")
    assert not out.exists()


def test_int8_with_fewer_images_than_asked_says_how_many_it_found(weights, synthetic_voc, tmp_path, capsys):
    out = tmp_path / "x.int8.onnx"
    assert main(["export", "--weights", str(weights), "--int8", "--data", str(synthetic_voc), "--output", str(out),
                 "--calib-images", "500"]) == 1
    assert (f"INT8 calibration asked for 500 images (--calib-images) but the training split of {synthetic_voc} has "
            "48: use --calib-images 48 or fewer") in capsys.readouterr().err
    assert not out.exists()


def test_calib_images_without_int8_is_refused(weights, synthetic_voc, capsys):
    assert main(["export", "--weights", str(weights), "--data", str(synthetic_voc), "--calib-images", "5"]) == 1
    assert "--calib-images applies to INT8 exports: add --int8 --data DATA" in capsys.readouterr().err


@pytest.mark.slow
def test_int8_with_default_options_calibrates_on_every_image_of_a_small_training_split(weights, synthetic_voc,
                                                                                       tmp_path, capsys):
    """The default is 300 images, or the whole training split when it has fewer (48 here), said on stderr."""
    out = tmp_path / "small.int8.onnx"
    assert main(["export", "--weights", str(weights), "--int8", "--data", str(synthetic_voc), "--output",
                 str(out)]) == 0
    assert (f"INT8 calibration on 48 training images of {synthetic_voc} (all of them: fewer than 300)"
            in capsys.readouterr().err)
    assert OnnxBackend(out).card.precision == "int8"


def test_calib_images_0_is_refused_not_taken_as_the_default(weights, synthetic_voc, tmp_path, capsys):
    out = tmp_path / "x.int8.onnx"
    assert main(["export", "--weights", str(weights), "--int8", "--data", str(synthetic_voc), "--output", str(out),
                 "--calib-images", "0"]) == 2  # a usage error, refused before any work
    assert "error: ssd export: --calib-images must be a positive integer, got 0" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("count", [0, True, 2.0])
def test_calib_images_rule_is_the_same_in_the_schemas_and_the_api(tmp_path, count):
    """One rule (settings.check_calib_images), checked before any file is read (none of these exists)."""
    message = f"^--calib-images must be a positive integer, got {count!r}$"
    for call in (lambda: calibration_paths(tmp_path / "data", count),
                 lambda: run_benchmark(tmp_path / "w.pt", tmp_path / "data", tmp_path / "out", calib_images=count),
                 lambda: ExportConfig(weights=tmp_path / "w.pt", int8=True, calib_images=count),
                 lambda: BenchmarkConfig(weights=tmp_path / "w.pt", data="d", calib_images=count)):
        with pytest.raises(ConfigError, match=message):
            call()
    assert not (tmp_path / "out").exists()

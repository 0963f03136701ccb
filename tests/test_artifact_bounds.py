"""Every artifact bounded and honest (issue 33, item 7): checksums checked before a runtime reads or compiles a
graph, memory bounds read from a graph's shapes before it runs, a ``.pt2`` member over its bound refused before it
is read, files written before model cards named with what they do not cover, TorchScript named whatever its
suffix. Each test is named after what a user (or an attacker) does."""

import gzip
import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import ssd.limits as limits
from ssd.card import ModelCard
from ssd.errors import CheckpointError, OnnxModelError
from ssd.inference.backends import open_backend
from ssd.inference.backends.pt2 import METADATA_FILE, ExportedProgramBackend, check_archive, program_digest

DATA = Path(__file__).parent / "data"
CARD = ModelCard("ssd_tiny", ("cat", "dog"), (64, 80), (0.5, 0.4, 0.3), (0.2, 0.2, 0.25), (0.1, 0.2))


def unpacked(name: str, folder: Path) -> Path:
    path = folder / name
    path.write_bytes(gzip.decompress((DATA / f"{name}.gz").read_bytes()))
    return path


@pytest.fixture
def sealed_onnx(tmp_path) -> Path:
    """``tests/data/legacy.onnx`` with a model card sealed over its graph, as ``ssd export`` writes today."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from ssd.export.onnx import onnx_metadata
    from ssd.inference.backends.onnx import graph_digest

    proto = onnx.load(unpacked("legacy.onnx", tmp_path))
    card = ModelCard.from_strings({p.key: p.value for p in proto.metadata_props}, "legacy.onnx")
    del proto.metadata_props[:]
    onnx.helper.set_model_props(proto, onnx_metadata(card.sealed(graph_digest(proto))))
    path = tmp_path / "model.onnx"
    onnx.save(proto, path)
    return path


def _never(*args, **kwargs):
    raise AssertionError("the runtime was asked to read the graph before its checksum was checked")


def test_onnx_graph_edited_after_export_is_refused_before_onnx_runtime_reads_it(sealed_onnx, monkeypatch):
    onnx = pytest.importorskip("onnx")
    from ssd.inference.backends.onnx import OnnxBackend

    proto = onnx.load(sealed_onnx)
    weights = proto.graph.initializer[0]
    array = onnx.numpy_helper.to_array(weights).copy()
    array.flat[0] += 1
    weights.CopyFrom(onnx.numpy_helper.from_array(array, weights.name))
    onnx.save(proto, sealed_onnx)
    monkeypatch.setattr(OnnxBackend, "_open_session", _never)
    with pytest.raises(OnnxModelError, match=r"the network \(weights or graph\) does not match the checksum"):
        OnnxBackend(sealed_onnx)


@pytest.fixture
def openvino_folder(sealed_onnx, tmp_path) -> Path:
    pytest.importorskip("openvino")
    from ssd.export.openvino import export_openvino

    return export_openvino(sealed_onnx, tmp_path / "model_openvino")


def test_openvino_ir_edited_after_export_is_refused_before_it_is_compiled(openvino_folder, monkeypatch):
    import ssd.inference.backends.openvino as backend

    weights = openvino_folder / "model.bin"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(backend, "openvino_core", _never)
    with pytest.raises(OnnxModelError, match=r"the network \(weights or graph\) does not match the checksum"):
        open_backend(openvino_folder)


@pytest.mark.slow
def test_openvino_ir_resealed_to_allocate_40000x40000_floats_is_refused_in_one_line(openvino_folder):
    import openvino as ov

    from ssd.export.onnx import onnx_metadata
    from ssd.inference.backends.openvino import IR_FILES, ir_digest, openvino_core

    model = openvino_core().read_model(str(openvino_folder / IR_FILES[0]))
    ops = ov.opset13
    mean = ops.reduce_mean(model.get_parameters()[0], ops.constant(np.array([0, 1, 2, 3], np.int64)))
    huge = ops.broadcast(mean, ops.constant(np.array([40000, 40000], np.int64)))  # made at run time, from the image
    model.add_results([ops.result(huge)])
    rewritten = openvino_folder.with_name("rewritten")  # not over model.bin: OpenVINO maps it while it reads
    rewritten.mkdir()
    ov.serialize(model, str(rewritten / IR_FILES[0]), str(rewritten / IR_FILES[1]))
    del model
    for name in IR_FILES:
        (rewritten / name).replace(openvino_folder / name)
    card = open_card(openvino_folder / "metadata.json")
    (openvino_folder / "metadata.json").write_text(json.dumps(onnx_metadata(card.sealed(ir_digest(openvino_folder)))))
    with pytest.raises(OnnxModelError) as refused:
        open_backend(openvino_folder)
    assert str(refused.value) == (
        f"{openvino_folder} is refused: its graph's tensors take 6.0 GiB at batch 1, more than "
        "limits.MAX_GRAPH_BYTES (4 GiB); an SSD exported by ssd takes far less: export the model again")


def open_card(path: Path) -> ModelCard:
    raw = json.loads(path.read_text())
    return ModelCard.from_strings({k: v for k, v in raw.items() if k != "checksum"}, str(path))


class _Huge(nn.Module):
    """What an attacker re-seals: the raw outputs of an SSD, plus a ``[40000, 40000]`` tensor made on every call."""

    def forward(self, images):
        waste = torch.zeros(40000, 40000).sum()
        loc = images.mean(dim=(1, 2, 3)).view(-1, 1, 1).expand(-1, 4, 4) + waste
        return loc, torch.zeros(images.shape[0], 4, 3) + waste, torch.zeros(4, 4)


@pytest.mark.slow
def test_pt2_resealed_to_allocate_40000x40000_floats_is_refused_before_it_runs(tmp_path):
    from ssd.export.onnx import onnx_metadata

    program = torch.export.export(_Huge(), (torch.zeros(2, 3, 64, 80),),
                                  dynamic_shapes={"images": {0: torch.export.Dim("batch", min=1)}})
    buffer = io.BytesIO()
    metadata = onnx_metadata(CARD.sealed(program_digest(program)))
    torch.export.save(program, buffer, extra_files={METADATA_FILE: json.dumps(metadata)})
    path = tmp_path / "huge.pt2"
    path.write_bytes(buffer.getvalue())
    with pytest.raises(OnnxModelError) as refused:
        ExportedProgramBackend(path)
    assert str(refused.value) == (
        f"{path} is refused: its graph's tensors take 6.0 GiB at batch 1, more than limits.MAX_GRAPH_BYTES (4 GiB); "
        "an SSD exported by ssd takes far less: export the model again")


def _archive(path: Path, name: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"model/{name}", data)
    return path


def test_pt2_whose_sample_inputs_unpack_past_the_bound_is_refused_before_reading_them(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "MAX_ARCHIVE_MEMBER_BYTES", 2**20)
    path = _archive(tmp_path / "bomb.pt2", "data/sample_inputs/model.pt", bytes(3 * 2**20))  # a few KiB packed
    monkeypatch.setattr(zipfile.ZipFile, "read", _never)
    with pytest.raises(OnnxModelError) as refused:
        check_archive(path)
    assert str(refused.value) == (
        f"{path} is refused: its member model/data/sample_inputs/model.pt unpacks to 3 MiB, more than the 1 MiB such "
        "a member of ssd's archives may take (limits.MAX_ARCHIVE_MEMBER_BYTES); it was not read")


def test_pt2_whose_sample_inputs_pickle_an_object_is_refused_in_our_words(tmp_path):
    buffer = io.BytesIO()
    torch.save({"x": torch.zeros(1), "f": print}, buffer)  # pickles a reference to a builtin: not plain data
    path = _archive(tmp_path / "pickled.pt2", "data/sample_inputs/model.pt", buffer.getvalue())
    with pytest.raises(OnnxModelError) as refused:
        check_archive(path)
    assert str(refused.value) == (
        f"{path} is refused: its member model/data/sample_inputs/model.pt cannot be read as plain data "
        "(UnpicklingError); a torch.export archive of ssd holds only raw tensors, JSON and plain tensors, and loads "
        "without running code")
    assert "weights_only" not in str(refused.value)


def test_torchscript_archive_renamed_pt_is_named_as_torchscript(tmp_path):
    path = tmp_path / "model.pt"
    with zipfile.ZipFile(path, "w") as archive:  # the layout torch.jit.save writes
        for name in ("data.pkl", "constants.pkl", "version", "code/__torch__/model.py"):
            archive.writestr(f"model/{name}", b"1")
    with pytest.raises(CheckpointError) as refused:
        open_backend(path)
    assert str(refused.value) == (
        f"{path} is a TorchScript export, which this version of ssd no longer reads (torch.jit is deprecated by "
        "PyTorch, and loading TorchScript runs code from the file): export the checkpoint again with "
        "`ssd export --weights CKPT --format pt2` (torch.export)")


@pytest.mark.parametrize("name", ["legacy.pt", "legacy.onnx"])
def test_a_file_written_before_model_cards_loads_with_a_warning_naming_what_is_not_covered(name, tmp_path,
                                                                                             ssd_messages):
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime")
    path = unpacked(name, tmp_path)
    open_backend(path)
    action = "save the model again" if name.endswith(".pt") else "export it again"
    assert (f"{path} was written before model cards: its network is checked against the digest stored with it, but "
            "its fields (class names, input size, normalization, thresholds) are covered by no checksum, and an "
            f"edit of them, or a newer file stripped to this layout, is not detected; {action} to cover them"
            ) in ssd_messages()

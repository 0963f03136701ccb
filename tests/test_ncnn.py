"""NCNN (issue 33, item 2): ``ssd export --format ncnn`` through pnnx, checked against the ONNX graph (itself checked
against PyTorch), opened by what every command opens, and refused, naming the file, once edited."""

import json
import shutil

import pytest

from builders import predicts_as_pytorch_without_it, write_png_images
from ssd.cli import main
from ssd.errors import OnnxModelError
from ssd.export import export
from ssd.inference.backends import open_backend

pytest.importorskip("ncnn")
pytest.importorskip("pnnx")
pytest.importorskip("onnxruntime")


@pytest.fixture(scope="module")
def exported(tiny_checkpoint, tmp_path_factory):
    weights = shutil.copy(tiny_checkpoint, tmp_path_factory.mktemp("ncnn") / "best.pt")
    return {"pt": weights, "ncnn": export(weights, "ncnn")}


@pytest.mark.slow
def test_export_ncnn_writes_a_checked_folder_that_predicts_like_pytorch(exported, synthetic_voc, tmp_path):
    import ssd

    folder = exported["ncnn"]
    assert folder.name == "best_ncnn"
    assert sorted(p.name for p in folder.iterdir()) == ["metadata.json", "model.ncnn.bin", "model.ncnn.param",
                                                        "priors.npy"]
    backend = open_backend(folder)
    assert backend.name == "ncnn" and open_backend(folder / "model.ncnn.param").name == "ncnn"
    assert backend.card.class_names == ("circle", "square", "triangle")
    images = sorted((synthetic_voc / "JPEGImages").glob("*.jpg"))[:2]
    got, expected = (ssd.load(w).predict(images, score_threshold=0.3) for w in (folder, exported["pt"]))
    for a, b in zip(got, expected):  # near-equal scores may swap places: each detection has its twin
        assert len(a.scores) == len(b.scores) > 0
        twins = ((a.boxes[:, None] - b.boxes[None]).abs().max(-1).values < 1e-2 * max(a.width, a.height))
        twins &= (a.labels[:, None] == b.labels[None]) & ((a.scores[:, None] - b.scores[None]).abs() < 1e-2)
        assert bool(twins.any(1).all()) and bool(twins.any(0).all())
    assert main(["predict", "--weights", str(folder), "--source", str(images[0]), "--project", str(tmp_path),
                 "--no-save-images", "--quiet"]) == 0


@pytest.mark.slow
def test_an_ncnn_folder_predicts_without_pytorch_as_with_it(exported, tmp_path):
    """The runtime without PyTorch: NCNN's head outputs post-processed in numpy, torch never imported."""
    write_png_images(tmp_path)
    predicts_as_pytorch_without_it(exported["ncnn"], tmp_path, 0.3)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["model.ncnn.bin", "model.ncnn.param"])
def test_an_ncnn_file_edited_after_export_is_refused_naming_it(exported, tmp_path, name):
    folder = shutil.copytree(exported["ncnn"], tmp_path / "edited_ncnn")
    data = bytearray((folder / name).read_bytes())
    data[-2] ^= 0x01
    (folder / name).write_bytes(bytes(data))
    with pytest.raises(OnnxModelError) as refused:
        open_backend(folder)
    assert str(refused.value) == (f"{folder / name} was modified after `ssd export` (it is not the file whose digest "
                                  "the export stored): export the model again")


@pytest.mark.slow
def test_an_ncnn_card_edited_after_export_is_refused_naming_the_field(exported, tmp_path):
    folder = shutil.copytree(exported["ncnn"], tmp_path / "card_ncnn")
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["class_names"] = json.dumps(["circle", "square", "star"])
    (folder / "metadata.json").write_text(json.dumps(metadata))
    with pytest.raises(OnnxModelError, match=r"card_ncnn: class_names .* is not what was written with the model"):
        open_backend(folder)


def test_export_ncnn_refuses_the_options_of_onnx_graphs(tiny_checkpoint):
    with pytest.raises(ValueError) as refused:
        export(tiny_checkpoint, "ncnn", nms=True)
    assert str(refused.value) == ("--nms applies to ONNX and OpenVINO exports: an NCNN export is the network alone "
                                  "(batch 1, post-processing in the library); drop them or use --format onnx")
    with pytest.raises(ValueError) as refused:  # the formats named are those the table says take the option
        export(tiny_checkpoint, "ncnn", int8=True, data="unread")
    assert str(refused.value) == ("--int8 applies to ONNX, OpenVINO and TFLite exports: an NCNN export is the network "
                                  "alone (batch 1, post-processing in the library); drop them or use --format onnx")

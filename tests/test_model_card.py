"""The model card: one type for what an artifact is. Files written before it (a checkpoint and two ONNX exports
made with ssd 0772225, tests/data/legacy*) still load and give the detections they gave then."""

import gzip
import importlib.util
import io
import json
import pickle
import re
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from ssd.card import ModelCard, strings_from_json
from ssd.errors import CheckpointError
from ssd.inference.detector import load
from ssd.settings import Thresholds

DATA = Path(__file__).parent / "data"
LEGACY = ["legacy.pt", "legacy.onnx", "legacy_nms.onnx"]


def legacy_file(name: str, folder: Path) -> Path:
    """``tests/data/<name>.gz`` unpacked into ``folder``: the file as the old code wrote it."""
    path = folder / name
    path.write_bytes(gzip.decompress((DATA / f"{name}.gz").read_bytes()))
    return path


def legacy_image() -> torch.Tensor:
    return torch.randint(0, 256, (3, 48, 80), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", LEGACY)
def test_files_written_before_the_card_load_and_detect_as_they_did(name, tmp_path):
    if name.endswith(".onnx"):
        pytest.importorskip("onnxruntime")
    expected = json.loads((DATA / "legacy.json").read_text())[name]
    result = load(legacy_file(name, tmp_path)).predict([legacy_image()])[0]
    assert result.labels.tolist() == expected["labels"]
    assert result.scores.tolist() == pytest.approx(expected["scores"], abs=1e-5)
    assert torch.allclose(result.boxes, torch.tensor(expected["boxes"]), atol=1e-3, rtol=0)


# ------------------------------------------------------------------------------------------------ the type itself
CARD = ModelCard("ssd_tiny", ("cat", "dog"), (64, 80), (0.5, 0.4, 0.3), (0.2, 0.2, 0.25), (0.1, 0.2), (3, 7),
                 {"score_threshold": 0.3, "precision": 0.5, "recall": 0.25, "f1": 0.33, "split": "val"},
                 Thresholds(0.25, 0.45, 100))


def test_a_card_reads_back_from_its_dict_and_its_strings_field_for_field():
    sealed = CARD.sealed("abc")
    assert ModelCard.from_dict(sealed.to_dict(), "x") == sealed
    strings = sealed.to_strings()
    assert all(isinstance(v, str) for v in strings.values()) and strings["image_size"] == "[64, 80]"
    assert ModelCard.from_strings(strings, "x") == sealed
    assert CARD.replace(nms=None, image_size=64).to_dict()["image_size"] == 64  # square: an int, as exports wrote
    assert CARD.replace(precision="int8").precision == "int8" and CARD.replace().checksum is None


@pytest.mark.parametrize(("field", "value", "rule"), [
    ("class_names", [], "a non-empty list of strings"),
    ("image_size", [64, 0], "a side S or \\[H, W\\], each from 1 to 4096"),
    ("mean", [0.5, "x", 0.5], "a list of 3 finite numbers"),
    ("mean", [10**400, 0.5, 0.5], "a list of 3 finite numbers"),  # a JSON integer no float holds
    ("std", [1.0, 0.0, 1.0], "a list of 3 positive numbers"),
    ("variances", [0.1, float("inf")], "a list of 2 positive numbers"),
    ("max_det", 10**9, "an integer from 1 to 10000"),
    ("precision", "int4", '"fp32" or "int8" or "fp16"'),
])
def test_the_validator_names_the_field_the_value_and_the_rule(field, value, rule):
    with pytest.raises(ValueError, match=rf"^card\.json: {field}=.* is not {rule}; export the model again$"):
        ModelCard.from_dict({**CARD.to_dict(), field: value}, "card.json")


@pytest.mark.parametrize(("name", "rule"), [("cat\x1b[2J", "holds U+001B"), ("\ud800", "holds a lone surrogate"),
                                            ("x" * 201, "is 201 characters long: at most 200")])
def test_an_artifact_whose_class_names_hold_an_escape_code_is_refused_by_its_card(name, rule):
    with pytest.raises(ValueError, match=rf"^card\.json: class_names\[1\] = .* {re.escape(rule)}"):
        ModelCard.from_dict({**CARD.to_dict(), "class_names": [CARD.class_names[0], name, *CARD.class_names[2:]]},
                            "card.json")


@pytest.mark.parametrize(("names", "message"), [
    (["cat", "dog", "cat"], r"class_names has duplicates \['cat'\]: every class needs a distinct name"),
    (["cat", " "], r"class_names\[1\] = ' ': class names must be non-empty strings")])
def test_a_card_refuses_the_class_names_a_model_refuses(names, message):
    with pytest.raises(ValueError, match=rf"^card\.json: {message}"):
        ModelCard.from_dict({**CARD.to_dict(), "class_names": names, "category_ids": None}, "card.json")


def test_a_file_written_before_the_card_is_checked_against_its_network_checksums():
    legacy = {"xml_sha256": lambda: "a", "bin_sha256": lambda: "b"}  # OpenVINO's; ONNX and pt2 store one
    strings, sealed = CARD.to_strings(), CARD.sealed("n")
    read = ModelCard.from_file_strings({**strings, "xml_sha256": "a", "bin_sha256": "b"},
                                       lambda: pytest.fail("no card checksum to check"), legacy, "m")
    assert read == CARD
    with pytest.raises(ValueError, match=r"^m: the network does not match the checksum stored at export "
                                         r"\(bin_sha256, missing or different\)"):
        ModelCard.from_file_strings({**strings, "xml_sha256": "a"}, lambda: "n", legacy, "m")
    with pytest.raises(ValueError, match=r"^m: the model card has no checksum"):  # no key at all: refused
        ModelCard.from_file_strings(strings, lambda: "n", legacy, "m")
    checked = {**sealed.to_strings(), "xml_sha256": "x"}  # a card's checksum wins
    assert ModelCard.from_file_strings(checked, lambda: "n", legacy, "m") == sealed
    with pytest.raises(ValueError, match=r"^m: the network \(weights or graph\) does not match the checksum"):
        ModelCard.from_file_strings(checked, lambda: "other", legacy, "m")


@pytest.mark.parametrize(("text", "message"), [
    (b"{\xff}", r"^m\.json is not JSON \("), ("[1]", r"^m\.json is not a JSON object of strings; export the model"),
    ('{"class_names": ["a"]}', r"^m\.json is not a JSON object of strings"),
    ("[" * 200_000, r"^m\.json is nested too deeply to be a JSON object of strings; export the model again$")])
def test_a_card_stored_as_json_must_be_an_object_of_strings(text, message):
    assert strings_from_json('{"a": "1"}', "m.json") == {"a": "1"}
    with pytest.raises(ValueError, match=message):
        strings_from_json(text, "m.json")


def test_a_metadata_value_nested_deeper_than_json_decodes_is_not_json():
    strings = {**CARD.to_strings(), "mean": "[" * 200_000}  # an ONNX metadata value of a tampered file
    with pytest.raises(ValueError, match=r"^m\.onnx: metadata mean='\[\[\[.* is not JSON; export the model again$"):
        ModelCard.from_strings(strings, "m.onnx")


@pytest.mark.parametrize("attribute, value, message", [
    ("operating_point", 0.3, r"^operating_point: operating_point must be a dict of score_threshold .*, got 0\.3$"),
    ("category_ids", 5, r"^category_ids: category_ids must be 2 integers \(one per class\), got 5$"),
])
def test_a_model_refuses_a_bad_card_field_set_on_it_with_the_validators_message(attribute, value, message):
    from ssd.models import build_model

    model = build_model("ssd_tiny", class_names=["cat", "dog"], image_size=64)
    setattr(model, attribute, value)
    with pytest.raises(ValueError, match=message):
        model.predict([torch.zeros(3, 32, 32)])


@pytest.mark.parametrize("field", list(CARD.fingerprints()))
def test_the_checksum_refuses_an_edit_of_any_field_by_name(field):
    strings = CARD.sealed("abc").to_strings()
    other = {"model_name": "ssd300_vgg16", "class_names": '["dog", "cat"]', "category_ids": "[7, 3]",
             "image_size": "[80, 64]", "mean": "[0.5, 0.4, 0.31]", "std": "[0.2, 0.2, 0.2]", "variances": "[0.2, 0.1]",
             "operating_point": '{"score_threshold": 0.05, "precision": 0.5, "recall": 0.25, "f1": 0.33, '
                                '"split": "val"}',
             "nms": "false", "precision": '"int8"', "score_threshold": "0.3", "iou_threshold": "0.5",
             "max_det": "10"}
    edited = ModelCard.from_strings({**strings, field: other[field]}, "best.onnx")
    with pytest.raises(ValueError, match=rf"^best\.onnx: {field} \(.*\) is not what was written with the model"):
        edited.verify("abc", "best.onnx")
    with pytest.raises(ValueError, match=r"the network \(weights or graph\) does not match"):
        CARD.sealed("abc").verify("abd", "best.onnx")


# ------------------------------------------------------------------------------- edits refused in every format
POINT = {"score_threshold": 0.3, "precision": 0.5, "recall": 0.25, "f1": 0.33, "split": "val"}
EDITS = {"class_names": ["b", "a", "c"], "category_ids": [9, 7, 3], "mean": [0.5, 0.5, 0.4], "std": [0.2, 0.3, 0.2],
         "variances": [0.2, 0.1], "operating_point": {**POINT, "score_threshold": 0.05}, "image_size": [64, 80],
         "precision": "int8"}
CHECKPOINT_FIELDS = ["class_names", "category_ids", "mean", "std", "variances", "operating_point"]


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    """A 64 px ssd_tiny checkpoint with category ids and an operating point, exported to every format."""
    from builders import biased_model
    from ssd.export import export
    from ssd.weights.checkpoint import save_checkpoint

    folder = tmp_path_factory.mktemp("cards")
    weights = save_checkpoint(folder / "best.pt", biased_model("ssd_tiny", image_size=64), category_ids=[3, 7, 9],
                              operating_point=POINT)
    made = {"pt": weights, "pt2": export(weights, "pt2")}
    if importlib.util.find_spec("onnxruntime"):
        made["onnx"] = export(weights, "onnx", check=False)
    if importlib.util.find_spec("openvino"):
        made["openvino"] = export(weights, "openvino", check=False)
    return made


def edited_copy(kind: str, path: Path, folder: Path, field: str, value) -> Path:
    """A copy of the artifact with one field of its stored card changed, nothing else, in ``folder``."""
    folder.mkdir()
    if kind == "pt":
        ckpt = torch.load(path, weights_only=True)
        ckpt["card"][field] = value
        torch.save(ckpt, folder / "edited.pt")
        return folder / "edited.pt"
    if kind == "onnx":
        import onnx

        proto = onnx.load(str(path))
        next(p for p in proto.metadata_props if p.key == field).value = json.dumps(value)
        onnx.save(proto, str(folder / "edited.onnx"))
        return folder / "edited.onnx"
    if kind == "openvino":
        edited = shutil.copytree(path, folder / "edited_openvino")
        meta = json.loads((edited / "metadata.json").read_text())
        (edited / "metadata.json").write_text(json.dumps({**meta, field: json.dumps(value)}))
        return edited
    extra = {"ssd.json": ""}
    program = torch.export.load(path, extra_files=extra)
    torch.export.save(program, folder / "edited.pt2",
                      extra_files={"ssd.json": json.dumps({**json.loads(extra["ssd.json"]), field: json.dumps(value)})})
    return folder / "edited.pt2"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pt", "onnx", "openvino", "pt2"])
def test_an_edited_card_is_refused_naming_the_field_in_every_format(artifacts, tmp_path, kind):
    if kind not in artifacts:
        pytest.skip(f"the {kind} runtime is not installed")
    assert load(artifacts[kind]).card.operating_point == POINT  # the unedited file loads
    for field in CHECKPOINT_FIELDS if kind == "pt" else EDITS:
        with pytest.raises(CheckpointError, match=rf"edited.*: {field} \(.*\) is not what was written with the "
                                                  r"model \(the checksum of the model card differs\)"):
            load(edited_copy(kind, artifacts[kind], tmp_path / field, field, EDITS[field]))


@pytest.mark.parametrize("field", CHECKPOINT_FIELDS)
def test_a_checkpoint_whose_contents_no_longer_match_its_card_is_refused_naming_the_field(artifacts, tmp_path, field):
    ckpt = torch.load(artifacts["pt"], weights_only=True)
    target = ckpt["config"] if field in ("mean", "std", "variances") else ckpt
    target[field] = EDITS[field]
    torch.save(ckpt, tmp_path / "edited.pt")
    with pytest.raises(CheckpointError, match=rf"edited\.pt: its {field} \(.*\) is not the one of its model card"):
        load(tmp_path / "edited.pt")


# ------------------------------------------------------------------------------------- no file ever runs code
class Payload:
    """Unpickled, it creates ``marker``: the proof that loading ran code from the file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def rezipped(source: Path, target: Path, replace: dict[str, bytes]) -> Path:
    """A copy of the zip archive ``source`` with members (by the name under its root folder) replaced or added."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        root = old.namelist()[0].split("/")[0]
        for member in old.infolist():
            name = member.filename.partition("/")[2]
            new.writestr(member, replace.pop(name, old.read(member)))
        for name, data in replace.items():
            new.writestr(f"{root}/{name}", data)
    return target


def pickled(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_a_payload_planted_in_any_loadable_format_never_runs(artifacts, tmp_path):
    marker = tmp_path / "ran"
    payload = pickled(Payload(marker))
    planted = {"checkpoint.pt": payload}
    if "onnx" in artifacts:
        planted["pickle.onnx"] = payload
    if "openvino" in artifacts:
        for name in ("metadata.json", "model.bin"):
            folder = shutil.copytree(artifacts["openvino"], tmp_path / f"openvino_{name}")
            (folder / name).write_bytes(payload)
            planted[folder.name] = None
    with zipfile.ZipFile(artifacts["pt2"]) as archive:
        config_name = next(n.partition("/")[2] for n in archive.namelist() if n.endswith("_weights_config.json"))
        config = json.loads(archive.read(next(n for n in archive.namelist() if n.endswith(config_name))))
    first = next(iter(config["config"]))
    config["config"][first]["use_pickle"] = True  # torch.export.load would torch.load(weights_only=False) it
    weight = f"data/weights/{config['config'][first]['path_name']}"
    variants = {"weight.pt2": {config_name: json.dumps(config).encode(), weight: payload},
                "sample_inputs.pt2": {"data/sample_inputs/model.pt": payload},  # its full-unpickler fallback
                "opaque.pt2": {"data/constants/opaque_obj_0": pickle.dumps(Payload(marker))}}
    for name, replace in variants.items():
        rezipped(artifacts["pt2"], tmp_path / name, replace)
        planted[name] = None
    for name, data in planted.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(CheckpointError, match=r"refused|not PyTorch weights|cannot load|not JSON|checksum"):
            load(tmp_path / name)
        assert not marker.exists(), f"{name} ran its payload"

"""Pretrained weights by name (ssd.weights.hub), offline: the catalog's URLs are replaced by file:// URLs of small
files made here, named as torchvision names its files (the sha256 prefix in the name), and the torch hub cache is
a temporary folder."""

import dataclasses
import hashlib
import os
import time

import pytest
import torch
import torchvision
from torchvision.models import MobileNet_V3_Large_Weights, VGG16_Weights
from torchvision.models.detection import (
    SSD300_VGG16_Weights,
    SSDLite320_MobileNet_V3_Large_Weights,
    ssdlite320_mobilenet_v3_large,
)

from builders import biased_model
from ssd.cli import main
from ssd.errors import BackboneWeightsError, CheckpointError, WeightsDownloadError
from ssd.inference.backends import open_backend
from ssd.models import MODEL_CONFIGS, build_model
from ssd.models.importers import import_model
from ssd.models.load import read_weights
from ssd.training.config import TrainConfig
from ssd.training.plan import plan_run
from ssd.weights import hub
from ssd.weights.checkpoint import save_checkpoint
from ssd.weights.resolve import resolve_weights


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """An empty torch hub cache for each test: ``$TORCH_HOME/hub/checkpoints``."""
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    assert hub.cache_dir() == tmp_path / "torch" / "hub" / "checkpoints"
    return hub.cache_dir()


def publish(monkeypatch, tmp_path, name, obj, *, prefix=None, truncate=False) -> hub.HubWeights:
    """Serve ``obj`` (saved with torch.save) as the catalog's ``name`` from a file:// URL whose file name carries the
    sha256 prefix of the file (or ``prefix``); ``truncate``: the server holds only the first half of the bytes."""
    server = tmp_path / "server"
    server.mkdir(exist_ok=True)
    saved = server / "saved.pth"
    torch.save(obj, saved)
    data = saved.read_bytes()
    digest = prefix or hashlib.sha256(data).hexdigest()[:8]
    entry = hub.catalog()[name]
    stem = entry.filename.rsplit("-", 1)[0]
    served = server / f"{stem}-{digest}.pth"
    served.write_bytes(data[: len(data) // 2] if truncate else data)
    entry = dataclasses.replace(entry, url=served.as_uri())
    monkeypatch.setitem(hub.catalog(), name, entry)
    return entry


def unreachable(monkeypatch, tmp_path, name) -> hub.HubWeights:
    """The catalog's ``name`` pointing at a file:// URL of nothing (what a machine offline gets)."""
    entry = dataclasses.replace(hub.catalog()[name], url=(tmp_path / "nowhere" / hub.catalog()[name].filename).as_uri())
    monkeypatch.setitem(hub.catalog(), name, entry)
    return entry


@pytest.fixture(scope="module")
def mobilenet_state():
    return torchvision.models.mobilenet_v3_large(weights=None).state_dict()


# ------------------------------------------------------------------------------------------------- the catalog
def test_the_catalog_holds_torchvisions_files_for_this_librarys_models():
    urls = {"ssd300_vgg16_coco": SSD300_VGG16_Weights.COCO_V1.url,
            "ssdlite320_mobilenet_v3_large_coco": SSDLite320_MobileNet_V3_Large_Weights.COCO_V1.url,
            "vgg16": VGG16_Weights.IMAGENET1K_V1.url, "vgg16_features": VGG16_Weights.IMAGENET1K_FEATURES.url,
            "mobilenet_v3_large": MobileNet_V3_Large_Weights.IMAGENET1K_V1.url}
    assert {name: entry.url for name, entry in hub.catalog().items()} == urls
    assert hub.catalog()["ssd300_vgg16_coco"].filename == "ssd300_vgg16_coco-b556d3b4.pth"
    assert hub.catalog()["vgg16_features"].hash_prefix == "88682ab5"
    assert hub.catalog()["vgg16"].hash_prefix == "397923af"
    assert hub.known_names("detector") == ["ssd300_vgg16_coco", "ssdlite320_mobilenet_v3_large_coco"]
    for entry in hub.catalog().values():
        assert set(entry.models) <= set(MODEL_CONFIGS), entry.name
    imagenet = {name: arch.imagenet_weights for name, arch in MODEL_CONFIGS.items()}
    assert imagenet == {"ssd300_vgg16": "vgg16", "ssd512_vgg16": "vgg16",
                        "ssdlite320_mobilenet_v3_large": "mobilenet_v3_large", "ssd_tiny": None,
                        "ssd_tiny_fpn": None}
    for model, name in imagenet.items():
        if name is not None:
            assert hub.catalog()[name].kind == "backbone" and model in hub.catalog()[name].models


# ------------------------------------------------------------------------------------------------- fetching
def test_a_download_is_verified_kept_in_the_cache_and_not_repeated(monkeypatch, tmp_path, cache, mobilenet_state):
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", mobilenet_state)
    path = hub.fetch(entry, progress=False)
    assert path == cache / entry.filename and entry.cached
    assert path.read_bytes() == (tmp_path / "server" / "saved.pth").read_bytes()
    assert sorted(p.name for p in cache.iterdir()) == [entry.filename]  # no temporary left
    (tmp_path / "server" / entry.filename).unlink()  # a second download would now fail
    assert hub.fetch(entry) == path


def test_partial_downloads_left_by_a_killed_run_are_removed_by_the_next_run(monkeypatch, tmp_path, cache,
                                                                             mobilenet_state):
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", mobilenet_state)
    cache.mkdir(parents=True)
    killed = [cache / f"{entry.filename}.{i:032x}.partial" for i in (1, 2)]  # torch.hub's temporaries, as left
    live = cache / f"{entry.filename}.{3:032x}.partial"  # another process's download, being written now
    mine = [cache / f"{entry.filename}.notes.partial", cache / "other.pth.00000000000000000000000000000004.partial"]
    for file in [*killed, live, *mine]:
        file.write_bytes(b"\0" * 1000)
    stale = time.time() - hub.STALE_PARTIAL_SECONDS - 1
    for file in [*killed, *mine]:
        os.utime(file, (stale, stale))
    path = hub.fetch(entry, progress=False)
    assert sorted(p.name for p in cache.iterdir()) == sorted([entry.filename, live.name, *(p.name for p in mine)])
    os.utime(live, (stale, stale))  # its writer was killed too: the next run removes it, even with the file cached
    assert hub.fetch(entry) == path and not live.exists()


def test_a_cache_entry_that_is_a_directory_is_an_error_not_a_success(monkeypatch, tmp_path, cache, mobilenet_state):
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", mobilenet_state)
    entry.path.mkdir(parents=True)
    with pytest.raises(WeightsDownloadError, match=rf"the cache entry of mobilenet_v3_large, {entry.path}, is a "
                                                       r"directory: remove it and run again \(it is downloaded "
                                                       r"again\), or pass the path of a copy: --backbone-weights PATH"):
        hub.fetch(entry, progress=False)
    assert list(entry.path.iterdir()) == []  # nothing was downloaded into it


@pytest.mark.parametrize("damage", ["wrong prefix", "truncated"])
def test_a_download_with_the_wrong_checksum_leaves_nothing(monkeypatch, tmp_path, cache, damage):
    state = {"features.0.0.weight": torch.ones(2, 3)}
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", state, prefix="deadbeef" if damage == "wrong prefix"
                    else None, truncate=damage == "truncated")
    with pytest.raises(WeightsDownloadError) as raised:
        hub.fetch(entry, progress=False)
    message = str(raised.value)
    assert f"the download of mobilenet_v3_large from {entry.url} is corrupt: its sha256 does not start with " \
           f"{entry.hash_prefix} as the file name says" in message
    assert f"nothing was kept. Try again, or download {entry.url} another way and put it at {entry.path}" in message
    assert not entry.path.exists() and list(cache.iterdir()) == []


def test_offline_the_error_says_which_file_to_put_where(monkeypatch, tmp_path, cache):
    entry = unreachable(monkeypatch, tmp_path, "ssd300_vgg16_coco")
    with pytest.raises(WeightsDownloadError) as raised:
        read_weights("ssd300_vgg16_coco")
    message = str(raised.value)
    assert message.startswith("cannot download ssd300_vgg16_coco (")
    assert message.endswith(f"Download {entry.url} another way and put it at {cache / 'ssd300_vgg16_coco-b556d3b4.pth'}"
                            " (the torch hub cache), or pass the path of a copy: --weights PATH")
    assert list(cache.iterdir()) == []


# -------------------------------------------------------------------------------------------- names to files
def test_unknown_names_get_the_closest_known_ones(monkeypatch):
    with pytest.raises(CheckpointError, match=r"^--weights ssd300_vgg16_cooc: neither an existing file nor a known "
                                              r"weights name; did you mean 'ssd300_vgg16_coco'\? \(see `ssd "
                                              r"weights`\)$"):
        read_weights("ssd300_vgg16_cooc")
    with pytest.raises(CheckpointError, match="did you mean 'ssdlite320_mobilenet_v3_large_coco'"):
        import_model("ssdlite320_mobilenet_v3_large_cocoa")
    with pytest.raises(CheckpointError, match="did you mean 'ssd300_vgg16_coco'"):
        resolve_weights("ssd300_vgg16_coc")
    with pytest.raises(BackboneWeightsError, match=r"^--backbone-weights vgg16_feature: neither an existing file nor "
                                                   r"a known weights name; did you mean 'vgg16_features'"):
        build_model("ssd300_vgg16", 2, backbone_weights="vgg16_feature")
    # a missing path is a missing file, not a name
    with pytest.raises(CheckpointError, match=r"^checkpoint missing\.pt does not exist$"):
        read_weights("missing.pt")


def test_names_of_the_other_kind_or_model_say_where_they_go():
    with pytest.raises(CheckpointError, match=r"^--weights vgg16: 'vgg16' names backbone weights .*; give it as "
                                              r"--backbone-weights vgg16$"):
        read_weights("vgg16")
    with pytest.raises(BackboneWeightsError, match=r"give it as --weights ssd300_vgg16_coco$"):
        build_model("ssd300_vgg16", 2, backbone_weights="ssd300_vgg16_coco")
    with pytest.raises(BackboneWeightsError, match=r"is a backbone of ssd300_vgg16, ssd512_vgg16, not of "
                                                   r"ssdlite320_mobilenet_v3_large; for ssdlite320_mobilenet_v3_large: "
                                                   r"imagenet, mobilenet_v3_large$"):
        build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights="vgg16_features")


def test_a_path_that_exists_wins_over_a_name(monkeypatch, tmp_path):
    unreachable(monkeypatch, tmp_path, "ssd300_vgg16_coco")  # a download would fail
    monkeypatch.chdir(tmp_path)
    save_checkpoint(tmp_path / "ssd300_vgg16_coco", biased_model("ssd_tiny"))
    assert read_weights("ssd300_vgg16_coco")["config"]["name"] == "ssd_tiny"


@pytest.mark.slow
def test_a_detector_name_is_imported_and_trained_from(monkeypatch, tmp_path, cache, synthetic_voc, capsys,
                                                      ssd_messages):
    torch.manual_seed(0)
    detector = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None).state_dict()  # COCO's 91 outputs
    entry = publish(monkeypatch, tmp_path, "ssdlite320_mobilenet_v3_large_coco", detector)
    out = tmp_path / "coco.pt"
    assert main(["import", "ssdlite320_mobilenet_v3_large_coco", "--output", str(out)]) == 0
    assert entry.cached
    assert f"{entry.path}: imported torchvision" in capsys.readouterr().err
    imported = read_weights(out)
    assert imported["config"]["name"] == "ssdlite320_mobilenet_v3_large" and len(imported["class_names"]) == 80
    key = "head.classification_head.module_list.0.1.weight"
    assert torch.equal(imported["model"]["heads.0.loc.1.weight"],
                       detector[key.replace("classification", "regression")])
    backend = open_backend("ssdlite320_mobilenet_v3_large_coco")  # ssd predict / val --weights NAME
    assert str(backend.source) == str(entry.path) and len(backend.card.class_names) == 80
    plan = plan_run(TrainConfig(data=str(synthetic_voc), weights="ssdlite320_mobilenet_v3_large_coco"), {"weights"})
    assert (plan.config.model, plan.config.image_size) == ("ssdlite320_mobilenet_v3_large", 320)
    assert ssd_messages()[-1:] == ["weights: ssdlite320_mobilenet_v3_large_coco holds a ssdlite320_mobilenet_v3_large "
                                   "model for 320 px inputs: training that"]


# -------------------------------------------------------------------------------------------- backbones
def test_backbone_imagenet_downloads_the_models_file(monkeypatch, tmp_path, cache, mobilenet_state):
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", mobilenet_state)
    model = build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights="imagenet")
    assert entry.cached and model.config.options["reduced_tail"] is False
    first = model.backbone.stages[0][0][0].weight
    assert torch.equal(first, mobilenet_state["features.0.0.weight"])


def test_backbone_imagenet_offline_names_the_file_and_the_option(monkeypatch, tmp_path, cache):
    entry = unreachable(monkeypatch, tmp_path, "vgg16")
    with pytest.raises(BackboneWeightsError) as raised:
        build_model("ssd300_vgg16", 2, backbone_weights="imagenet")
    assert str(raised.value).endswith(f"Download {entry.url} another way and put it at {cache / entry.filename} (the "
                                      "torch hub cache), or pass the path of a copy: --backbone-weights PATH")


# -------------------------------------------------------------------------------------------- ssd weights
def rows(text: str) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in text.splitlines()[2:] if line and not line[0].isspace()
            and line.split()[0] in hub.catalog()}


def test_ssd_weights_lists_names_and_cache_state(monkeypatch, tmp_path, cache, capsys, mobilenet_state):
    entry = publish(monkeypatch, tmp_path, "mobilenet_v3_large", mobilenet_state)
    assert main(["weights"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"cache: {cache}\n")
    listed = rows(out)
    assert list(listed) == hub.known_names()
    assert listed["ssd300_vgg16_coco"] == ["ssd300_vgg16_coco", "detector", "ssd300_vgg16", "no",
                                           "ssd300_vgg16_coco-b556d3b4.pth"]
    assert listed["vgg16"] == ["vgg16", "backbone", "ssd300_vgg16", "/", "ssd512_vgg16", "no", "vgg16-397923af.pth"]
    assert f"  mobilenet_v3_large: {entry.url}\n" in out
    assert main(["weights", "--download", "mobilenet_v3_large"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"mobilenet_v3_large: {entry.path}\n")
    assert rows(out)["mobilenet_v3_large"][-2:] == ["yes", entry.filename]


def test_ssd_weights_download_checks_every_name_first(monkeypatch, tmp_path, cache, capsys):
    unreachable(monkeypatch, tmp_path, "vgg16")
    assert main(["weights", "--download", "vgg16", "vgg1"]) == 2
    assert capsys.readouterr().err == "error: ssd weights --download vgg1: not a known name; did you mean 'vgg16'?\n"
    assert main(["weights", "--download", "vgg16"]) == 1
    downloading, error = capsys.readouterr().err.splitlines()
    assert downloading.startswith("vgg16: downloading file://") and error.startswith("error: cannot download vgg16 (")

"""Importing detectors of ssd.pytorch, torchvision and lufficc/SSD: the same outputs as the original networks, the
same detections as torchvision's, fine-tuning that carries class rows over, and a clear error for every file that
does not fit. No network, no real weights: every file is made here."""

import json
import logging
import math
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.models.detection import ssd300_vgg16, ssdlite320_mobilenet_v3_large

import ssd
from builders import make_dataset
from ssd.cli import main
from ssd.errors import BackboneWeightsError, CheckpointError, ConfigError, WeightsImportError
from ssd.models import build_model
from ssd.models.finetune import match_classes, set_backbone_trainable
from ssd.models.load import model_from_checkpoint, read_weights
from ssd.postprocess import postprocess_detections
from ssd.priors import PRIOR_CONFIGS, default_boxes
from ssd.training.config import TrainConfig
from ssd.weights.checkpoint import FORMAT, load_checkpoint
from ssd.weights.identify import VOC_NAMES, coco_categories, coco_names

REFERENCE = Path(
    os.environ.get("SSD_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data")
).parent / "reference"
BGR_MEAN = (104.0, 117.0, 123.0)  # what ssd.pytorch subtracts from OpenCV's BGR image before reordering it to RGB


def reference(name):
    path = REFERENCE / name
    if not path.is_file():
        pytest.skip(f"reference file not found: {path} (set SSD_SHARED_DATA to <shared>/data)")
    return path


def original_state() -> dict:
    """The original port's SSD300 VOC weights, rebuilt as ../shared/reference/README.md describes."""
    keys = json.loads(reference("ssd_pytorch_state_keys.json").read_text())
    generator = torch.Generator().manual_seed(0)
    state = {}
    for key, shape in keys:
        if key == "L2Norm.weight":
            state[key] = torch.full(shape, 20.0)
        elif key.endswith(".bias"):
            state[key] = (torch.rand(shape, generator=generator) - 0.5) * 0.02
        else:
            out, inp, kh, kw = shape
            bound = math.sqrt(6 / (inp * kh * kw + out * kh * kw))
            state[key] = (torch.rand(shape, generator=generator) * 2 - 1) * bound
    return state


@pytest.fixture(scope="module")
def original_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("original") / "ssd300_VOC.pth"
    torch.save(original_state(), path)
    return path


@pytest.fixture(scope="module")
def original(original_file):
    return ssd.import_model(original_file)


def original_pipeline(picture: np.ndarray) -> torch.Tensor:
    """ssd.pytorch's test-time input for RGB ``picture`` ``[B, 3, H, W]`` in 0..255 (its size already the network's):
    OpenCV's BGR array minus (104, 117, 123), then reordered to RGB (``img[:, :, (2, 1, 0)]`` in its datasets)."""
    bgr = picture[:, ::-1].astype(np.float32)
    bgr = bgr - np.array(BGR_MEAN, np.float32)[:, None, None]
    return torch.from_numpy(np.ascontiguousarray(bgr[:, ::-1]))


@pytest.mark.slow
def test_original_port_reproduces_the_reference_outputs(original):
    with np.load(reference("ssd_pytorch_forward.npz")) as data:
        x, loc, conf = (torch.from_numpy(data[k]) for k in ("x", "loc", "conf"))
    with torch.no_grad():
        ours_loc, ours_logits = original(x)  # x is the network input itself: the weights are mapped one to one
    torch.testing.assert_close(ours_loc, loc, rtol=0, atol=1e-4)
    torch.testing.assert_close(ours_logits, conf, rtol=0, atol=1e-4)
    with np.load(reference("priors_ssd300.npz")) as data:
        assert torch.equal(original.priors, torch.from_numpy(data["priors"]))
    assert original.class_names == list(VOC_NAMES) and original.config.name == "ssd300_vgg16"
    assert not original.training


@pytest.mark.slow
def test_original_port_takes_rgb_pictures_in_0_1(original):
    picture = torch.rand(1, 3, 300, 300, generator=torch.Generator().manual_seed(100))
    batch, sizes = original.preprocess(list(picture))
    expected = original_pipeline(picture.numpy() * 255)
    torch.testing.assert_close(batch, expected, rtol=0, atol=1e-4)  # R - 123, G - 117, B - 104 on 0..255
    assert sizes.tolist() == [[300, 300]]
    with torch.no_grad():
        for ours, theirs in zip(original(batch), original(expected)):
            torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-3)


@pytest.mark.slow
def test_original_port_through_ssd_predict(original_file, original, tmp_path, capsys):
    picture = (torch.rand(1, 3, 300, 300, generator=torch.Generator().manual_seed(7)) * 255).round().to(torch.uint8)
    Image.fromarray(picture[0].permute(1, 2, 0).numpy()).save(tmp_path / "picture.png")  # lossless
    assert main(["predict", "--weights", str(original_file), "--source", str(tmp_path / "picture.png"),
                 "--conf", "0.05", "--max-det", "50", "--device", "cpu", "--save-dir", str(tmp_path / "out"),
                 "--no-save-images"]) == 0
    assert "imported ssd.pytorch VGG16 SSD300 (21 outputs, VOC default boxes)" in capsys.readouterr().err
    detections = json.loads((tmp_path / "out" / "predictions.json").read_text())["images"][0]["detections"]
    with torch.no_grad():
        loc, logits = original(original_pipeline(picture.numpy()))
    [want] = postprocess_detections(loc, logits, original.priors, score_threshold=0.05, max_detections=50)
    assert len(detections) == len(want["scores"]) > 0
    torch.testing.assert_close(torch.tensor([d["box"] for d in detections]), want["boxes"] * 300, rtol=0, atol=1e-3)
    torch.testing.assert_close(torch.tensor([d["score"] for d in detections]), want["scores"], rtol=0, atol=1e-5)
    assert [d["name"] for d in detections] == [VOC_NAMES[k] for k in want["labels"].tolist()]


@pytest.mark.slow
def test_read_weights_gives_a_checkpoint_dict_for_any_file(original_file, original, tmp_path):
    ckpt = read_weights(original_file)
    assert ckpt["format"] == FORMAT and ckpt["class_names"] == list(VOC_NAMES)
    assert ckpt["config"] == original.config.to_dict()
    rebuilt = model_from_checkpoint(ckpt)
    for key, value in original.state_dict().items():
        assert torch.equal(rebuilt.state_dict()[key], value), key
    ssd.save_checkpoint(tmp_path / "own.pt", rebuilt, epoch=3)
    assert read_weights(tmp_path / "own.pt")["epoch"] == 3


def lufficc_file(state: dict, path: Path) -> Path:
    """The same tensors under lufficc/SSD's names, in its training checkpoint layout."""
    prefixes = {"vgg": "backbone.vgg", "L2Norm": "backbone.l2_norm", "extras": "backbone.extras",
                "loc": "box_head.predictor.reg_headers", "conf": "box_head.predictor.cls_headers"}
    renamed = {f"{prefixes[k.split('.', 1)[0]]}.{k.split('.', 1)[1]}": v for k, v in state.items()}
    torch.save({"model": renamed, "iteration": 120000}, path)
    return path


@pytest.mark.slow
def test_lufficc_checkpoint_gives_the_same_model(original, tmp_path):
    model = ssd.import_model(lufficc_file(original_state(), tmp_path / "model_final.pth"))
    assert model.config == original.config and model.class_names == original.class_names
    for key, value in original.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key


def ssd512_file(outputs: int, path: Path, lufficc: bool = False) -> tuple[Path, dict]:
    """An SSD512 file in the original port's layout from the tensors of one of our models (and that model's state)."""
    torch.manual_seed(0)
    ours = build_model("ssd512_vgg16", outputs - 1).state_dict()
    state = {}
    for key, value in ours.items():
        parts = key.split(".")
        if key.startswith("backbone.features."):
            state[f"vgg.{parts[2]}.{parts[3]}"] = value
        elif key.startswith("backbone.fc."):
            state[f"vgg.{30 + int(parts[2])}.{parts[3]}"] = value
        elif key.startswith("backbone.extras."):
            state[f"extras.{2 * int(parts[2]) + int(parts[3]) // 2}.{parts[4]}"] = value
        elif key.startswith("heads."):
            state[f"{'loc' if parts[2] == 'loc' else 'conf'}.{parts[1]}.{parts[3]}"] = value
        elif key == "backbone.l2norm.weight":
            state["L2Norm.weight"] = value
    if lufficc:
        return lufficc_file(state, path), ours
    torch.save(state, path)
    return path, ours


@pytest.mark.slow
@pytest.mark.parametrize("lufficc", [False, True], ids=["ssd.pytorch", "lufficc"])
def test_ssd512_and_coco_default_boxes(tmp_path, lufficc):
    path, ours = ssd512_file(81, tmp_path / "ssd512_COCO.pth", lufficc)
    model = ssd.import_model(path)
    assert model.config.name == "ssd512_vgg16" and model.class_names == list(coco_names())
    assert model.config.priors.min_sizes == (20.48, 51.2, 133.12, 215.04, 296.96, 378.88, 460.8)  # COCO boxes
    for key, value in model.state_dict().items():
        if key != "priors":
            assert torch.equal(value, ours[key]), key


@pytest.mark.slow
def test_ssd_pytorch_coco_uses_its_coco_default_boxes(tmp_path):
    state = original_state()
    for key in [k for k in state if k.startswith("conf.")]:  # 81 outputs per box instead of 21
        boxes = state[key].shape[0] // 21
        state[key] = torch.zeros(boxes * 81, *state[key].shape[1:])
    torch.save(state, tmp_path / "COCO.pth")
    model = ssd.import_model(tmp_path / "COCO.pth", class_names="coco")
    coco = dict(PRIOR_CONFIGS["ssd300"].to_dict(), min_sizes=[21, 45, 99, 153, 207, 261],
                max_sizes=[45, 99, 153, 207, 261, 315])
    assert torch.equal(model.priors, default_boxes(300, **coco)) and model.num_classes == 80


# ------------------------------------------------------------------------------------------------- torchvision
def torchvision_detector(builder):
    """A torchvision COCO detector with random weights whose class scores are spread (distinct detections) and
    whose 10 "N/A" outputs are never chosen (as after training: they are never positives)."""
    torch.manual_seed(0)
    net = builder(weights=None, weights_backbone=None).eval()
    na = [i for i, name in enumerate(coco_categories()) if name == "N/A"]
    images = [torch.rand(3, 320, 320, generator=torch.Generator().manual_seed(9))]
    with torch.no_grad():
        features = list(net.backbone(net.transform(images)[0].tensors).values())
        for feature, block in zip(features, net.head.classification_head.module_list):
            conv = block if isinstance(block, torch.nn.Conv2d) else block[-1]
            conv.weight.mul_(4 / conv(feature).std())
            conv.weight.view(-1, 91, *conv.weight.shape[1:])[:, na] = 0
            conv.bias.view(-1, 91)[:, na] = -100
    # our post-processing settings (torchvision's SSDLite defaults differ)
    net.score_thresh, net.nms_thresh, net.detections_per_img, net.topk_candidates = 0.01, 0.45, 200, 400
    return net


def torchvision_files(builder, size, tmp_path_factory):
    net = torchvision_detector(builder)
    path = tmp_path_factory.mktemp("torchvision") / f"{builder.__name__}_coco.pth"
    torch.save(net.state_dict(), path)
    return net, ssd.import_model(path), size, path


@pytest.fixture(scope="module")
def vgg_pair(tmp_path_factory):
    return torchvision_files(ssd300_vgg16, 300, tmp_path_factory)


@pytest.fixture(scope="module")
def lite_pair(tmp_path_factory):
    return torchvision_files(ssdlite320_mobilenet_v3_large, 320, tmp_path_factory)


@pytest.fixture(params=["vgg_pair", "lite_pair"], ids=["ssd300_vgg16", "ssdlite320"])
def torchvision_pair(request):
    """(torchvision model, its import, input size, the file)."""
    return request.getfixturevalue(request.param)


@pytest.mark.slow
def test_torchvision_head_outputs_and_default_boxes(torchvision_pair):
    net, model, size, _ = torchvision_pair
    images = [torch.rand(3, size, size, generator=torch.Generator().manual_seed(1))]
    real = [i for i, name in enumerate(coco_categories()) if name != "N/A"]  # background + the 80 classes
    with torch.no_grad():
        batch, _ = model.preprocess(images)
        loc, logits = model(batch)
        tensors = net.transform(images)[0]
        features = list(net.backbone(tensors.tensors).values())
        head = net.head(features)
        anchors = net.anchor_generator(tensors, features)[0] / size  # xyxy normalized
    torch.testing.assert_close(batch, tensors.tensors, rtol=0, atol=1e-5)
    torch.testing.assert_close(loc, head["bbox_regression"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, head["cls_logits"][..., real], rtol=1e-5, atol=1e-5)
    centres, sizes = (anchors[:, :2] + anchors[:, 2:]) / 2, anchors[:, 2:] - anchors[:, :2]
    torch.testing.assert_close(model.priors, torch.cat((centres, sizes), 1), rtol=0, atol=1e-6)
    assert model.class_names == list(coco_names()) and len(model.class_names) == 80


def assert_same_detections(got: dict, want: dict, size: int) -> None:
    """Each detection of ``want`` has one in ``got`` with the same label, score (1e-5) and box (1e-5 of the image
    size); the order of equal scores may differ."""
    assert len(got["scores"]) == len(want["scores"]) > 10
    unused = set(range(len(got["scores"])))
    for box, score, label in zip(want["boxes"], want["scores"], want["labels"].tolist()):
        candidates = [i for i in unused if got["labels"][i] == label]
        assert candidates, f"no detection of class {label} left"
        best = min(candidates, key=lambda i: (got["boxes"][i] - box).abs().max().item())
        assert (got["boxes"][best] - box).abs().max().item() / size < 1e-5
        assert abs(got["scores"][best].item() - score.item()) < 1e-5
        unused.remove(best)


@pytest.mark.slow
def test_torchvision_detections(torchvision_pair):
    net, model, size, _ = torchvision_pair
    images = [torch.rand(3, size, size, generator=torch.Generator().manual_seed(2))]
    to_ours = {j: k for k, j in enumerate(i for i, name in enumerate(coco_categories()) if name != "N/A" and i > 0)}
    with torch.no_grad():
        theirs = net(images)
    for want, image in zip(theirs, images):
        threshold = want["scores"][99:101].mean().item()  # about 100 detections, none near the threshold
        [got] = model.predict([image], score_threshold=threshold, iou_threshold=0.45, max_detections=200)
        keep = want["scores"] > threshold
        labels = torch.tensor([to_ours[j] for j in want["labels"][keep].tolist()])
        assert_same_detections(got, {"boxes": want["boxes"][keep], "scores": want["scores"][keep], "labels": labels},
                               size)
        assert got["names"] == [model.class_names[k] for k in got["labels"].tolist()]


@pytest.mark.slow
def test_fine_tune_carries_person_and_dog_rows(torchvision_pair, caplog):
    net, _, _, path = torchvision_pair
    names = ["Dog", "unicorn", "person"]
    with caplog.at_level(logging.INFO, logger="ssd"):
        model = model_from_checkpoint(path, class_names=names, reinit_heads=True)
    assert "carried over for 2 (Dog <- dog, person); initialised for 1 (unicorn)" in caplog.text
    columns = [0, coco_categories().index("dog"), None, coco_categories().index("person")]
    theirs = net.state_dict()
    for level, block in enumerate(net.head.classification_head.module_list):
        suffix = "" if isinstance(block, torch.nn.Conv2d) else ".1"
        for kind in ("weight", "bias"):
            old = theirs[f"head.classification_head.module_list.{level}{suffix}.{kind}"].unflatten(0, (-1, 91))
            new = model.state_dict()[f"heads.{level}.cls{suffix}.{kind}"].unflatten(0, (-1, 4))
            for c, source in enumerate(columns):
                if source is not None:
                    assert torch.equal(new[:, c], old[:, source]), (level, kind, c)  # all boxes of the level
                elif kind == "weight":  # initialised afresh (biases start at 0, as the file's do)
                    assert not any(torch.equal(new[:, c], old[:, j]) for j in range(91))
        loc = f"head.regression_head.module_list.{level}{suffix}.weight"
        assert torch.equal(model.state_dict()[f"heads.{level}.loc{suffix}.weight"], theirs[loc])


def test_class_matching_rules():
    assert match_classes(VOC_NAMES, ["motorcycle", "TV", "Airplane", "couch", "dining_table", "Potted-Plant",
                                     "giraffe"]) == [0, 14, 20, 1, 18, 11, 16, None]
    assert match_classes(coco_names(), ["motorbike", "tvmonitor", "aeroplane"]) == [
        0, coco_names().index("motorcycle") + 1, coco_names().index("tv") + 1, coco_names().index("airplane") + 1]
    assert match_classes(["cat"], ["catfish", "cats"]) == [0, None, None]  # no loose matching


def person_dog_dataset(root: Path) -> Path:
    """A tiny VOC dataset whose classes are person, dog and circle (synthetic shapes renamed)."""
    from ssd.data.synthetic import SHAPE_NAMES

    make_dataset("voc", root, train=8, val=4, size=64, classes=3)
    names = {SHAPE_NAMES[0]: "person", SHAPE_NAMES[1]: "dog", SHAPE_NAMES[2]: "circle"}
    (root / "classes.txt").write_text("\n".join(names.values()) + "\n")
    for xml in (root / "Annotations").glob("*.xml"):
        text = xml.read_text()
        for old, new in names.items():
            text = text.replace(f"<name>{old}</name>", f"<name>{new}</name>")
        xml.write_text(text)
    return root


@pytest.mark.slow
def test_fine_tune_training_runs_end_to_end(lite_pair, tmp_path, capsys):
    path = lite_pair[3]
    data = person_dog_dataset(tmp_path / "data")
    assert main(["train", "--data", str(data), "--weights", str(path), "--epochs", "1", "--batch-size", "4",
                 "--workers", "0", "--project", str(tmp_path / "runs"), "--quiet", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "imported torchvision SSDLite MobileNetV3-Large detector (91 outputs" in err
    assert "carried over for 2 (person, dog); initialised for 1 (circle)" in err
    ckpt = load_checkpoint(tmp_path / "runs" / "exp" / "weights" / "last.pt")
    assert ckpt["class_names"] == ["person", "dog", "circle"] and ckpt["config"]["mean"] == [0.5, 0.5, 0.5]


@pytest.mark.slow
@pytest.mark.parametrize("freeze_epochs", [None, 1])
def test_freeze_backbone_keeps_it_for_freeze_epochs(lite_pair, tmp_path, freeze_epochs):
    """--freeze backbone: the base network stays as imported (every epoch, or the first freeze_epochs), the rest
    trains; afterwards everything trains."""
    from ssd.training.trainer import train

    path = lite_pair[3]
    data = person_dog_dataset(tmp_path / "data")
    start = model_from_checkpoint(path, class_names=["person", "dog", "circle"], reinit_heads=True).state_dict()
    options = {} if freeze_epochs is None else {"freeze_epochs": freeze_epochs}
    result = train(data=str(data), weights=str(path), epochs=2, batch_size=4, workers=0, quiet=True, device="cpu",
                   project=str(tmp_path / "runs"), freeze="backbone", num_plot_images=0, **options)
    end = result.model.state_dict()
    # convolutions: a step of a 1e-5 warmup lr on a BatchNorm scale of 1.0 is lost to float32 rounding
    base = [k for k in start if k.startswith("backbone.stages.") and start[k].ndim == 4]
    heads = [k for k in start if k.startswith("heads.") and k.endswith(".weight")]
    assert base and heads and not all(torch.equal(start[k], end[k].cpu()) for k in heads)  # the heads train
    unchanged = [torch.equal(start[k], end[k].cpu()) for k in base]
    assert all(unchanged) if freeze_epochs is None else not any(unchanged)


# ------------------------------------------------------------------------------------------------- backbones
def vgg_backbone_state(layout: str) -> tuple[dict, dict]:
    """(file state, our backbone's state) for a VGG16 backbone file: ssd.pytorch's ``vgg16_reducedfc`` layout or
    torchvision's ``vgg16_features`` one (whose classifier holds NaN; a small one here, only its values matter)."""
    torch.manual_seed(1)
    ours = build_model("ssd300_vgg16", 1).backbone.state_dict()
    if layout == "reducedfc":
        state = {f"{k.split('.')[1]}.{k.split('.')[2]}": v for k, v in ours.items() if k.startswith("features.")}
        state.update({f"{30 + int(k.split('.')[1])}.{k.split('.')[2]}": v for k, v in ours.items()
                      if k.startswith("fc.")})
    else:
        state = {k: v for k, v in ours.items() if k.startswith("features.")}
        state.update({"classifier.0.weight": torch.full((4, 4), float("nan")), "classifier.0.bias": torch.zeros(4)})
    return state, ours


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["reducedfc", "features"])
def test_vgg_backbone_files_and_their_normalization(layout, tmp_path):
    state, ours = vgg_backbone_state(layout)
    torch.save(state, tmp_path / "vgg.pth")
    model = build_model("ssd300_vgg16", 2, backbone_weights=tmp_path / "vgg.pth")
    loaded = model.backbone.state_dict()
    for key, value in ours.items():
        if key.startswith("features.") or (layout == "reducedfc" and key.startswith("fc.")):
            assert torch.equal(loaded[key], value), key
    assert all(torch.isfinite(v).all() for v in loaded.values())
    mean = (123 / 255, 117 / 255, 104 / 255) if layout == "reducedfc" else (0.48235, 0.45882, 0.40784)
    assert model.config.mean == pytest.approx(mean) and model.config.std == pytest.approx((1 / 255,) * 3)
    assert model_from_checkpoint_round_trip(model, tmp_path).config.mean == model.config.mean


def model_from_checkpoint_round_trip(model, tmp_path):
    ssd.save_checkpoint(tmp_path / "model.pt", model)
    return model_from_checkpoint(tmp_path / "model.pt")


# ----------------------------------------------------------------------------------------------------- errors
def test_backbone_file_given_as_a_detector(tmp_path):
    state, _ = vgg_backbone_state("reducedfc")
    torch.save(state, tmp_path / "vgg16_reducedfc.pth")
    with pytest.raises(WeightsImportError, match=r"is a backbone file \(vgg16_reducedfc: keys 0.weight \[64, 3, 3, 3\]"
                                                 r".*not a detector.*--backbone-weights"):
        ssd.import_model(tmp_path / "vgg16_reducedfc.pth")
    from torchvision.models import mobilenet_v3_large

    torch.save(mobilenet_v3_large().state_dict(), tmp_path / "mobilenet.pth")
    with pytest.raises(WeightsImportError, match=r"backbone file \(mobilenet_v3_large.*ssdlite320_mobilenet_v3_large"):
        ssd.load(tmp_path / "mobilenet.pth")


def test_detector_file_given_as_a_backbone(original_file):
    with pytest.raises(BackboneWeightsError, match=r"ssd300_VOC\.pth is not a backbone: it holds a detector of "
                                                   r"the ssd\.pytorch format \(VGG16 backbone\); give it to weights= "
                                                   r"\(--weights\), which imports it, or convert it once with `ssd "
                                                   r"import`$"):
        build_model("ssd300_vgg16", 2, backbone_weights=original_file)


def test_truncated_file(original_file, tmp_path):
    cut = tmp_path / "cut.pth"
    cut.write_bytes(original_file.read_bytes()[:100_000])
    with pytest.raises(CheckpointError, match=r"cut\.pth is truncated"):
        ssd.import_model(cut)
    with pytest.raises(CheckpointError, match="truncated"):
        model_from_checkpoint(cut)


def test_another_architecture_names_the_formats_tried(tmp_path):
    from torchvision.models import resnet18

    torch.save(resnet18().state_dict(), tmp_path / "resnet18.pth")
    with pytest.raises(WeightsImportError, match=r"resnet18\.pth is not an ssd checkpoint and fits none of the formats "
                                                 r"tried \(ssd\.pytorch: .*torchvision: .*lufficc: .*\); it holds a "
                                                 r"plain state dict of no known detector or backbone \(keys "
                                                 r"conv1\.weight \[64, 3, 7, 7\], bn1\.weight \[64\]"):
        ssd.import_model(tmp_path / "resnet18.pth")


def test_forced_format_that_does_not_match(original_file):
    with pytest.raises(WeightsImportError, match=r"fits none of the formats tried \(torchvision: .*\) \(it looks like "
                                                 r"a detector of the ssd\.pytorch format \(VGG16 backbone\)\); it "
                                                 r"holds keys vgg\.0\.weight"):
        ssd.import_model(original_file, format="torchvision")
    with pytest.raises(ValueError, match="format='caffe' is not one of auto, ssd.pytorch, torchvision, lufficc"):
        ssd.import_model(original_file, format="caffe")


def test_other_default_box_counts_name_the_layers_and_shapes(tmp_path):
    state = original_state()
    state["loc.0.weight"] = torch.zeros(24, 512, 3, 3)  # 6 boxes per location on conv4_3 instead of 4
    state["loc.0.bias"] = torch.zeros(24)
    state["conf.0.weight"] = torch.zeros(6 * 21, 512, 3, 3)
    state["conf.0.bias"] = torch.zeros(6 * 21)
    torch.save(state, tmp_path / "six_boxes.pth")
    with pytest.raises(WeightsImportError, match=r"is a ssd.pytorch VGG16 SSD300 .* does not fit ssd300_vgg16 .*"
                                                 r"wrong shapes \(4\): loc\.0\.weight \[24, 512, 3, 3\] \(expected "
                                                 r"\[16, 512, 3, 3\]\), loc\.0\.bias \[24\] \(expected \[16\]\)"):
        ssd.import_model(tmp_path / "six_boxes.pth")


def test_lufficc_mobilenet_names_the_part_that_does_not_fit(tmp_path):
    state = {"backbone.features.0.0.weight": torch.zeros(16, 3, 3, 3),
             "box_head.predictor.cls_headers.0.conv.0.weight": torch.zeros(112, 1, 3, 3),
             "box_head.predictor.cls_headers.0.conv.3.weight": torch.zeros(126, 112, 1, 1),
             "box_head.predictor.cls_headers.5.weight": torch.zeros(126, 64, 1, 1),
             "box_head.predictor.reg_headers.0.conv.3.weight": torch.zeros(24, 112, 1, 1)}
    torch.save({"model": state, "iteration": 1}, tmp_path / "mobilenet_v3_ssd320_voc0712.pth")
    with pytest.raises(WeightsImportError, match=r"lufficc/SSD detector whose backbone is not VGG16 \(keys backbone\."
                                                 r"features\.0\.0\.weight, \.\.\.; prediction levels with \[112, 64\] "
                                                 r"channels\).*ssd imports lufficc's VGG16 SSD300 and SSD512"):
        ssd.import_model(tmp_path / "mobilenet_v3_ssd320_voc0712.pth")


def test_class_names_must_fit_the_file(original_file, tmp_path):
    with pytest.raises(WeightsImportError, match=r"has 20 classes .* but 80 class names were given"):
        ssd.import_model(original_file, class_names="coco")
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"thing{k}" for k in range(20)) + "\n\n")
    assert ssd.import_model(original_file, class_names=str(names)).class_names[-1] == "thing19"


# ------------------------------------------------------------------------------------------------ command line
def test_ssd_import_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["import", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "usage: ssd import" in out and "--classes" in out and "ssd.pytorch,torchvision,lufficc" in out


def test_ssd_import_command(original_file, tmp_path, capsys):
    out = tmp_path / "voc.pt"
    assert main(["import", str(original_file), "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert "imported ssd.pytorch VGG16 SSD300" in captured.err and f"wrote {out}" in captured.out
    assert load_checkpoint(out)["class_names"] == list(VOC_NAMES)
    assert main(["import", str(original_file), "--output", str(out), "--classes", "coco"]) == 1
    assert "has 20 classes" in capsys.readouterr().err
    assert main(["import", str(original_file), "--output", str(out), "--format", "lufficc"]) == 1
    assert "fits none of the formats tried (lufficc:" in capsys.readouterr().err
    assert main(["import", str(out), "--output", str(tmp_path / "again.pt")]) == 1
    assert "is already a checkpoint of this library" in capsys.readouterr().err


@pytest.mark.parametrize("link", ["same-path", "hard-link", "symlink"])
def test_ssd_import_refuses_to_write_over_its_source(original_file, tmp_path, capsys, link):
    source = tmp_path / "tv.pth"
    source.write_bytes(original_file.read_bytes())
    output = {"same-path": source, "hard-link": tmp_path / "tv-link.pth", "symlink": tmp_path / "tv-sym.pth"}[link]
    if link == "hard-link":
        os.link(source, output)
    elif link == "symlink":
        output.symlink_to(source)
    assert main(["import", str(source), "--output", str(output)]) == 1
    assert capsys.readouterr().err == (f"error: --output {output} is the input {source} (the same file); choose "
                                       "another --output so the input is kept\n")
    assert source.read_bytes() == original_file.read_bytes()


def test_ssd_import_refuses_to_write_over_its_class_names_file(original_file, tmp_path, capsys):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(f"thing{k}" for k in range(20)) + "\n")
    assert main(["import", str(original_file), "--output", str(names), "--classes", str(names)]) == 1
    assert "is the input" in capsys.readouterr().err and names.read_text().startswith("thing0\n")


# ---------------------------------------------------------------------------------------------------- freezing
def test_set_backbone_trainable():
    model = build_model("ssd_tiny", 2).train()
    frozen = set_backbone_trainable(model, False)
    stages = {id(p) for p in model.backbone.stages.parameters()}
    assert frozen == len(stages) > 0
    for parameter in model.parameters():
        assert parameter.requires_grad == (id(parameter) not in stages)
    norms = [m for m in model.backbone.stages.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and not any(m.training for m in norms)  # frozen statistics
    set_backbone_trainable(model, True)
    assert all(p.requires_grad for p in model.parameters()) and all(m.training for m in norms)
    vgg = build_model("ssd300_vgg16", 2)
    set_backbone_trainable(vgg, False)
    trainable = {name.split(".")[1] for name, p in vgg.named_parameters() if p.requires_grad and "backbone" in name}
    assert trainable == {"extras", "l2norm"}


def test_freeze_options():
    config = TrainConfig().update(freeze="backbone", freeze_epochs=3)
    assert (config.freeze, config.freeze_epochs) == ("backbone", 3)
    with pytest.raises(ConfigError, match="freeze='all' is invalid: choose one of none, backbone"):
        TrainConfig().update(freeze="all")
    with pytest.raises(ConfigError, match="freeze_epochs=-1 is invalid"):
        TrainConfig().update(freeze_epochs=-1)


@pytest.mark.parametrize("name", ["model.onnx", "model.bin"])  # by its suffix, and by its first bytes
def test_ssd_import_of_an_onnx_export_says_what_it_is_and_what_to_do(tmp_path, capsys, name):
    import gzip

    source = tmp_path / name
    source.write_bytes(gzip.decompress((Path(__file__).parent / "data" / "legacy.onnx.gz").read_bytes()))
    assert main(["import", str(source), "--output", str(tmp_path / "out.pt")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"error: {source} is not PyTorch weights: it is an ONNX model: ONNX exports of this library run "
                   "as they are (ssd predict / ssd val / ssd benchmark --weights FILE.onnx) and are not converted "
                   "back: give the PyTorch checkpoint (.pt) the export was made from")
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("head, what", [
    (len(b'{"w": {}}').to_bytes(8, "little") + b'{"w": {}}', "a safetensors file: read it with safetensors.torch"),
    (b"\x89HDF\r\n\x1a\n" + bytes(64), "an HDF5 file (Keras / TensorFlow weights)"),
    (b"\x93NUMPY\x01\x00" + bytes(64), "a NumPy array file"),
    (b"\x1f\x8b\x08\x00" + bytes(64), "a gzip-compressed file: decompress it first (gunzip FILE)"),
])
def test_weights_of_another_framework_are_named_not_called_corrupt(tmp_path, head, what):
    path = tmp_path / "weights.bin"
    path.write_bytes(head)
    with pytest.raises(CheckpointError, match=rf"^{path} is not PyTorch weights: it is {re.escape(what)}"):
        read_weights(path)

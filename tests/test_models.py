"""Models: shapes and default-box counts, torchvision parity, prior order, predict in original pixels, backbone weights.

Big models are built and run on the meta device (shapes only, no compute) to keep the suite fast.
"""

import math

import pytest
import torch
import torchvision
from torch import nn
from torchvision.models.detection import anchor_utils
from torchvision.models.vgg import cfgs, make_layers

from ssd import PRIOR_CONFIGS, build_model, default_boxes, list_models
from ssd.errors import BackboneWeightsError
from ssd.models import MODEL_CONFIGS
from ssd.models.ssd import LevelHead

CONFIGS = {
    # name: (native size, feature maps, boxes per location, default boxes)
    "ssd300_vgg16": (300, [38, 19, 10, 5, 3, 1], [4, 6, 6, 6, 4, 4], 8732),
    "ssd512_vgg16": (512, [64, 32, 16, 8, 4, 2, 1], [4, 6, 6, 6, 6, 4, 4], 24564),
    "ssdlite320_mobilenet_v3_large": (320, [20, 10, 5, 3, 2, 1], [6] * 6, 3234),
    "ssd_tiny": (256, [32, 16, 8, 4, 2], [4] * 5, 5456),
    "ssd_tiny_fpn": (256, [32, 16, 8, 4, 2], [4] * 5, 5456),
}


def params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_registry_lists_every_configuration():
    assert set(list_models()) == set(CONFIGS) == set(MODEL_CONFIGS)
    assert all(isinstance(text, str) and text for text in list_models().values())


@pytest.mark.parametrize("name", CONFIGS)
def test_shapes_and_default_box_counts(name):
    size, maps, boxes, total = CONFIGS[name]
    assert sum(f * f * a for f, a in zip(maps, boxes)) == total
    with torch.device("meta"):
        model = build_model(name, 5)
        loc, logits = model(torch.empty(2, 3, size, size))
    assert model.config.image_size == model.image_size == size
    assert list(model.config.priors.feature_maps) == maps
    assert [2 + 2 * len(r) for r in model.config.priors.aspect_ratios] == boxes
    assert model.priors.shape == (total, 4)
    assert loc.shape == (2, total, 4) and logits.shape == (2, total, 6)
    assert model.num_classes == 5 and model.class_names == [f"class{k}" for k in range(5)]


@pytest.mark.parametrize("name", ["ssd300_vgg16", "ssd512_vgg16"])
def test_vgg_default_boxes_are_the_papers(name):
    model = build_model(name, 2)
    base = PRIOR_CONFIGS[name[:6]]
    assert model.config.priors == base and base.clip is True
    assert torch.equal(model.priors, default_boxes(model.image_size, **base.to_dict()))


def test_vgg_layers_are_the_papers():
    backbone = build_model("ssd300_vgg16", 2).backbone
    assert backbone.features[16].ceil_mode  # pool3
    assert torch.equal(backbone.l2norm.weight, torch.full((512,), 20.0))
    conv6 = backbone.fc[1]
    assert (conv6.out_channels, conv6.kernel_size, conv6.dilation, conv6.padding) == (1024, (3, 3), (6, 6), (6, 6))
    pool5 = backbone.fc[0]
    assert (pool5.kernel_size, pool5.stride, pool5.padding) == (3, 1, 1)


@pytest.mark.parametrize("name, tv_builder", [
    ("ssd300_vgg16", torchvision.models.detection.ssd300_vgg16),
    ("ssdlite320_mobilenet_v3_large", torchvision.models.detection.ssdlite320_mobilenet_v3_large),
])
def test_parameter_counts_match_torchvision(name, tv_builder):
    with torch.device("meta"):
        ours = build_model(name, 20)
        theirs = tv_builder(weights=None, weights_backbone=None, num_classes=21)
    assert abs(params(ours) - params(theirs)) <= 0.01 * params(theirs)
    assert params(ours) == params(theirs)  # same layers, in fact


def test_tiny_size_and_boxes():
    model = build_model("ssd_tiny", 6)
    assert 1.05e6 < params(model) < 1.15e6
    assert model.config.channels_last is True
    assert sum(isinstance(m, nn.BatchNorm2d) and m.momentum == 0.1 for m in model.modules()) == 11
    smallest = model.priors[: 32 * 32 * 4]
    assert torch.allclose(smallest[0], torch.tensor([4 / 256, 4 / 256, 16 / 256, 16 / 256]))


def test_ssdlite_default_boxes_match_torchvision():
    model = build_model("ssdlite320_mobilenet_v3_large", 3)
    generator = anchor_utils.DefaultBoxGenerator([[2, 3] for _ in range(6)], min_ratio=0.2, max_ratio=0.95)
    theirs = generator._grid_default_boxes([[f, f] for f in CONFIGS["ssdlite320_mobilenet_v3_large"][1]], [320, 320])
    torch.testing.assert_close(model.priors, theirs.clamp(0, 1), atol=1e-6, rtol=0)


def test_level_head_output_order_matches_default_boxes():
    """loc[b, (i*W + j)*A + a, c] must be channel a*4 + c of the head at row i, column j."""
    batch, boxes, height, width = 2, 3, 4, 5
    head_out = torch.arange(batch * boxes * 4 * height * width, dtype=torch.float32)
    head_out = head_out.view(batch, boxes * 4, height, width)

    class Fixed(nn.Module):
        def __init__(self, out):
            super().__init__()
            self.out = out

        def forward(self, feature):
            return self.out

    head = LevelHead(Fixed(head_out), Fixed(head_out), num_outputs=4)
    loc, logits = head(torch.empty(batch, 1, height, width))
    assert loc.shape == (batch, height * width * boxes, 4)
    b, i, j, a, c = 1, 2, 3, 1, 2
    assert loc[b, (i * width + j) * boxes + a, c] == head_out[b, a * 4 + c, i, j]
    assert torch.equal(loc, logits)


def test_forward_levels_follow_prior_order():
    """A level's outputs sit where its default boxes sit: hook each head and compare slices."""
    model = build_model("ssd_tiny", 2).eval()
    outputs = []
    for head in model.heads:
        head.register_forward_hook(lambda module, args, out: outputs.append(out[0]))
    with torch.no_grad():
        loc, _ = model(torch.rand(1, 3, 256, 256))
    start = 0
    for f, level in zip(model.config.priors.feature_maps, outputs):
        assert level.shape[1] == f * f * 4
        assert torch.equal(loc[:, start:start + level.shape[1]], level)
        start += level.shape[1]
    assert start == model.priors.shape[0]


@pytest.mark.parametrize("name", ["ssd_tiny", "ssd_tiny_fpn", "ssdlite320_mobilenet_v3_large"])
def test_real_forward(name):
    model = build_model(name, 3).eval()
    size = model.image_size
    x = torch.randn(1, 3, size, size)
    with torch.no_grad():
        loc, logits = model(x)
        model.to(memory_format=torch.channels_last)
        loc_cl, logits_cl = model(x.contiguous(memory_format=torch.channels_last))
    assert loc.shape == (1, model.priors.shape[0], 4) and logits.shape == (1, model.priors.shape[0], 4)
    assert torch.isfinite(loc).all() and torch.isfinite(logits).all()
    torch.testing.assert_close(loc_cl, loc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits_cl, logits, atol=1e-4, rtol=1e-4)


def test_image_size_override_recomputes_default_boxes():
    model = build_model("ssd_tiny", 2, image_size=320)
    priors = model.config.priors.to_dict()
    assert model.image_size == 320 and priors["feature_maps"] == [40, 20, 10, 5, 3]
    assert priors["steps"] == pytest.approx([8, 16, 32, 64, 320 / 3])
    assert priors["min_sizes"] == pytest.approx([20, 40, 80, 140, 220])  # scaled with the image
    assert model.priors.shape == ((1600 + 400 + 100 + 25 + 9) * 4, 4)
    assert torch.equal(model.priors, default_boxes(320, **priors))
    with torch.device("meta"):
        vgg = build_model("ssd300_vgg16", 2, image_size=512)
        loc, _ = vgg(torch.empty(1, 3, 512, 512))
    assert vgg.config.priors.feature_maps == (64, 32, 16, 8, 6, 4)
    assert loc.shape[1] == vgg.priors.shape[0]


def test_too_small_image_size_is_refused():
    with pytest.raises(ValueError, match="image_size=64 is too small for ssd300_vgg16"):
        build_model("ssd300_vgg16", 2, image_size=64)
    with pytest.raises(ValueError, match=r"image_size=256\.0 is invalid: give N for a square"):
        build_model("ssd_tiny", 2, image_size=256.0)


def test_build_model_argument_errors():
    with pytest.raises(ValueError, match=r"unknown model 'ssd300_vgg'.*did you mean 'ssd300_vgg16'"):
        build_model("ssd300_vgg", 2)
    with pytest.raises(ValueError, match=r"unknown option\(s\) 'width' for model 'ssd_tiny'"):
        build_model("ssd_tiny", 2, width=2)
    with pytest.raises(ValueError, match="give num_classes"):
        build_model("ssd_tiny")
    with pytest.raises(ValueError, match=r"duplicates \['cat'\]"):
        build_model("ssd_tiny", class_names=["cat", "dog", "cat"])
    with pytest.raises(ValueError, match=r"num_classes=3 but 2 class_names"):
        build_model("ssd_tiny", 3, class_names=["cat", "dog"])
    with pytest.raises(ValueError, match=r"class_names\[1\] = ''"):
        build_model("ssd_tiny", class_names=["cat", ""])
    assert build_model("ssd_tiny", class_names=("cat", "dog")).class_names == ["cat", "dog"]


def test_config_is_plain_data():
    config = build_model("ssdlite320_mobilenet_v3_large", 2).config.to_dict()
    plain = (dict, list, str, int, float, bool, type(None))

    def walk(value):
        assert isinstance(value, plain), value
        for item in value.values() if isinstance(value, dict) else value if isinstance(value, list) else []:
            walk(item)

    walk(config)
    assert config["options"] == {"reduced_tail": True}  # as torchvision without backbone weights
    assert config["mean"] == [0.485, 0.456, 0.406] and config["std"] == [0.229, 0.224, 0.225]
    assert config["variances"] == [0.1, 0.2]


# --------------------------------------------------------------------------------------------------- predict
def _fixed_outputs(model, prior_index, label, expected_size):
    """Replace forward: only ``prior_index`` scores high, for ``label``; all offsets zero (boxes = priors)."""
    seen = {}

    def forward(images):
        seen["images"] = images
        assert images.shape[1:] == (3, expected_size, expected_size)
        batch, num_priors = images.shape[0], model.priors.shape[0]
        logits = torch.zeros(batch, num_priors, model.num_classes + 1)
        logits[..., 0] = 10.0
        logits[:, prior_index, label + 1] = 20.0
        return torch.zeros(batch, num_priors, 4), logits

    model.forward = forward
    return seen


def test_predict_returns_original_pixel_coordinates_for_non_square_images():
    model = build_model("ssd_tiny", class_names=["cat", "dog", "bird"])
    prior_index = 32 * 32 * 4 + (5 * 16 + 9) * 4 + 2  # level 2, row 5, column 9, first ratio-2 box
    seen = _fixed_outputs(model, prior_index, label=1, expected_size=256)
    wide = torch.full((3, 200, 400), 255, dtype=torch.uint8)  # h=200, w=400
    tall = torch.rand(3, 90, 30)
    out = model.predict([wide, tall], score_threshold=0.5)
    cx, cy, w, h = model.priors[prior_index].tolist()
    assert (cx, cy) == pytest.approx(((9 + 0.5) / 16, (5 + 0.5) / 16))
    assert (w, h) == pytest.approx((32 / 256 * math.sqrt(2), 32 / 256 / math.sqrt(2)))
    corners = torch.tensor([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2])
    for detection, (height, width) in zip(out, [(200, 400), (90, 30)]):
        assert detection["labels"].tolist() == [1] and detection["names"] == ["dog"]
        assert detection["scores"].item() == pytest.approx(torch.tensor([10.0, 0, 20, 0]).softmax(0)[2].item())
        expected = corners * torch.tensor([width, height, width, height])
        torch.testing.assert_close(detection["boxes"], expected.unsqueeze(0))
    # uint8 255 -> 1.0 -> (1 - mean) / std after the resize
    first = seen["images"][0]
    expected_pixel = (1 - torch.tensor(model.config.mean)) / torch.tensor(model.config.std)
    torch.testing.assert_close(first[:, 100, 100], expected_pixel)


def test_predict_batch_tensor_and_mode_restored():
    model = build_model("ssd_tiny", 2)
    model.train()
    out = model.predict(torch.rand(2, 3, 64, 48), score_threshold=0.0, max_detections=7)
    assert model.training
    assert len(out) == 2 and all(len(d["boxes"]) == 7 for d in out)
    for detection in out:
        boxes = detection["boxes"]
        assert (boxes[:, 0::2] <= 48).all() and (boxes[:, 1::2] <= 64).all() and (boxes >= 0).all()
        assert detection["scores"].tolist() == sorted(detection["scores"].tolist(), reverse=True)


def test_preprocess_rejects_bad_images():
    model = build_model("ssd_tiny", 2)
    with pytest.raises(ValueError, match=r"image 1 must have shape \[3, H, W\].*got \[1, 10, 10\]"):
        model.preprocess([torch.rand(3, 10, 10), torch.rand(1, 10, 10)])
    with pytest.raises(ValueError, match=r"image 0 is floating point with values in \[0, 255\]"):
        model.preprocess([torch.arange(300.0).view(3, 10, 10).clamp(max=255)])
    with pytest.raises(ValueError, match="image 0 must be uint8"):
        model.preprocess([torch.zeros(3, 4, 4, dtype=torch.int32)])
    with pytest.raises(ValueError, match="non-empty list"):
        model.preprocess([])
    batch, sizes = model.preprocess([torch.rand(3, 10, 20), torch.zeros(3, 30, 5, dtype=torch.uint8)])
    assert batch.shape == (2, 3, 256, 256) and batch.dtype == torch.float32
    assert sizes.tolist() == [[10, 20], [30, 5]]


# ------------------------------------------------------------------------------------------- backbone weights
@pytest.fixture(scope="module")
def mobilenet_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("weights") / "mobilenet_v3_large-fake.pth"
    torch.save(torchvision.models.mobilenet_v3_large(weights=None).state_dict(), path)
    return path


def test_mobilenet_backbone_weights_load(mobilenet_file):
    state = torch.load(mobilenet_file, weights_only=True)
    model = build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights=mobilenet_file)
    assert model.config.options["reduced_tail"] is False
    first, last = model.backbone.stages[0], model.backbone.stages[1]
    assert torch.equal(first[0][0].weight, state["features.0.0.weight"])
    assert torch.equal(last[-1][1].running_var, state["features.16.1.running_var"])


def test_mobilenet_reduced_tail_refuses_imagenet_weights(mobilenet_file):
    with pytest.raises(BackboneWeightsError, match=r"reduced_tail=True\) backbone.*wrong shapes"):
        build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights=mobilenet_file, reduced_tail=True)


def test_wrong_architecture_backbone_weights_are_refused(mobilenet_file, tmp_path):
    with pytest.raises(BackboneWeightsError, match=r"do not fit the vgg16.*unexpected keys.*features\.0\.0\.weight"):
        build_model("ssd300_vgg16", 2, backbone_weights=mobilenet_file)
    vgg_file = tmp_path / "vgg-features.pth"
    torch.save({f"features.{k}": v for k, v in make_layers(cfgs["D"]).state_dict().items()}, vgg_file)
    with pytest.raises(BackboneWeightsError, match=r"do not fit the mobilenet_v3_large.*missing keys"):
        build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights=vgg_file)
    with pytest.raises(BackboneWeightsError, match="ssd_tiny has no ImageNet backbone"):
        build_model("ssd_tiny", 2, backbone_weights=vgg_file)


@pytest.mark.slow
def test_vgg_backbone_weights_and_fc_subsampling(tmp_path):
    features = {f"features.{k}": v for k, v in make_layers(cfgs["D"]).state_dict().items()}
    # Broadcast views keep the file small; values tell which row / column landed where.
    fc6 = torch.arange(512 * 7 * 7, dtype=torch.float32).view(1, -1).expand(4096, -1)
    fc7 = torch.arange(4096, dtype=torch.float32).view(-1, 1).expand(-1, 4096)
    state = {**features, "classifier.0.weight": fc6, "classifier.0.bias": torch.arange(4096.0),
             "classifier.3.weight": fc7, "classifier.3.bias": -torch.arange(4096.0),
             "classifier.6.weight": torch.zeros(1000, 4096), "classifier.6.bias": torch.zeros(1000)}
    path = tmp_path / "vgg16-fake.pth"
    torch.save(state, path)
    backbone = build_model("ssd300_vgg16", 2, backbone_weights=path).backbone
    assert torch.equal(backbone.features[28].weight, features["features.28.weight"])
    conv6, conv7 = backbone.fc[1], backbone.fc[3]
    c, y, x = 7, 2, 1
    assert conv6.weight[5, c, y, x] == c * 49 + (3 * y) * 7 + 3 * x
    assert conv6.bias[5] == 20 and conv7.bias[5] == -20
    assert conv7.weight[5, 9, 0, 0] == 20


def test_imagenet_reads_the_hub_cache(mobilenet_file, tmp_path, monkeypatch):
    monkeypatch.setattr(torch.hub, "get_dir", lambda: str(tmp_path))  # downloads: tests/test_hub.py
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "mobilenet_v3_large-8738ca79.pth").write_bytes(mobilenet_file.read_bytes())
    model = build_model("ssdlite320_mobilenet_v3_large", 2, backbone_weights="imagenet")
    assert model.config.options["reduced_tail"] is False


def test_unreadable_backbone_files_are_refused(tmp_path):
    with pytest.raises(BackboneWeightsError, match=r"does not exist.*vgg16-397923af\.pth"):
        build_model("ssd300_vgg16", 2, backbone_weights=tmp_path / "nope.pth")
    garbage = tmp_path / "garbage.pth"
    garbage.write_bytes(b"not a torch file")
    with pytest.raises(BackboneWeightsError, match="cannot read backbone weights"):
        build_model("ssd300_vgg16", 2, backbone_weights=garbage)

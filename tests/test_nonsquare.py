"""Non-square network inputs (height x width): default boxes per axis, configurations, models, data, options, check."""

import math
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image

from ssd.cli import main
from ssd.data import build_dataloader, check_dataset, load_dataset
from ssd.data.coverage import prior_coverage, suggest_image_size
from ssd.data.images import read_image
from ssd.errors import ConfigError
from ssd.matching import match
from ssd.models import build_model
from ssd.models.build import default_priors
from ssd.models.config import ModelConfig
from ssd.nn import state_dict_mismatch
from ssd.priors import PRIOR_CONFIGS, PriorConfig, default_boxes
from ssd.sizes import as_hw
from ssd.training.config import TrainConfig


# ------------------------------------------------------------------------------------------------- sizes, priors
def test_as_hw_forms_and_errors():
    assert as_hw(300) == (300, 300) and as_hw("300") == (300, 300)
    assert as_hw("512x288") == (512, 288) and as_hw(" 512X288 ") == (512, 288)
    assert as_hw([512, 288]) == (512, 288) and as_hw((128, 256)) == (128, 256)
    for bad in ("512x", "x288", "512x288x3", "abc", "-5", 0, -3, 256.0, True, (1, 2, 3), (128, 0), ("1", "2")):
        with pytest.raises(ConfigError, match=r"^image_size=.* is invalid: give N for a square N x N input or HxW "
                                              r"\(height x width, e.g. 512x288\), or a \(height, width\) pair of "
                                              r"positive ints$"):
            as_hw(bad)


@pytest.mark.parametrize(("name", "size"), [("ssd300", 300), ("ssd512", 512)])
def test_square_pair_equals_int_bit_for_bit(name, size):
    config = PRIOR_CONFIGS[name]
    reference = config.boxes(size)
    pairs = dict(config.to_dict(), feature_maps=[(f, f) for f in config.feature_maps],
                 steps=[(s, s) for s in config.steps])
    assert torch.equal(default_boxes((size, size), **pairs), reference)
    assert torch.equal(PriorConfig.from_dict(pairs).boxes((size, size)), reference)
    assert PriorConfig.from_dict(pairs) == config  # square pairs are stored as one value


def _expected(height, width, levels):
    """The boxes written out per level, row i, column j, box (pixel sizes m, M, ratios), unclipped."""
    rows_out = []
    for (rows, cols), (step_y, step_x), m, big, ratios in levels:
        sizes = [(m, m), (math.sqrt(m * big),) * 2]
        for r in ratios:
            sizes += [(m * math.sqrt(r), m / math.sqrt(r)), (m / math.sqrt(r), m * math.sqrt(r))]
        for i in range(rows):
            for j in range(cols):
                cx, cy = (j + 0.5) * step_x / width, (i + 0.5) * step_y / height
                rows_out += [(cx, cy, w / width, h / height) for w, h in sizes]
    return torch.tensor(rows_out, dtype=torch.float64).float()


def test_default_boxes_per_axis_count_order_and_values():
    levels = [((2, 3), (50, 100), 20, 40, [2]), ((1, 2), (100, 150), 60, 90, [])]
    priors = default_boxes((100, 300), feature_maps=[(2, 3), (1, 2)], steps=[(50, 100), (100, 150)],
                           min_sizes=[20, 60], max_sizes=[40, 90], aspect_ratios=[[2], []], clip=False)
    assert priors.shape == (2 * 3 * 4 + 1 * 2 * 2, 4)
    torch.testing.assert_close(priors, _expected(100, 300, levels))
    # centres: columns spread over the width, rows over the height
    assert priors[:12:4, 0].tolist() == pytest.approx([1 / 6, 1 / 2, 5 / 6])
    assert priors[::12, 1][:2].tolist() == pytest.approx([0.25, 0.75])
    # sizes in pixels: squares stay square, the ratio-2 boxes are 2:1 and 1:2
    pixels = priors[:4, 2:] * torch.tensor([300.0, 100.0])
    assert (pixels[:, 0] / pixels[:, 1]).tolist() == pytest.approx([1, 1, 2, 0.5])


def test_a_single_step_applies_to_both_axes():
    priors = default_boxes((64, 128), feature_maps=[(2, 4)], steps=[32], min_sizes=[32], max_sizes=[32],
                           aspect_ratios=[[]])
    torch.testing.assert_close(priors, _expected(64, 128, [((2, 4), (32, 32), 32, 32, [])]))


def test_malformed_per_axis_entries_are_refused():
    with pytest.raises(ValueError, match=r"feature_maps\[1\] = \[2, 3, 4\] must be one number or a \(y, x\) pair"):
        default_boxes(64, [4, [2, 3, 4]], [16, 32], [16, 32], [32, 64], [[2], [2]])
    with pytest.raises(ValueError, match=r"steps\[0\] = \[8\] must be one number or a \(y, x\) pair"):
        PriorConfig(feature_maps=[4], steps=[[8]], min_sizes=[8], max_sizes=[16], aspect_ratios=[[2]])


def test_prior_config_round_trip_with_pairs():
    config = PriorConfig(feature_maps=[[32, 16], 8], steps=[[8, 8], [16, 32]], min_sizes=[16, 32],
                         max_sizes=[32, 64], aspect_ratios=[[2], [2, 3]])
    assert config.feature_maps == ((32, 16), 8) and config.steps == (8, (16, 32))
    plain = config.to_dict()
    assert plain == {"feature_maps": [[32, 16], 8], "steps": [8, [16, 32]], "min_sizes": [16, 32],
                     "max_sizes": [32, 64], "aspect_ratios": [[2], [2, 3]], "clip": True}
    assert PriorConfig.from_dict(yaml.safe_load(yaml.safe_dump(plain))) == config


# ------------------------------------------------------------------------------------------------------ models
def test_model_config_image_size_forms_and_round_trip():
    config = build_model("ssd_tiny", 2, image_size="256x128").config
    assert config.image_size == (256, 128)
    plain = config.to_dict()
    assert plain["image_size"] == [256, 128] and plain["priors"]["feature_maps"][0] == [32, 16]
    assert ModelConfig.from_dict(yaml.safe_load(yaml.safe_dump(plain))) == config
    square = build_model("ssd_tiny", 2, image_size=(128, 128)).config
    assert square.image_size == 128 and square.to_dict()["image_size"] == 128
    assert square == build_model("ssd_tiny", 2, image_size=128).config


def test_build_model_256x128_forwards_and_loads_square_weights():
    model = build_model("ssd_tiny", 3, image_size=(256, 128)).eval()
    priors = model.config.priors
    assert model.image_size == (256, 128)
    assert priors.feature_maps == ((32, 16), (16, 8), (8, 4), (4, 2), (2, 1))
    assert priors.steps == (8.0, 16.0, 32.0, 64.0, 128.0)  # 256 / 32 == 128 / 16: one step per level
    scale = math.sqrt(256 * 128) / 256  # sizes scale by the geometric mean (PriorConfig.scaled_to)
    assert priors.min_sizes == pytest.approx([s * scale for s in (16, 32, 64, 112, 176)])
    assert model.priors.shape == (4 * (32 * 16 + 16 * 8 + 8 * 4 + 4 * 2 + 2 * 1), 4)
    levels = []
    for head in model.heads:  # each head sees a (rows, cols) feature map: the default boxes' grid
        head.register_forward_hook(lambda module, args, out: levels.append(tuple(args[0].shape[-2:])))
    with torch.no_grad():
        loc, logits = model(torch.zeros(1, 3, 256, 128))
    assert tuple(levels) == priors.feature_maps
    assert loc.shape == (1, len(model.priors), 4) and logits.shape == (1, len(model.priors), 4)
    # the heads keep their shapes: a square model's weights load (all but its default boxes)
    square = build_model("ssd_tiny", 3).state_dict()
    assert state_dict_mismatch(model.state_dict(), square) == \
        "wrong shapes (1): priors [5456, 4] (expected [2728, 4])"


def test_build_model_image_size_errors():
    with pytest.raises(ConfigError, match="image_size='256by128' is invalid: give N for a square"):
        build_model("ssd_tiny", 2, image_size="256by128")
    with pytest.raises(ValueError, match="image_size=512x128 is too small for ssd300_vgg16"):
        build_model("ssd300_vgg16", 2, image_size="512x128")


def test_top_right_box_is_matched_by_top_right_default_boxes():
    """The classic swapped-axes bug: with H != W a box at the top right must be matched at the top right."""
    priors = build_model("ssd_tiny", 1, image_size=(128, 256)).priors  # 128 high, 256 wide
    gt = torch.tensor([[[216 / 256, 0.0, 1.0, 32 / 128]]])  # pixels x 216..256, y 0..32
    _, cls_t = match(gt, torch.tensor([[0]]), priors)
    positive = priors[cls_t[0] > 0]
    assert len(positive) >= 2  # not only the forced best match
    cx, cy = positive[:, 0], positive[:, 1]
    assert bool(((cx > 216 / 256) & (cx < 1) & (cy > 0) & (cy < 32 / 128)).all())


# -------------------------------------------------------------------------------------------------------- data
def test_loader_gives_height_by_width_batches_with_boxes_normalized_per_axis(synthetic_voc):
    spec = load_dataset(synthetic_voc)
    records = spec.records("val")[:4]
    loader = build_dataloader(records, spec.class_names, (64, 96), (0.5,) * 3, (0.25,) * 3, train=False,
                              batch_size=4)
    batch = next(iter(loader))
    assert batch["images"].shape == (4, 3, 64, 96)
    for k, rec in enumerate(records):
        expected = torch.tensor([o.box for o in rec.objects]) / torch.tensor([rec.width, rec.height] * 2)
        torch.testing.assert_close(batch["boxes"][k, : len(expected)], expected.float(), atol=1e-6, rtol=0)
    train = build_dataloader(records, spec.class_names, (64, 96), (0.5,) * 3, (0.25,) * 3, train=True, batch_size=4)
    assert next(iter(train))["images"].shape == (4, 3, 64, 96)


def test_jpeg_reduced_decoding_per_axis(tmp_path):
    """A JPEG is decoded at the smallest DCT scale that keeps its height and width at or above the target's."""
    photo = tmp_path / "photo.jpg"
    Image.new("RGB", (1024, 768), (90, 120, 150)).save(photo)
    assert read_image(photo, min_size=(192, 256)).shape == (3, 192, 256)  # 1/4 on both axes
    assert read_image(photo, min_size=256).shape == (3, 384, 512)  # square 256 needs 768 / 2
    # stored 1600 wide x 400 high, EXIF orientation 6: shown 400 wide x 1600 high
    rotated = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.new("RGB", (1600, 400), (10, 20, 30)).save(rotated, exif=exif)
    assert read_image(rotated, min_size=(100, 200)).shape == (3, 800, 200)  # 1/2: the shown width needs 200


# ----------------------------------------------------------------------------------------------------- options
def test_train_config_image_size_forms_and_errors(tmp_path):
    assert TrainConfig(image_size="512x288").image_size == "512x288"
    assert TrainConfig(image_size="300").image_size == 300 and TrainConfig(image_size=[300, 300]).image_size == 300
    assert TrainConfig(image_size=(512, 288)).image_size == "512x288"
    assert TrainConfig().update(image_size="256X128").image_size == "256x128"
    path = tmp_path / "config.yaml"
    TrainConfig(image_size="512x288").to_yaml(path)
    assert "image_size: 512x288" in path.read_text() and TrainConfig.from_yaml(path).image_size == "512x288"
    with pytest.raises(ConfigError, match=r"image_size='512x' is invalid: give N for a square N x N input or HxW "
                                          r"\(height x width, e.g. 512x288\)"):
        TrainConfig(image_size="512x")
    with pytest.raises(ConfigError, match="image_size='512x16' is invalid: must be at least 32 and at most 4096 on "):
        TrainConfig(image_size="512x16")
    with pytest.raises(ConfigError, match="image_size=16 is invalid: must be at least 32 and at most 4096 on each "):
        TrainConfig(image_size=16)


def test_train_option_reads_height_by_width():
    from ssd.cli.parsers import build_parser, parse

    args = parse(build_parser(), ["train", "--image-size", "512x288"])
    assert TrainConfig().update(image_size=args.image_size).image_size == "512x288"


# Not builders.make_dataset (square images): the suggestion is about the share of tall ones.
def _tall_dataset(root: Path, tall: int, square: int) -> Path:
    """YOLO images: ``tall`` of 32x64 (w x h) and ``square`` of 48x48, each with one box square in pixels."""
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    for k in range(tall + square):
        w, h = (32, 64) if k < tall else (48, 48)
        Image.new("RGB", (w, h), (k * 7 % 255, 80, 160)).save(root / "images" / f"{k}.jpg")
        (root / "labels" / f"{k}.txt").write_text(f"0 0.5 0.5 {24 / w} {24 / h}\n")
    (root / "data.yaml").write_text(f"path: {root}\ntrain: images\nnames: [thing]\n")
    return root / "data.yaml"


def test_check_suggests_a_non_square_size_for_tall_images(tmp_path, capsys):
    data = _tall_dataset(tmp_path, tall=8, square=2)
    spec = load_dataset(data)
    suggestion = suggest_image_size(spec, "ssd_tiny")
    # 80% of the images are 0.5:1; 256 x 256 = 65536 px -> sqrt(65536 / 0.5) = 362 -> 352 high, 176 -> 192 wide
    assert suggestion["image_size"] == (352, 192) and suggestion["text"] == "352x192"
    assert suggestion["ratio"] == 0.5 and suggestion["share"] == 0.8
    assert suggestion["coverage"] == prior_coverage(spec, default_priors("ssd_tiny", (352, 192)), (352, 192))
    assert suggestion["current"] == prior_coverage(spec, default_priors("ssd_tiny"), 256)["covered"]
    assert suggestion["coverage"]["covered"] > suggestion["current"]
    assert suggestion["message"] == (
        f"80% of the 10 training images are 0.50:1 (width / height, within 10%), which the 256 input of ssd_tiny "
        f"distorts: --image-size 352x192 (height x width, 1.03x the pixels) gives "
        f"{suggestion['coverage']['covered']:.1%} default-box coverage (now {suggestion['current']:.1%})")
    (issue,) = [i for i in check_dataset(data, model="ssd_tiny").warnings if i.code == "non_square_images"]
    assert issue.message == suggestion["message"]
    assert main(["check", str(data), "--model", "ssd_tiny"]) == 0
    assert "--image-size 352x192 (height x width" in capsys.readouterr().out
    # at the suggested size, nothing more to suggest; a mixed set (50% tall) gets no suggestion either
    assert suggest_image_size(spec, "ssd_tiny", "352x192") is None
    assert suggest_image_size(load_dataset(_tall_dataset(tmp_path / "mixed", tall=5, square=5)), "ssd_tiny") is None


def test_check_image_size_option(tmp_path, capsys):
    data = _tall_dataset(tmp_path, tall=8, square=2)
    assert main(["check", str(data), "--model", "ssd_tiny", "--image-size", "352x192"]) == 0
    out = capsys.readouterr().out
    assert "default-box coverage" in out and "non_square_images" not in out
    assert main(["check", str(data), "--model", "ssd_tiny", "--image-size", "352by192"]) == 2
    assert "argument --image-size: image_size='352by192' is invalid: give N for a square N x N input or HxW " \
           "(height x width, e.g. 512x288)" in capsys.readouterr().err


@pytest.mark.slow
def test_predict_and_onnx_export_at_a_non_square_size(tmp_path):
    """The inference pipeline resizes to (h, w), the ONNX graph takes [B, 3, h, w] and records [h, w]."""
    import json

    import onnx

    from ssd.export.onnx import export_onnx
    from ssd.inference.detector import load
    from ssd.weights.checkpoint import save_checkpoint

    torch.manual_seed(0)
    model = build_model("ssd_tiny", 2, image_size=(96, 128)).eval()
    image = torch.randint(0, 256, (3, 240, 320), dtype=torch.uint8)
    batch, sizes = model.preprocess([image])
    assert batch.shape == (1, 3, 96, 128) and sizes.tolist() == [[240, 320]]
    (found,) = model.predict([image], score_threshold=0.0, max_detections=5)
    assert len(found["boxes"]) == 5 and float(found["boxes"][:, 2].max()) <= 320
    weights = save_checkpoint(tmp_path / "tiny.pt", model)
    onnx_path = export_onnx(weights, tmp_path / "tiny.onnx")  # runs the ONNX Runtime parity check
    meta = {p.key: p.value for p in onnx.load(str(onnx_path)).metadata_props}
    assert json.loads(meta["image_size"]) == [96, 128]
    from_onnx = load(onnx_path).predict([image], score_threshold=0.0, max_detections=5)[0]
    assert torch.allclose(from_onnx.boxes, found["boxes"], atol=1e-3)

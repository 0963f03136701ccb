"""Native-resolution training crops (``ssd train --crop-scale``, :mod:`ssd.data.crops`): the box rule, the crop
sizes, reproducibility, decoding / cache sizes and their memory bound, option errors, and a short training run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torchvision import tv_tensors

from builders import TINY_TRAIN, make_dataset
from ssd.cli import main
from ssd.data.check import check_dataset
from ssd.data.coverage import spec_boxes
from ssd.data.crops import MIN_VISIBLE, CropScale, NativeCrop, crop_rule, decode_sizes, parse_crop_scale
from ssd.data.load import load_dataset
from ssd.data.loader import DetectionDataset, build_dataloader
from ssd.data.transforms import IoUCropWithBoxes, build_transform
from ssd.errors import ConfigError
from ssd.training.config import TrainConfig
from ssd.training.trainer import train

MEAN, STD = [0.5] * 3, [0.25] * 3


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    """16 train / 8 val images of 128 px (not conftest's 64 px): twice a 64 px input, so ``native`` crops range
    over scales [0.5, 1]."""
    return make_dataset("voc", tmp_path_factory.mktemp("shapes"), train=16, val=8, size=128, classes=2)


def _target(boxes, hw, orig_hw=None):
    return {"boxes": tv_tensors.BoundingBoxes(torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4),
                                              format="XYXY", canvas_size=hw),
            "labels": torch.arange(len(boxes), dtype=torch.int64), "difficult": torch.zeros(len(boxes), dtype=bool),
            "orig_size": torch.tensor(orig_hw or hw)}


def test_box_rule_by_hand():
    window = torch.tensor([0, 0, 50, 50])
    boxes = torch.tensor([[20.0, 0, 70, 10],  # 30 of its 50 px width inside: 60 % -> kept
                          [30.0, 0, 80, 10],  # 20 of 50: 40 % -> dropped, cut
                          [25.0, 0, 75, 10],  # 25 of 50: exactly MIN_VISIBLE -> kept
                          [60.0, 60, 70, 70],  # wholly outside: neither kept nor cut
                          [10.0, 10, 20, 20],  # wholly inside
                          [-10.0, -10, 90, 40],  # 40 % of it inside, but that is 80 % of the crop -> kept
                          [-50.0, 20, 150, 40]])  # 25 % of it, 40 % of the crop -> dropped, cut
    keep, cut = crop_rule(boxes, window)
    assert MIN_VISIBLE == 0.5
    assert keep.tolist() == [True, False, True, False, True, True, False]
    assert cut.tolist() == [False, True, False, False, False, False, True]


def test_crop_keeps_clips_drops_and_counts():
    # the image's pixels hold their own coordinates (channel 0: x, channel 1: y), so the output's first pixel tells
    # where the crop was cut; the boxes must have been cut at the same place
    h, w = 100, 200
    ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    image = tv_tensors.Image(torch.stack([xs, ys, xs * 0]).to(torch.uint8))
    crop = NativeCrop(CropScale(0.5, 0.5), input_size=10)
    boxes = [[0.0, 0, 200, 100], [95, 45, 105, 55], [0, 0, 4, 4], [196, 96, 200, 100]]
    for seed in range(20):
        torch.manual_seed(seed)
        out, target = crop(image, _target(boxes, (h, w)))
        left, top = int(out[0, 0, 0]), int(out[1, 0, 0])
        assert out.shape == (3, 50, 100)
        window = torch.tensor([left, top, left + 100, top + 50])
        keep, cut = crop_rule(torch.tensor(boxes), window)
        expected = (torch.tensor(boxes)[keep] - window[:2].repeat(2)).clamp(min=0)
        expected = torch.minimum(expected, torch.tensor([100.0, 50, 100, 50]))
        assert torch.equal(target["boxes"].as_subclass(torch.Tensor), expected)
        assert target["boxes"].canvas_size == (50, 100)
        assert target["labels"].tolist() == torch.arange(4)[keep].tolist()
        assert target["crop_dropped"] == int(cut.sum())
        assert target["labels"][0] == 0  # the whole-image box is 25 % inside, but it fills the crop


def test_box_60_percent_inside_is_kept_clipped_40_dropped_counted():
    image = tv_tensors.Image(torch.zeros(3, 100, 100, dtype=torch.uint8))
    crop = NativeCrop(CropScale(1.0), input_size=10)  # the whole image: the window is [0, 0, 100, 100]
    _, target = crop(image, _target([[70.0, 0, 120, 10], [80.0, 20, 130, 30]], (100, 100)))
    assert target["boxes"].tolist() == [[70.0, 0.0, 100.0, 10.0]]
    assert target["labels"].tolist() == [0] and target["crop_dropped"] == 1


def test_crop_sizes_stay_in_range():
    image = tv_tensors.Image(torch.zeros(3, 768, 1024, dtype=torch.uint8))
    target = _target([[0.0, 0, 10, 10]], (768, 1024))
    for scale, lo in ((CropScale(None), 1 / 3), (CropScale(0.5, 0.75), 0.5)):
        hi = scale.max_scale
        crop = NativeCrop(scale, input_size=256)
        params = []
        for seed in range(300):
            torch.manual_seed(seed)
            p = crop.make_params([image, target["boxes"], target["orig_size"]])
            params.append([p["height"], p["width"], p["top"], p["left"]])
        hwtl = torch.tensor(params, dtype=torch.float64)
        ratio = hwtl[:, :2] / torch.tensor([768.0, 1024.0])
        assert ((ratio >= lo - 1 / 768) & (ratio <= hi + 1 / 768)).all()
        assert (ratio[:, 0] - ratio[:, 1]).abs().max() < 1.5 / 768  # the image's aspect ratio
        assert (hwtl[:, 2:] >= 0).all() and (hwtl[:, :2] + hwtl[:, 2:] <= torch.tensor([768.0, 1024.0])).all()
        assert ratio[:, 0].min() < lo + 0.05 and ratio[:, 0].max() > hi - 0.05  # the range is used, both ends
    # native: the smallest crop holds the input's pixels; a 200x300 image under a 256 input is never cropped
    lo, hi = CropScale(None).bounds(torch.tensor([[768, 1024], [200, 300]]), (256, 256))
    assert torch.allclose(lo, torch.tensor([1 / 3, 1.0], dtype=torch.float64)) and hi.tolist() == [1.0, 1.0]


def test_decode_sizes_and_memory_bound():
    plan = decode_sizes([(768, 1024), (576, 1024)], CropScale(None), 256, max_bytes=None)
    assert plan.sizes.tolist() == [[768, 1024], [576, 1024]]  # native: the smallest crop is 256 px at full size
    assert plan.nbytes == 3 * (768 * 1024 + 576 * 1024) and plan.downscale == 1.0 and plan.too_small == 0
    # MIN 0.5: the smallest crop must hold 256 px: 256 / 0.5 = 512 on the short side, 682.67 -> 683 on the long one
    plan = decode_sizes([(768, 1024)], CropScale(0.5), 256, max_bytes=None)
    assert plan.sizes.tolist() == [[512, 683]]
    # over the bound: one factor for all, sqrt(bound / bytes), floored
    bound = 3 * 512 * 683 // 4
    plan = decode_sizes([(768, 1024)], CropScale(0.5), 256, max_bytes=bound)
    assert plan.downscale == pytest.approx(0.5, abs=1e-3)
    assert plan.sizes.tolist() == [[math.floor(512 * plan.downscale), math.floor(683 * plan.downscale)]]
    assert plan.nbytes <= bound
    # a 200x300 image at a 128 input: MIN 0.5 would be a 100 px crop, so it keeps crops of 128 px (scale 0.64)
    plan = decode_sizes([(200, 300), (768, 1024)], CropScale(0.5), 128, max_bytes=None)
    assert plan.too_small == 1 and plan.sizes.tolist() == [[200, 300], [256, 342]]


def test_cache_holds_the_planned_sizes(shapes):
    records = load_dataset(shapes).records("train")
    crop = parse_crop_scale("0.75")
    data = DetectionDataset(records, ["a", "b"], build_transform(64, MEAN, STD, True, "none", crop), image_size=64,
                            cache_images=True, crop_scale=crop)
    assert data.decode_plan.sizes.tolist() == [[86, 86]] * len(records)  # 64 / 0.75 = 85.3 -> 86
    assert [tuple(im.shape) for im in data._cache.values()] == [(3, 86, 86)] * len(records)
    assert data.decode_plan.nbytes == len(records) * 3 * 86 * 86
    image, target = data[(0, 123)]
    assert image.shape == (3, 64, 64) and "crop_dropped" in target


@pytest.mark.slow
def test_reproducible_with_the_loaders_seeds(shapes):
    records = load_dataset(shapes).records("train")
    crop = parse_crop_scale("native")

    def batches(seed):
        loader = build_dataloader(records, ["a", "b"], 64, MEAN, STD, train=True, batch_size=8, seed=seed,
                                  augment="ssd", crop_scale=crop)
        return list(loader)

    first, again, other = batches(0), batches(0), batches(1)
    for a, b in zip(first, again):
        assert torch.equal(a["images"], b["images"]) and torch.equal(a["boxes"], b["boxes"])
        assert a["crop_dropped"] == b["crop_dropped"]
    assert not torch.equal(first[0]["images"], other[0]["images"])


def test_pipeline_order_replaces_zoom_out_and_iou_crop():
    names = [type(t).__name__ for t in build_transform(64, MEAN, STD, True, "ssd", CropScale(None)).transforms]
    assert names[:4] == ["NativeCrop", "Resize", "RandomPhotometricDistort", "RandomHorizontalFlip"]
    plain = build_transform(64, MEAN, STD, True, "ssd").transforms
    assert any(isinstance(t, IoUCropWithBoxes) for t in plain)
    # evaluation never crops
    assert "NativeCrop" not in [type(t).__name__ for t in build_transform(64, MEAN, STD, False, "ssd",
                                                                          CropScale(None)).transforms]


@pytest.mark.parametrize(("value", "message"), [
    ("0", "crop_scale='0' is invalid: crop scales are fractions of the image side in (0, 1] (1 is the whole image) "
          "(--crop-scale)"),
    (1.5, "crop_scale=1.5 is invalid: crop scales are fractions of the image side in (0, 1] (1 is the whole image) "
          "(--crop-scale)"),
    ([0.5, 10**400], "crop_scale=[0.5, 100000000000000000...0000000000000000000] is invalid: crop scales are "
                     "fractions of the image side in (0, 1] (1 is the whole image) (--crop-scale)"),
    ("0.8,0.2", "crop_scale='0.8,0.2' is invalid: MIN 0.8 is larger than MAX 0.2 (--crop-scale MIN,MAX)"),
    ("nativ", "crop_scale='nativ' is invalid: give native, MIN or MIN,MAX (fractions of the image side, e.g. 0.25 "
              "or 0.25,1) (--crop-scale)"),
])
def test_option_errors(value, message):
    with pytest.raises(ConfigError) as info:
        TrainConfig(crop_scale=value)
    assert str(info.value) == message


def test_option_forms():
    assert [TrainConfig(crop_scale=v).crop_scale for v in ("native", " Native ", 0.25, "0.25,1", "0.25, 0.8",
                                                           [0.3, 0.9])] == [
        "native", "native", "0.25", "0.25", "0.25,0.8", "0.3,0.9"]
    assert TrainConfig().crop_scale is None
    assert parse_crop_scale("0.25,0.8") == CropScale(0.25, 0.8)


def test_cli_refuses_a_bad_crop_scale(capsys):
    assert main(["train", "--data", "nowhere", "--crop-scale", "2"]) == 2  # a usage error, before any data is read
    assert "crop_scale='2' is invalid" in capsys.readouterr().err


@pytest.mark.slow
def test_train_with_crops(shapes, tmp_path, ssd_messages):
    result = train(data=str(shapes), epochs=1, crop_scale="native", cache_images=True, project=str(tmp_path),
                   name="crops", **{**TINY_TRAIN, "augment": "ssd"})
    out = "\n".join(ssd_messages())
    assert "crops native at 64: 16 training images decoded (largest 128), cache 0.8 MB" in out
    dropped = result.history[0]["crop_dropped"]
    assert (f"epoch 1: the crops cut and dropped {dropped} object(s) with less than 50% of their box (or of the crop) "
            "inside") in out
    assert math.isfinite(result.history[0]["train/loss"])
    assert TrainConfig.from_yaml(result.run_dir / "config.yaml").crop_scale == "native"


def test_coverage_at_the_crop_scale(shapes):
    spec = load_dataset(shapes)
    plain = spec_boxes(spec)
    # 128 px images, a 64 px input, crops of half the side: every image's median scale is 0.5, sizes double
    scaled = spec_boxes(spec, crop_scale=CropScale(0.5, 0.5), image_size=64)
    centre, size = (plain[:, :2] + plain[:, 2:]) / 2, plain[:, 2:] - plain[:, :2]
    assert torch.allclose(scaled, torch.cat([centre - size, centre + size], dim=1).clamp(0, 1))
    # native at a 64 px input: scales in [0.5, 1], median 0.75
    native = spec_boxes(spec, crop_scale=CropScale(None), image_size=64)
    assert torch.allclose(native, torch.cat([centre - size / 1.5, centre + size / 1.5], dim=1).clamp(0, 1))
    report = check_dataset(spec, model="ssd_tiny", image_size=64, crop_scale=CropScale(None))
    assert report.coverage["crop_scale"] == "native" and report.coverage["boxes"] == len(plain)
    assert "boxes at the median crop scale of --crop-scale native" in report.format_table()

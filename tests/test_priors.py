"""Default boxes: counts, order and values against the formula of the original SSD."""

import math

import pytest
import torch

from ssd.errors import PriorConfigError
from ssd.priors import PRIOR_CONFIGS, PriorConfig, default_boxes


def formula(config, size, k, i, j):
    """The boxes at feature map k, row i, column j, written out from the paper's definition (unclipped)."""
    step = config.steps[k]
    s = config.min_sizes[k] / size
    s2 = math.sqrt(s * config.max_sizes[k] / size)
    cx, cy = (j + 0.5) * step / size, (i + 0.5) * step / size
    boxes = [(cx, cy, s, s), (cx, cy, s2, s2)]
    for r in config.aspect_ratios[k]:
        boxes += [(cx, cy, s * math.sqrt(r), s / math.sqrt(r)), (cx, cy, s / math.sqrt(r), s * math.sqrt(r))]
    return torch.tensor(boxes, dtype=torch.float64).clamp(0, 1).float()


@pytest.mark.parametrize(("name", "size", "count"), [("ssd300", 300, 8732), ("ssd512", 512, 24564)])
def test_counts_first_and_last_boxes(name, size, count):
    config = PRIOR_CONFIGS[name]
    priors = config.boxes(size)
    assert priors.shape == (count, 4) and priors.dtype == torch.float32 and config.count() == count
    first = formula(config, size, 0, 0, 0)
    torch.testing.assert_close(priors[: len(first)], first)
    # second cell of the first map: same sizes, next column
    torch.testing.assert_close(priors[len(first) : 2 * len(first)], formula(config, size, 0, 0, 1))
    last_map = len(config.feature_maps) - 1
    f = config.feature_maps[last_map]
    last = formula(config, size, last_map, f - 1, f - 1)
    torch.testing.assert_close(priors[-len(last) :], last)
    assert bool(((priors >= 0) & (priors <= 1)).all())


def test_ssd300_values_by_hand():
    priors = PRIOR_CONFIGS["ssd300"].boxes(300)
    c = 0.5 * 8 / 300
    expected = torch.tensor(
        [
            [c, c, 0.1, 0.1],
            [c, c, math.sqrt(0.1 * 0.2), math.sqrt(0.1 * 0.2)],
            [c, c, 0.1 * math.sqrt(2), 0.1 / math.sqrt(2)],
            [c, c, 0.1 / math.sqrt(2), 0.1 * math.sqrt(2)],
        ]
    )
    torch.testing.assert_close(priors[:4], expected)
    # the single 1x1 map cell at the end: centre 0.5, sizes 264/300 and sqrt(264*315)/300 (the latter clipped to 1)
    torch.testing.assert_close(priors[-4:, :2], torch.full((4, 2), 0.5))
    torch.testing.assert_close(priors[-4, 2:], torch.tensor([0.88, 0.88]))
    torch.testing.assert_close(priors[-3, 2:], torch.tensor([math.sqrt(0.88 * 1.05)] * 2).clamp(max=1))


def test_clip_clamps_each_coordinate_not_corners():
    config = PRIOR_CONFIGS["ssd300"].to_dict()
    clipped, raw = default_boxes(300, **config), default_boxes(300, **{**config, "clip": False})
    changed = (clipped != raw).any(dim=1)
    assert int(changed.sum()) == 134
    torch.testing.assert_close(clipped, raw.clamp(0, 1))
    assert float(raw.max()) > 1.0


def test_small_custom_layout_order():
    priors = default_boxes(4, feature_maps=[2], steps=[2], min_sizes=[2], max_sizes=[4], aspect_ratios=[[]])
    # per cell (row-major): the (0.5, 0.5) square then the sqrt(0.5*1) square
    s2 = math.sqrt(0.5)
    expected = torch.tensor(
        [
            [0.25, 0.25, 0.5, 0.5], [0.25, 0.25, s2, s2],
            [0.75, 0.25, 0.5, 0.5], [0.75, 0.25, s2, s2],
            [0.25, 0.75, 0.5, 0.5], [0.25, 0.75, s2, s2],
            [0.75, 0.75, 0.5, 0.5], [0.75, 0.75, s2, s2],
        ]
    )  # fmt: skip
    torch.testing.assert_close(priors, expected)


def test_mismatched_lengths_are_an_error():
    with pytest.raises(ValueError, match="same length"):
        default_boxes(300, [38, 19], [8], [30, 60], [60, 111], [[2], [2]])


# ------------------------------------------------------------------------------------------------- validation
ONE_LEVEL = {"feature_maps": [2], "steps": [50], "min_sizes": [20], "max_sizes": [40], "aspect_ratios": [[2]]}
"""One level of 2 x 2 cells on a 100 px input: 20 and 28.3 px squares and the 2:1 / 1:2 boxes of 20 px."""


@pytest.mark.parametrize(("change", "message"), [
    ({"aspect_ratios": [[2, 0]]}, r"aspect_ratios[0] = [2, 0]: a level's aspect ratios are a list; they must be "
                                  r"finite numbers > 0 (each gives an r:1 and a 1:r box)"),
    ({"aspect_ratios": [[-3]]}, r"aspect_ratios[0] = [-3]: "),
    ({"aspect_ratios": [[float("nan")]]}, r"aspect_ratios[0] = [nan]: "),
    ({"aspect_ratios": [2]}, r"aspect_ratios[0] = 2: a level's aspect ratios are a list"),
    ({"min_sizes": [0]}, r"min_sizes[0] = 0: box sizes must be finite numbers > 0 (pixels of the input)"),
    ({"max_sizes": [float("inf")]}, r"max_sizes[0] = inf: box sizes must be finite numbers > 0"),
    ({"min_sizes": [True]}, r"min_sizes[0] = True: box sizes must be finite numbers > 0"),
    ({"steps": [(50, -8)]}, r"steps[0] = [50, -8]: must be finite numbers > 0"),
    ({"feature_maps": [0]}, r"feature_maps[0] = 0: cell counts must be ints from 1 to 4096 "
                            r"(ssd.limits.MAX_INPUT_SIDE)"),
    ({"feature_maps": [2.5]}, r"feature_maps[0] = 2.5: cell counts must be ints"),
    ({"feature_maps": [(2, 5000)]}, r"feature_maps[0] = [2, 5000]: cell counts must be ints from 1 to 4096"),
    ({"feature_maps": [1000, 1000], "steps": [1, 1], "min_sizes": [1, 2], "max_sizes": [2, 3],
      "aspect_ratios": [[], []]}, r"these default boxes number 4,000,000 (feature maps [1000, 1000]), more than "
                                  r"the 1,000,000 of ssd.limits.MAX_PRIORS"),
    ({"steps": [50, 100]}, "feature_maps, steps, min_sizes, max_sizes and aspect_ratios must have the same length "
                           "(one entry per feature map, at least one), got 1, 2, 1, 1, 1"),
    ({"clip": "yes"}, r"clip must be True, False or 'size', got 'yes'"),
])
def test_bad_prior_values_are_refused_naming_the_value_and_the_rule(change, message):
    with pytest.raises(PriorConfigError) as caught:
        PriorConfig(**{**ONE_LEVEL, **change})
    assert str(caught.value).startswith(message) and isinstance(caught.value, ValueError)


def test_a_prior_dict_with_unknown_or_missing_keys_is_refused():
    with pytest.raises(PriorConfigError, match=r"has the keys feature_maps, steps, min_sizes, max_sizes, "
                                               r"aspect_ratios, clip \(clip optional\); unknown: image_size; "
                                               r"missing: steps"):
        PriorConfig.from_dict({**{k: v for k, v in ONE_LEVEL.items() if k != "steps"}, "image_size": 100})
    with pytest.raises(PriorConfigError, match="a prior configuration is a mapping of .*, got list"):
        PriorConfig.from_dict([1, 2])


def test_an_input_side_above_the_limit_is_refused_before_any_box_is_made():
    config = PriorConfig(**ONE_LEVEL)
    for size in (4097, (100, 100_000), "100000x100"):
        with pytest.raises(PriorConfigError, match=r"image_size .* exceeds the largest input side of 4096 px "
                                                   r"\(ssd.limits.MAX_INPUT_SIDE\)"):
            config.boxes(size)
    assert config.boxes(4096).shape == (16, 4)


def test_scaled_to_keeps_pixel_sizes_for_the_same_pixel_count_and_spreads_the_centres():
    config = PriorConfig(**ONE_LEVEL)
    assert config.scaled_to(100, 100, [2]) is config
    double = config.scaled_to(100, 200, [4])  # twice the side: twice the sizes, the network's maps
    assert double == PriorConfig(feature_maps=[4], steps=[50], min_sizes=[40], max_sizes=[80], aspect_ratios=[[2]])
    wide = config.scaled_to(100, (50, 200), [(1, 4)])  # the same 10,000 pixels: the same sizes in pixels
    assert wide == PriorConfig(feature_maps=[(1, 4)], steps=[50], min_sizes=[20], max_sizes=[40],
                               aspect_ratios=[[2]])
    assert config.scaled_to(100, 200, [4], steps=[(40, 60)]).steps == ((40, 60),)
    with pytest.raises(PriorConfigError, match="image_size 5000 exceeds"):
        config.scaled_to(100, 5000, [4])


# ---------------------------------------------------------------------------------------- models, checkpoints
def test_a_model_at_an_absurd_input_size_is_refused_before_building(synthetic_voc, capsys):
    from ssd.cli import main
    from ssd.errors import ConfigError
    from ssd.models import build_model
    from ssd.training.config import TrainConfig

    with pytest.raises(PriorConfigError, match=r"image_size 100000 exceeds the largest input side of 4096 px"):
        build_model("ssd_tiny", 1, image_size=100_000)
    assert main(["check", str(synthetic_voc), "--model", "ssd_tiny", "--image-size", "100000"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ("error: ssd check: argument --image-size: image_size='100000' is "
                                                   "invalid: must be at least 32 and at most 4096 on each side "
                                                   "(--image-size; the bound is ssd.limits.MAX_INPUT_SIDE)\n")
    with pytest.raises(ConfigError, match=r"image_size='300x5000' is invalid: must be at least 32 and at most 4096"):
        TrainConfig(image_size="300x5000")


def test_a_checkpoint_edited_to_aspect_ratio_zero_or_a_huge_input_is_refused(tmp_path):
    from ssd.errors import CheckpointError
    from ssd.models import build_model
    from ssd.models.load import model_from_checkpoint
    from ssd.weights.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path / "tiny.pt", build_model("ssd_tiny", 1))
    edited = load_checkpoint(path)
    edited["config"]["priors"]["aspect_ratios"][2] = [0]
    with pytest.raises(CheckpointError, match=r"malformed model configuration \(aspect_ratios\[2\] = \[0\]: "):
        model_from_checkpoint(edited)
    edited = load_checkpoint(path)
    edited["config"]["image_size"] = 100_000
    with pytest.raises(CheckpointError, match=r"malformed model configuration \(image_size 100000 exceeds the "
                                              r"largest input side of 4096 px"):
        model_from_checkpoint(edited)


def test_weights_whose_default_boxes_differ_from_their_configuration_are_refused(tmp_path):
    from ssd.errors import CheckpointError
    from ssd.models import build_model
    from ssd.models.load import model_from_checkpoint
    from ssd.weights.checkpoint import load_checkpoint, save_checkpoint

    path = save_checkpoint(tmp_path / "tiny.pt", build_model("ssd_tiny", 1))
    edited = load_checkpoint(path)
    edited["model"]["priors"][7, 2] += 0.25  # one box of the buffer, not the configuration
    with pytest.raises(CheckpointError, match=r"the default boxes stored with these weights differ from those of "
                                              r"their configuration \(by up to 0.25; ssd_tiny at image_size 256\)"):
        model_from_checkpoint(edited)
    model = model_from_checkpoint(path)
    assert torch.equal(model.priors, model.config.priors.boxes(256))
    model.half().load_state_dict(load_checkpoint(path)["model"])  # float32 boxes into a half model: the same boxes

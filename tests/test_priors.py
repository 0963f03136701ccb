"""Default boxes: counts, order and values against the formula of the original SSD."""

import math

import pytest
import torch

from ssd.priors import PRIOR_CONFIGS, default_boxes


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

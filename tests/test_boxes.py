"""Box conversions, batched IoU and the offset encoding: hand-computed cases and round-trip properties."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torchvision.ops import box_iou

from ssd.boxes import box_iou_batched, cxcywh_to_xyxy, decode, encode, pixel_scale, xyxy_to_cxcywh


def test_conversions_by_hand():
    xyxy = torch.tensor([[0.1, 0.2, 0.5, 0.8]])
    cxcywh = torch.tensor([[0.3, 0.5, 0.4, 0.6]])
    torch.testing.assert_close(xyxy_to_cxcywh(xyxy), cxcywh)
    torch.testing.assert_close(cxcywh_to_xyxy(cxcywh), xyxy)


def test_box_iou_batched_by_hand():
    priors = torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75], [0.6, 0.6, 1.0, 1.0]])
    gt = torch.tensor(
        [
            [[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.25, 0.25]],
            [[0.5, 0.5, 1.0, 1.0], [0.0, 0.0, 1.0, 1.0]],
        ]
    )
    expected = torch.tensor(
        [
            [[1.0, 1 / 7, 0.0], [0.25, 0.0, 0.0]],  # overlap 1/16 over union 7/16; a quarter of the prior
            [[0.0, 1 / 7, 0.64], [0.25, 0.25, 0.16]],
        ]
    )
    torch.testing.assert_close(box_iou_batched(gt, priors), expected)


def test_box_iou_batched_matches_torchvision_per_image():
    g = torch.Generator().manual_seed(0)
    a = cxcywh_to_xyxy(torch.rand(3, 5, 4, generator=g) * 0.5 + 0.1)
    b = cxcywh_to_xyxy(torch.rand(7, 4, generator=g) * 0.5 + 0.1)
    out = box_iou_batched(a, b)
    assert out.shape == (3, 5, 7)
    for i in range(3):
        assert torch.equal(out[i], box_iou(a[i], b))


def test_encode_by_hand():
    priors = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    matched = torch.tensor([[0.45, 0.3, 0.65, 0.5]])  # cx 0.55, cy 0.4, w 0.2, h 0.2
    expected = torch.tensor([[0.05 / (0.1 * 0.2), -0.1 / (0.1 * 0.4), 0.0, math.log(0.5) / 0.2]])
    torch.testing.assert_close(encode(matched, priors), expected)
    torch.testing.assert_close(decode(expected, priors), matched)


def test_encode_accepts_centre_form():
    priors = torch.tensor([[0.5, 0.5, 0.2, 0.4]])
    matched = torch.tensor([[0.45, 0.3, 0.65, 0.5]])
    torch.testing.assert_close(
        encode(xyxy_to_cxcywh(matched), priors, box_format="cxcywh"), encode(matched, priors), rtol=0, atol=0
    )
    with pytest.raises(ValueError, match='box_format must be "xyxy" or "cxcywh"'):
        encode(matched, priors, box_format="xywh")


def test_encode_custom_variances_and_batch_dims():
    priors = torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.2, 0.2, 0.1, 0.1]])
    matched = torch.tensor([[0.45, 0.3, 0.65, 0.5], [0.1, 0.1, 0.3, 0.3]]).expand(3, 2, 4)
    out = encode(matched, priors, variances=(1.0, 1.0))
    assert out.shape == (3, 2, 4)
    torch.testing.assert_close(out[:, 1], torch.tensor([0.0, 0.0, math.log(2.0), math.log(2.0)]).expand(3, 4))


def test_zero_offsets_decode_to_the_priors():
    priors = torch.tensor([[0.5, 0.5, 0.2, 0.4], [0.1, 0.9, 0.2, 0.2]])
    torch.testing.assert_close(decode(torch.zeros(2, 2, 4), priors), cxcywh_to_xyxy(priors).expand(2, 2, 4))


unit = st.floats(0.05, 0.95, allow_nan=False)
size = st.floats(0.01, 1.0, allow_nan=False)
cxcywh_box = st.tuples(unit, unit, size, size)


@settings(max_examples=100, deadline=None)
@given(gt=st.lists(cxcywh_box, min_size=1, max_size=8), pr=st.lists(cxcywh_box, min_size=1, max_size=8))
def test_encode_decode_round_trip(gt, pr):
    n = min(len(gt), len(pr))
    matched = cxcywh_to_xyxy(torch.tensor(gt[:n]))
    priors = torch.tensor(pr[:n])
    torch.testing.assert_close(decode(encode(matched, priors), priors), matched, atol=2e-6, rtol=1e-5)


@settings(max_examples=100, deadline=None)
@given(
    offsets=st.lists(st.tuples(*[st.floats(-4, 4, allow_nan=False)] * 4), min_size=1, max_size=8),
    pr=st.lists(cxcywh_box, min_size=8, max_size=8),
)
def test_decode_encode_round_trip(offsets, pr):
    off = torch.tensor(offsets)
    priors = torch.tensor(pr[: len(offsets)])
    torch.testing.assert_close(encode(decode(off, priors), priors), off, atol=1e-3, rtol=1e-4)


@settings(max_examples=100, deadline=None)
@given(boxes=st.lists(cxcywh_box, min_size=1, max_size=16))
def test_conversion_round_trip(boxes):
    b = torch.tensor(boxes)
    xyxy = cxcywh_to_xyxy(b)
    assert bool((xyxy[:, 2] >= xyxy[:, 0]).all() and (xyxy[:, 3] >= xyxy[:, 1]).all())
    torch.testing.assert_close(xyxy_to_cxcywh(xyxy), b, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(cxcywh_to_xyxy(xyxy_to_cxcywh(xyxy)), xyxy, atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_encode_decode_cuda():
    priors = torch.tensor([[0.5, 0.5, 0.2, 0.4]], device="cuda")
    matched = torch.tensor([[0.45, 0.3, 0.65, 0.5]], device="cuda")
    torch.testing.assert_close(decode(encode(matched, priors), priors), matched)


def test_pixel_scale_takes_normalized_boxes_to_pixels():
    sizes = torch.tensor([[480, 640], [100, 50]])  # (h, w)
    scale = pixel_scale(sizes)
    assert scale.dtype == torch.float32
    assert scale.tolist() == [[640.0, 480.0, 640.0, 480.0], [50.0, 100.0, 50.0, 100.0]]
    boxes = torch.tensor([[0.25, 0.5, 0.5, 1.0]])
    assert (boxes * scale[0]).tolist() == [[160.0, 240.0, 320.0, 480.0]]

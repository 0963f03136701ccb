"""match: hand-computed assignments, the forced-match tie rule, padding and empty images."""

import pytest
import torch

from ssd.boxes import encode, xyxy_to_cxcywh
from ssd.matching import match

# Four 0.5 x 0.5 quadrants then four 0.25 x 0.25 boxes at the same centres, as xyxy.
QUADRANTS = [[0.0, 0.0, 0.5, 0.5], [0.5, 0.0, 1.0, 0.5], [0.0, 0.5, 0.5, 1.0], [0.5, 0.5, 1.0, 1.0]]
SMALL = [[0.125, 0.125, 0.375, 0.375], [0.625, 0.125, 0.875, 0.375], [0.125, 0.625, 0.375, 0.875],
         [0.625, 0.625, 0.875, 0.875]]  # fmt: skip
PRIORS = xyxy_to_cxcywh(torch.tensor(QUADRANTS + SMALL))


def run(boxes, labels, **kwargs):
    return match(torch.tensor(boxes), torch.tensor(labels), PRIORS, **kwargs)


def test_exact_matches_and_threshold():
    # gt 0 is quadrant 0 (IoU 1; IoU 0.25 with small box 4); gt 1 covers quadrant 3 and 60% of it (IoU 0.6 / 0.25)
    loc_t, cls_t = run([[[0.0, 0.0, 0.5, 0.5], [0.5, 0.5, 1.0, 0.8]]], [[4, 1]])
    assert cls_t.tolist() == [[5, 0, 0, 2, 0, 0, 0, 0]]
    assert cls_t.dtype == torch.int64
    torch.testing.assert_close(loc_t[0, 0], torch.zeros(4))
    expected = encode(torch.tensor([[0.5, 0.5, 1.0, 0.8]]), PRIORS[3:4])
    torch.testing.assert_close(loc_t[0, 3:4], expected)
    assert bool((loc_t[0, [1, 2, 4, 5, 6, 7]] == 0).all())  # background targets are zero


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_forced_match_tie_goes_to_higher_index(order):
    # IoU with quadrant 0: 0.81 and 0.7; with small box 4: 0.31 and 0.36 -> quadrant 0 is the best prior of both
    boxes = [[[0.0, 0.0, 0.45, 0.45], [0.0, 0.0, 0.5, 0.35]][i] for i in order]
    _, cls_t = run([boxes], [[0, 1]])
    # whichever has the higher IoU, the gt with index 1 (label 1) takes quadrant 0; the other gt gets no prior
    assert cls_t.tolist() == [[2, 0, 0, 0, 0, 0, 0, 0]]


def test_tiny_box_smaller_than_every_prior_is_forced_to_its_best_prior():
    tiny = [0.7, 0.2, 0.71, 0.21]  # inside quadrant 1 and small box 5; IoU 1e-4/0.0625 with the small box
    loc_t, cls_t = run([[tiny]], [[2]])
    assert cls_t.tolist() == [[0, 0, 0, 0, 0, 3, 0, 0]]
    torch.testing.assert_close(loc_t[0, 5:6], encode(torch.tensor([tiny]), PRIORS[5:6]))
    assert bool(torch.isfinite(loc_t).all())


def test_threshold_is_inclusive_and_forced_match_ignores_it():
    priors = xyxy_to_cxcywh(torch.tensor([[0.0, 0.0, 0.5, 0.5], [0.0, 0.0, 0.5, 1.0], [0.5, 0.5, 1.0, 1.0]]))
    gt, label = torch.tensor([[[0.0, 0.0, 0.5, 0.5]]]), torch.tensor([[0]])
    # IoU 1 with prior 0 (its best), exactly 0.5 with prior 1, 0 with prior 2
    assert match(gt, label, priors, iou_threshold=0.5)[1].tolist() == [[1, 1, 0]]
    assert match(gt, label, priors, iou_threshold=0.51)[1].tolist() == [[1, 0, 0]]
    # a threshold above every IoU keeps the forced best prior only
    assert match(gt, label, priors, iou_threshold=1.5)[1].tolist() == [[1, 0, 0]]


def test_padding_never_matches_and_empty_images():
    boxes = torch.tensor(
        [
            [QUADRANTS[0], QUADRANTS[1]],  # one real object, one padding row that would be a perfect match
            [QUADRANTS[2], [0.0, 0.0, 0.0, 0.0]],  # only padding (degenerate padding box)
        ]
    )
    labels = torch.tensor([[3, -1], [-1, -1]])
    loc_t, cls_t = match(boxes, labels, PRIORS)
    assert cls_t.tolist() == [[4, 0, 0, 0, 0, 0, 0, 0], [0] * 8]
    assert bool((loc_t[1] == 0).all()) and bool(torch.isfinite(loc_t).all())


def test_all_padding_and_zero_width_batches():
    loc_t, cls_t = match(torch.zeros(3, 2, 4), torch.full((3, 2), -1), PRIORS)
    assert loc_t.shape == (3, 8, 4) and cls_t.shape == (3, 8)
    assert not cls_t.any() and not loc_t.any()
    loc_t, cls_t = match(torch.zeros(2, 0, 4), torch.zeros(2, 0, dtype=torch.long), PRIORS)
    assert loc_t.shape == (2, 8, 4) and cls_t.shape == (2, 8) and cls_t.dtype == torch.int64


def test_batch_equals_per_image():
    g = torch.Generator().manual_seed(1)
    centres = torch.rand(4, 5, 2, generator=g) * 0.6 + 0.2
    sizes = torch.rand(4, 5, 2, generator=g) * 0.3 + 0.05
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), dim=-1)
    labels = torch.randint(0, 3, (4, 5), generator=g)
    labels[1, 3:] = -1
    labels[2] = -1
    loc_t, cls_t = match(boxes, labels, PRIORS)
    for i in range(4):
        real = labels[i] >= 0
        loc_i, cls_i = match(boxes[i : i + 1, real], labels[i : i + 1, real], PRIORS)
        assert torch.equal(cls_i[0], cls_t[i])
        torch.testing.assert_close(loc_i[0], loc_t[i])


def test_match_validates_boxes():
    with pytest.raises(ValueError, match="in image 0, object 0 .* is not finite"):
        run([[[0.1, float("nan"), 0.2, 0.3]]], [[0]])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_match_cuda_equals_cpu():
    boxes, labels = torch.tensor([[QUADRANTS[0], SMALL[1]]]), torch.tensor([[1, 2]])
    loc_c, cls_c = match(boxes, labels, PRIORS)
    loc_g, cls_g = match(boxes.cuda(), labels.cuda(), PRIORS.cuda())
    assert torch.equal(cls_g.cpu(), cls_c)
    torch.testing.assert_close(loc_g.cpu(), loc_c)

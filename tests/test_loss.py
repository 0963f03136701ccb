"""MultiBoxLoss: a hand-computed 2-image, 3-class example (value and gradient), label safety, edge cases."""

import math

import pytest
import torch

from ssd.boxes import xyxy_to_cxcywh
from ssd.loss import MultiBoxLoss

QUADRANTS = [[0.0, 0.0, 0.5, 0.5], [0.5, 0.0, 1.0, 0.5], [0.0, 0.5, 0.5, 1.0], [0.5, 0.5, 1.0, 1.0]]
SMALL = [[0.125, 0.125, 0.375, 0.375], [0.625, 0.125, 0.875, 0.375], [0.125, 0.625, 0.375, 0.875],
         [0.625, 0.625, 0.875, 0.875]]  # fmt: skip
PRIORS = xyxy_to_cxcywh(torch.tensor(QUADRANTS + SMALL))  # 8 priors


def example():
    """Image 0: one object (label 2) exactly on prior 0. Image 1: labels 0 and 1 exactly on priors 3 and 5."""
    boxes = torch.tensor([[QUADRANTS[0], [0.0] * 4], [QUADRANTS[3], SMALL[1]]])
    labels = torch.tensor([[2, -1], [0, 1]])
    loc = torch.full((2, 8, 4), 5.0)  # ignored except at the positives
    loc[0, 0] = torch.tensor([0.5, -2.0, 0.0, 0.1])
    loc[1, 3] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    loc[1, 5] = torch.tensor([0.0, 0.0, 0.0, -0.2])
    logits = torch.zeros(2, 8, 4)  # K = 3
    # image 0: distinct background logits rank the negatives: lowest background logit = highest loss
    logits[0, 1:, 0] = torch.tensor([-1.0, 0.0, 1.0, 2.0, -2.0, 3.0, 0.5])
    return loc.requires_grad_(), logits.requires_grad_(), boxes, labels


def test_hand_computed_value_and_gradient():
    loc, logits, boxes, labels = example()
    loc_loss, cls_loss = MultiBoxLoss()(loc, logits, PRIORS, boxes, labels)
    # 3 positives (targets are exactly 0: each object equals its prior); smooth L1 per coordinate
    expected_loc = (0.125 + 1.5 + 0.0 + 0.005) + 0.5 + 0.02
    assert loc_loss.item() == pytest.approx(expected_loc / 3, rel=1e-6)

    def bg_ce(b):  # cross-entropy for background of the row [b, 0, 0, 0]
        return math.log(math.exp(b) + 3) - b

    # image 0: positive prior 0 (all-zero logits) + 3 hardest negatives: priors 5 (b=-2), 1 (b=-1), 2 (b=0)
    # image 1: 2 positives, 6 negatives wanted, 6 available: every prior, all-zero logits
    expected_cls = math.log(4) + bg_ce(-2) + bg_ce(-1) + bg_ce(0) + 8 * math.log(4)
    assert cls_loss.item() == pytest.approx(expected_cls / 3, rel=1e-6)

    (loc_loss + cls_loss).backward()
    grad_loc = torch.zeros(2, 8, 4)
    grad_loc[0, 0] = torch.tensor([0.5, -1.0, 0.0, 0.1]) / 3  # d smoothL1 = clamp(x, -1, 1)
    grad_loc[1, 3] = torch.tensor([1.0, 0.0, 0.0, 0.0]) / 3
    grad_loc[1, 5] = torch.tensor([0.0, 0.0, 0.0, -0.2]) / 3
    torch.testing.assert_close(loc.grad, grad_loc)

    with torch.no_grad():  # d CE = softmax - one_hot, on the chosen priors only
        chosen = torch.zeros(2, 8, dtype=torch.bool)
        chosen[0, [0, 1, 2, 5]] = True
        chosen[1] = True
        target = torch.zeros(2, 8, dtype=torch.long)
        target[0, 0], target[1, 3], target[1, 5] = 3, 1, 2
        grad = torch.softmax(logits, -1) - torch.nn.functional.one_hot(target, 4)
        grad_logits = torch.where(chosen.unsqueeze(-1), grad, 0.0) / 3
    torch.testing.assert_close(logits.grad, grad_logits)


def test_negatives_capped_at_non_positives():
    loc, logits, boxes, labels = example()
    # neg_pos_ratio 10 wants 10 negatives in image 0 but only 7 priors are not positive
    _, cls_loss = MultiBoxLoss(neg_pos_ratio=10)(loc, logits, PRIORS, boxes, labels)
    bg = torch.logsumexp(logits[0, 1:], -1) - logits[0, 1:, 0]
    expected = (math.log(4) + bg.sum().item() + 8 * math.log(4)) / 3
    assert cls_loss.item() == pytest.approx(expected, rel=1e-6)


def test_batch_without_objects_is_finite_negatives_only():
    # No object anywhere: 0 localization; each image contributes its neg_pos_ratio (3) hardest negatives, counted
    # as if it had one positive, and the sum is divided by max(num_pos, 1) = 1.
    loc = torch.randn(2, 8, 4, requires_grad=True)
    logits = torch.zeros(2, 8, 4)
    logits[:, :, 0] = torch.tensor([0.0, -1.0, 0.0, 0.0, -2.0, 0.0, -3.0, 0.0])  # hardest: priors 6, 4, 1
    logits.requires_grad_()
    for boxes, labels in [(torch.zeros(2, 3, 4), torch.full((2, 3), -1)),
                          (torch.zeros(2, 0, 4), torch.zeros(2, 0, dtype=torch.long))]:
        loc_loss, cls_loss = MultiBoxLoss()(loc, logits, PRIORS, boxes, labels)
        # background CE of a prior with background logit b and three zero logits: log(e^b + 3) - b
        expected = 2 * sum(math.log(math.exp(b) + 3) - b for b in (-3.0, -2.0, -1.0))
        assert loc_loss.item() == 0.0
        assert cls_loss.item() == pytest.approx(expected, rel=1e-6)
    (loc_loss + cls_loss).backward()
    assert not loc.grad.any()
    assert logits.grad[:, [1, 4, 6]].abs().sum() > 0 and not logits.grad[:, [0, 2, 3, 5, 7]].any()


def test_batch_equals_sum_of_images():
    loc, logits, boxes, labels = example()
    fn = MultiBoxLoss()
    total = fn(loc, logits, PRIORS, boxes, labels)
    parts = [fn(loc[i : i + 1], logits[i : i + 1], PRIORS, boxes[i : i + 1], labels[i : i + 1]) for i in range(2)]
    weights = (1, 2)  # positives per image: per-image losses are divided by their own count
    for k in range(2):
        combined = sum(w * p[k] for w, p in zip(weights, parts)) / 3
        torch.testing.assert_close(total[k], combined)


def test_six_classes_train_with_seven_logits():
    torch.manual_seed(0)
    boxes = torch.tensor([[QUADRANTS[0], QUADRANTS[3], SMALL[1]], [QUADRANTS[1], SMALL[2], [0.0] * 4]])
    labels = torch.tensor([[0, 5, 3], [4, 1, -1]])
    loc = torch.zeros(2, 8, 4, requires_grad=True)
    logits = torch.zeros(2, 8, 7, requires_grad=True)
    fn = MultiBoxLoss()
    optimizer = torch.optim.SGD([loc, logits], lr=1.0)
    losses = []
    for _ in range(20):
        loc_loss, cls_loss = fn(loc, logits, PRIORS, boxes, labels)
        losses.append((loc_loss + cls_loss).item())
        optimizer.zero_grad()
        (loc_loss + cls_loss).backward()
        optimizer.step()
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.5 * losses[0]
    predicted = logits.argmax(-1)
    assert predicted[0, 0].item() == 1 and predicted[0, 3].item() == 6 and predicted[1, 6].item() == 2


def test_label_equal_to_k_is_a_clear_error():
    boxes = torch.tensor([[QUADRANTS[0], QUADRANTS[3], SMALL[1]], [QUADRANTS[1], SMALL[2], SMALL[3]]])
    labels = torch.tensor([[0, 1, 2], [3, 4, 6]])
    message = (
        "label 6 in image 1, object 2 is out of range for num_classes=6 "
        "(labels must be 0..5; the background class is added internally, do not count it)"
    )
    with pytest.raises(ValueError) as err:
        MultiBoxLoss()(torch.zeros(2, 8, 4), torch.zeros(2, 8, 7), PRIORS, boxes, labels)
    assert str(err.value) == message


def test_negative_label_and_nan_box_are_clear_errors():
    boxes = torch.tensor([[QUADRANTS[0], QUADRANTS[3]]])
    with pytest.raises(ValueError, match="label -3 in image 0, object 1 is negative"):
        MultiBoxLoss()(torch.zeros(1, 8, 4), torch.zeros(1, 8, 3), PRIORS, boxes, torch.tensor([[0, -3]]))
    boxes[0, 0, 2] = float("nan")
    with pytest.raises(ValueError, match=r"box \[0, 0, nan, 0\.5\] in image 0, object 0 \(label 1\) is not finite"):
        MultiBoxLoss()(torch.zeros(1, 8, 4), torch.zeros(1, 8, 3), PRIORS, boxes, torch.tensor([[1, 0]]))


def test_shape_errors():
    boxes, labels = torch.tensor([[QUADRANTS[0]]]), torch.tensor([[0]])
    with pytest.raises(ValueError, match="targets hold 1 images but the predictions 2"):
        MultiBoxLoss()(torch.zeros(2, 8, 4), torch.zeros(2, 8, 3), PRIORS, boxes, labels)
    with pytest.raises(ValueError, match="9 boxes per image but there are 8 priors"):
        MultiBoxLoss()(torch.zeros(1, 9, 4), torch.zeros(1, 9, 3), PRIORS, boxes, labels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_and_rejects_bad_labels():
    loc, logits, boxes, labels = example()
    cpu = MultiBoxLoss()(loc, logits, PRIORS, boxes, labels)
    gpu = MultiBoxLoss()(loc.cuda(), logits.cuda(), PRIORS.cuda(), boxes.cuda(), labels.cuda())
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b.cpu(), a)
    labels[1, 1] = 3  # K = 3
    with pytest.raises(ValueError, match="label 3 in image 1, object 1 is out of range for num_classes=3"):
        MultiBoxLoss()(loc.cuda(), logits.cuda(), PRIORS.cuda(), boxes.cuda(), labels.cuda())
    torch.cuda.synchronize()


def test_half_precision_predictions_give_float32_losses():
    loc, logits, boxes, labels = example()
    reference = MultiBoxLoss()(loc, logits, PRIORS, boxes, labels)
    loc16 = loc.detach().bfloat16().requires_grad_()
    logits16 = logits.detach().bfloat16().requires_grad_()
    losses = MultiBoxLoss()(loc16, logits16, PRIORS, boxes, labels)
    for ours, ref in zip(losses, reference):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, ref, rtol=1e-2, atol=1e-2)
    sum(losses).backward()
    assert loc16.grad.dtype == torch.bfloat16 and bool(torch.isfinite(logits16.grad.float()).all())

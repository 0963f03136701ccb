"""postprocess: hand-computed NMS case, empty images, limits, and agreement with torchvision's SSD."""

from types import SimpleNamespace

import pytest
import torch
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.ssd import SSD

from ssd.boxes import cxcywh_to_xyxy, xyxy_to_cxcywh
from ssd.postprocess import postprocess
from ssd.priors import PRIOR_CONFIGS, default_boxes

PRIORS = xyxy_to_cxcywh(torch.tensor([[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.52, 0.5], [0.6, 0.6, 0.9, 0.9]]))


def logits_for(probabilities):
    """Logits whose softmax is the given probabilities ``[..., K+1]``."""
    return torch.tensor(probabilities).log()


def test_hand_computed_nms():
    # priors 0 and 1 overlap (IoU 0.152 / 0.168 = 0.905): class 0 at 0.7 on prior 1 is suppressed by 0.8 on prior 0;
    # classes do not suppress each other (prior 0 class 1 and prior 2 class 0 stay)
    probs = [[[0.1, 0.8, 0.1], [0.3, 0.7, 0.0], [0.2, 0.05, 0.75]]]
    (out,) = postprocess(torch.zeros(1, 3, 4), logits_for(probs), PRIORS)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75, 0.1, 0.05]))
    assert out["labels"].tolist() == [0, 1, 1, 0] and out["labels"].dtype == torch.int64
    torch.testing.assert_close(out["boxes"], cxcywh_to_xyxy(PRIORS)[[0, 2, 0, 2]])
    # with a looser NMS threshold both overlapping boxes survive
    (out,) = postprocess(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, iou_threshold=0.95)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75, 0.7, 0.1, 0.05]))


def test_thresholds_top_k_and_candidates():
    probs = [[[0.1, 0.8, 0.1], [0.3, 0.7, 0.0], [0.2, 0.05, 0.75]]]
    (out,) = postprocess(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, score_threshold=0.2)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75]))
    (out,) = postprocess(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, top_k=1)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8]))
    # one candidate per class: class 0 keeps only prior 0 (0.8), class 1 only prior 2
    (out,) = postprocess(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, candidates_per_class=1, iou_threshold=1.0)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75]))


def test_images_without_detections_and_clipping():
    probs = [
        [[1.0, 0.0, 0.0]] * 3,  # nothing above the threshold
        [[0.1, 0.9, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
    ]
    loc = torch.zeros(2, 3, 4)
    loc[1, 0] = torch.tensor([0.0, 0.0, 10.0, 0.0])  # width 0.4 * e^2 = 2.96 around cx 0.3: clipped to 0..1
    empty, one = postprocess(loc, logits_for(probs), PRIORS)
    assert empty["boxes"].shape == (0, 4) and empty["scores"].shape == (0,) and empty["labels"].shape == (0,)
    assert empty["labels"].dtype == torch.int64
    assert one["labels"].tolist() == [0]
    x1, y1, x2, y2 = one["boxes"][0].tolist()
    assert x1 == 0.0 and x2 == 1.0 and (y1, y2) == pytest.approx((0.1, 0.5))
    outs = postprocess(torch.zeros(4, 3, 4), logits_for([[[1.0, 0.0, 0.0]] * 3] * 4), PRIORS)
    assert [len(o["scores"]) for o in outs] == [0, 0, 0, 0]


def torchvision_postprocess(loc, logits, priors, **kwargs):
    """torchvision's SSD.postprocess_detections on the same tensors (its box coder uses weights 10, 10, 5, 5)."""
    fake_ssd = SimpleNamespace(
        box_coder=det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)),
        score_thresh=kwargs["score_threshold"],
        nms_thresh=kwargs["iou_threshold"],
        detections_per_img=kwargs["top_k"],
        topk_candidates=kwargs["candidates_per_class"],
    )
    batch = loc.shape[0]
    anchors = [cxcywh_to_xyxy(priors)] * batch
    head = {"bbox_regression": loc, "cls_logits": logits}
    return SSD.postprocess_detections(fake_ssd, head, anchors, [(1, 1)] * batch)


def make_inputs(case):
    g = torch.Generator().manual_seed(0)
    priors = default_boxes(**PRIOR_CONFIGS["ssd300"])
    loc = torch.randn(2, priors.shape[0], 4, generator=g) * 0.5
    logits = torch.randn(2, priors.shape[0], 6, generator=g) * 2
    logits[..., 0] += 2
    if case == "centred":  # the best scores all sit on overlapping boxes at the centre: most are suppressed,
        loc.zero_()  # so the candidate set has to be widened to find top_k survivors
        logits = logits[..., :3] * 0.05
        logits[..., 1:] -= 10 * (priors[:, :2] - 0.5).norm(dim=-1, keepdim=True)
    return loc, logits, priors


@pytest.mark.parametrize(("case", "candidates"), [("random", 400), ("centred", 400), ("centred", 2000)])
def test_matches_torchvision(case, candidates):
    loc, logits, priors = make_inputs(case)
    kwargs = dict(score_threshold=0.01, iou_threshold=0.45, top_k=200, candidates_per_class=candidates)
    ours = postprocess(loc, logits, priors, **kwargs)
    theirs = torchvision_postprocess(loc, logits, priors, **kwargs)
    for a, b in zip(ours, theirs):
        assert len(a["scores"]) == len(b["scores"]) > 0
        torch.testing.assert_close(a["scores"], b["scores"])
        assert torch.equal(a["labels"], b["labels"] - 1)
        torch.testing.assert_close(a["boxes"], b["boxes"], atol=1e-6, rtol=0)


def test_shape_errors():
    with pytest.raises(ValueError, match="4 boxes per image but there are 3 priors"):
        postprocess(torch.zeros(1, 4, 4), torch.zeros(1, 4, 3), PRIORS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    loc, logits, priors = make_inputs("random")
    cpu = postprocess(loc, logits, priors)
    gpu = postprocess(loc.cuda(), logits.cuda(), priors.cuda())
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b["scores"].cpu(), a["scores"])
        assert torch.equal(b["labels"].cpu(), a["labels"])


def test_half_precision_inputs():
    loc, logits, priors = make_inputs("random")
    ours = postprocess(loc.bfloat16(), logits.bfloat16(), priors)
    assert all(d["scores"].dtype == torch.float32 and len(d["scores"]) == 200 for d in ours)


def test_outputs_of_a_model_in_training_mode():
    loc, logits, priors = make_inputs("random")
    out = postprocess(loc.requires_grad_(), logits.requires_grad_(), priors)
    assert not out[0]["scores"].requires_grad and len(out[0]["scores"]) == 200


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="top_k and candidates_per_class must be positive, got 0 and 400"):
        postprocess(torch.zeros(1, 3, 4), torch.zeros(1, 3, 3), PRIORS, top_k=0)

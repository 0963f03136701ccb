"""postprocess_detections: hand-computed cases, a loop-by-loop reference in every regime, ties, limits, and agreement
with torchvision's SSD."""

import itertools
from types import SimpleNamespace

import pytest
import torch
from torchvision.models.detection import _utils as det_utils
from torchvision.models.detection.ssd import SSD
from torchvision.ops import box_iou

from ssd.boxes import cxcywh_to_xyxy, decode, xyxy_to_cxcywh
from ssd.postprocess import _object_scores, _scores_at, postprocess_detections
from ssd.priors import PRIOR_CONFIGS

PRIORS = xyxy_to_cxcywh(torch.tensor([[0.1, 0.1, 0.5, 0.5], [0.12, 0.1, 0.52, 0.5], [0.6, 0.6, 0.9, 0.9]]))


def logits_for(probabilities):
    """Logits whose softmax is the given probabilities ``[..., K+1]``."""
    return torch.tensor(probabilities).log()


def test_hand_computed_nms():
    # priors 0 and 1 overlap (IoU 0.152 / 0.168 = 0.905): class 0 at 0.7 on prior 1 is suppressed by 0.8 on prior 0;
    # classes do not suppress each other (prior 0 class 1 and prior 2 class 0 stay)
    probs = [[[0.1, 0.8, 0.1], [0.3, 0.7, 0.0], [0.2, 0.05, 0.75]]]
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75, 0.1, 0.05]))
    assert out["labels"].tolist() == [0, 1, 1, 0] and out["labels"].dtype == torch.int64
    torch.testing.assert_close(out["boxes"], cxcywh_to_xyxy(PRIORS)[[0, 2, 0, 2]])
    # with a looser NMS threshold both overlapping boxes survive
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, iou_threshold=0.95)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75, 0.7, 0.1, 0.05]))


def test_thresholds_top_k_and_candidates():
    probs = [[[0.1, 0.8, 0.1], [0.3, 0.7, 0.0], [0.2, 0.05, 0.75]]]
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, score_threshold=0.2)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75]))
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS, max_detections=1)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8]))
    # one candidate per class: class 0 keeps only prior 0 (0.8), class 1 only prior 2
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS,
                                    candidates_per_class=1, iou_threshold=1.0)
    torch.testing.assert_close(out["scores"], torch.tensor([0.8, 0.75]))


def test_images_without_detections_and_clipping():
    probs = [
        [[1.0, 0.0, 0.0]] * 3,  # nothing above the threshold
        [[0.1, 0.9, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]],
    ]
    loc = torch.zeros(2, 3, 4)
    loc[1, 0] = torch.tensor([0.0, 0.0, 10.0, 0.0])  # width 0.4 * e^2 = 2.96 around cx 0.3: clipped to 0..1
    empty, one = postprocess_detections(loc, logits_for(probs), PRIORS)
    assert empty["boxes"].shape == (0, 4) and empty["scores"].shape == (0,) and empty["labels"].shape == (0,)
    assert empty["labels"].dtype == torch.int64
    assert one["labels"].tolist() == [0]
    x1, y1, x2, y2 = one["boxes"][0].tolist()
    assert x1 == 0.0 and x2 == 1.0 and (y1, y2) == pytest.approx((0.1, 0.5))
    outs = postprocess_detections(torch.zeros(4, 3, 4), logits_for([[[1.0, 0.0, 0.0]] * 3] * 4), PRIORS)
    assert [len(o["scores"]) for o in outs] == [0, 0, 0, 0]


def test_equal_scores_order_by_label_then_prior():
    # every score is the same 0.45: priors 0 and 1 overlap (IoU 0.905), prior 2 overlaps neither
    probs = [[[0.1, 0.45, 0.45]] * 3]
    boxes = cxcywh_to_xyxy(PRIORS)
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS)
    assert out["labels"].tolist() == [0, 0, 1, 1]  # in each class the lower prior wins NMS: 0 suppresses 1
    assert torch.equal(out["boxes"], boxes[[0, 2, 0, 2]])
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS,
                                    candidates_per_class=2, iou_threshold=1.0)
    assert out["labels"].tolist() == [0, 0, 1, 1]  # the two candidates of each class are the lower priors
    assert torch.equal(out["boxes"], boxes[[0, 1, 0, 1]])
    (out,) = postprocess_detections(torch.zeros(1, 3, 4), logits_for(probs), PRIORS,
                                    max_detections=3, iou_threshold=1.0)
    assert out["labels"].tolist() == [0, 0, 0] and torch.equal(out["boxes"], boxes)


def reference_postprocess(loc, logits, priors, score_threshold, iou_threshold, max_detections, candidates_per_class):
    """The rule, image by image and class by class, in float64: per class the ``candidates_per_class`` highest
    scores above the threshold, then greedy NMS per class in order of decreasing score, the first ``max_detections``
    survivors. Equal scores: lower label first, then lower prior. Returns ``(score, label, prior)`` lists."""
    results = []
    for image_loc, image_logits in zip(loc, logits):
        boxes = decode(image_loc, priors).clamp(0.0, 1.0)
        candidates = []
        for label, column in enumerate(image_logits.double().softmax(-1)[:, 1:].T.tolist()):
            passing = sorted((-score, prior) for prior, score in enumerate(column) if score > score_threshold)
            candidates += [(-negative, label, prior) for negative, prior in passing[:candidates_per_class]]
        candidates.sort(key=lambda c: (-c[0], c[1], c[2]))
        kept = []
        for score, label, prior in candidates:
            rivals = [p for _, lab, p in kept if lab == label]
            if not rivals or box_iou(boxes[[prior]], boxes[rivals]).max() <= iou_threshold:
                kept.append((score, label, prior))
            if len(kept) == max_detections:
                break
        results.append(kept)
    return results


def scene(regime, seed, batch=3, num_priors=600, num_classes=4):
    """Random priors, offsets and logits for one regime of post-processing (see test_matches_reference)."""
    g = torch.Generator().manual_seed(seed)
    centres, sizes = torch.rand(num_priors, 2, generator=g), torch.rand(num_priors, 2, generator=g) * 0.3 + 0.05
    loc = torch.randn(batch, num_priors, 4, generator=g) * 0.3
    logits = torch.randn(batch, num_priors, num_classes + 1, generator=g)
    draw = torch.rand(batch, num_priors, 1, generator=g)
    hot = draw < 0.03
    if regime.startswith("ties"):  # a random set of channels at 0, the others at -200: scores are 0, 1/n or 1
        on = logits > 0
        if regime == "ties-confident":  # only the hot priors have object channels
            on[..., 1:] &= hot
            on[..., :1] |= ~hot
        logits = torch.where(on, 0.0, -200.0)
    elif regime in ("confident", "crowded"):  # background +12, 3% of the priors confident of one class
        logits[..., 0] += 12
        logits[..., 1:] += 16 * torch.nn.functional.one_hot(logits[..., 1:].argmax(-1), num_classes) * hot
        if regime == "crowded":  # and another 15% above the threshold for class 0
            logits[..., 1:2] += 15 * ((draw > 0.03) & (draw < 0.18))
    elif regime == "nothing":
        logits[..., 0] += 30
    return loc, logits, torch.cat((centres, sizes), 1)


def check_scene(regime, probs, per_class):
    """The scene is what its name says: ``probs [B, P, K]`` object scores, ``per_class`` candidates per class."""
    passing = (probs > 0.01).sum(1)  # [B, K] scores above the threshold per image and class
    top = probs.topk(per_class + 1, dim=1).values  # [B, per_class + 1, K]
    boundary_ties = bool((top[:, per_class - 1] == top[:, per_class]).all())  # the last candidate ties the next
    few = 0 < passing.sum() <= 0.05 * probs.numel() and passing.max() <= per_class  # at most 5% of the scores pass
    assert {
        "confident": few,
        "crowded": passing[:, 0].min() > per_class >= passing[:, 1:].max() and passing[:, 1:].min() > 0,
        "nothing": passing.sum() == 0,
        "dense": passing.min() > per_class,
        "ties": passing.min() > per_class and boundary_ties,
        "ties-confident": few,
    }[regime]


@pytest.mark.parametrize("regime", ["confident", "crowded", "nothing", "dense", "ties", "ties-confident"])
def test_matches_reference(regime):
    loc, logits, priors = scene(regime, seed=1)
    kwargs = dict(score_threshold=0.01, iou_threshold=0.45, max_detections=40, candidates_per_class=20)
    check_scene(regime, logits.softmax(-1)[..., 1:], kwargs["candidates_per_class"])
    ours = postprocess_detections(loc, logits, priors, **kwargs)
    expected = reference_postprocess(loc, logits, priors, **kwargs)
    for image, (out, ref) in enumerate(zip(ours, expected)):
        scores = [s for s, _, _ in ref]
        distinct = sorted(set(scores))  # equal scores are ties; near-equal ones would make the order ambiguous
        assert all(b - a > 1e-6 * b for a, b in itertools.pairwise(distinct))
        if regime.startswith("ties"):  # equal scores compete for places in the output
            assert len(distinct) < len(scores)
        torch.testing.assert_close(out["scores"], torch.tensor(scores, dtype=torch.float32), rtol=1e-6, atol=0)
        assert out["labels"].tolist() == [label for _, label, _ in ref]
        boxes = decode(loc[image], priors).clamp(0.0, 1.0)
        assert torch.equal(out["boxes"], boxes[[prior for _, _, prior in ref]].reshape(-1, 4))


@pytest.mark.parametrize(("batch", "num_priors", "num_classes"), [(8, 8732, 20), (3, 1000, 90), (2, 77, 1)])
def test_scoring_some_priors_gives_the_bits_of_scoring_all(batch, num_priors, num_classes):
    # the confident path scores only the priors that can pass; it must round exactly as scoring every prior
    g = torch.Generator().manual_seed(num_priors)
    logits = torch.randn(batch, num_priors, num_classes + 1, generator=g) * 3
    image = torch.randint(0, batch, (300,), generator=g)
    prior = torch.randint(0, num_priors, (300,), generator=g)
    everywhere = _object_scores(logits, logits.amax(-1))  # [B, K, P]
    assert torch.equal(_scores_at(logits, logits.amax(-1), image, prior), everywhere[image, :, prior])


def torchvision_postprocess(loc, logits, priors, **kwargs):
    """torchvision's SSD.postprocess_detections on the same tensors (its box coder uses weights 10, 10, 5, 5)."""
    fake_ssd = SimpleNamespace(
        box_coder=det_utils.BoxCoder(weights=(10.0, 10.0, 5.0, 5.0)),
        score_thresh=kwargs["score_threshold"],
        nms_thresh=kwargs["iou_threshold"],
        detections_per_img=kwargs["max_detections"],
        topk_candidates=kwargs["candidates_per_class"],
    )
    batch = loc.shape[0]
    anchors = [cxcywh_to_xyxy(priors)] * batch
    head = {"bbox_regression": loc, "cls_logits": logits}
    return SSD.postprocess_detections(fake_ssd, head, anchors, [(1, 1)] * batch)


def make_inputs(case):
    g = torch.Generator().manual_seed(0)
    priors = PRIOR_CONFIGS["ssd300"].boxes(300)
    loc = torch.randn(2, priors.shape[0], 4, generator=g) * 0.5
    logits = torch.randn(2, priors.shape[0], 6, generator=g) * 2
    logits[..., 0] += 2
    if case == "centred":  # the best scores all sit on overlapping boxes at the centre: most are suppressed,
        loc.zero_()  # so the candidate set has to be widened to find max_detections survivors
        logits = logits[..., :3] * 0.05
        logits[..., 1:] -= 10 * (priors[:, :2] - 0.5).norm(dim=-1, keepdim=True)
    return loc, logits, priors


@pytest.mark.parametrize(("case", "candidates"), [("random", 400), ("centred", 400), ("centred", 2000)])
def test_matches_torchvision(case, candidates):
    loc, logits, priors = make_inputs(case)
    kwargs = dict(score_threshold=0.01, iou_threshold=0.45, max_detections=200, candidates_per_class=candidates)
    ours = postprocess_detections(loc, logits, priors, **kwargs)
    theirs = torchvision_postprocess(loc, logits, priors, **kwargs)
    for a, b in zip(ours, theirs):
        assert len(a["scores"]) == len(b["scores"]) > 0
        torch.testing.assert_close(a["scores"], b["scores"])
        assert torch.equal(a["labels"], b["labels"] - 1)
        torch.testing.assert_close(a["boxes"], b["boxes"], atol=1e-6, rtol=0)


def test_shape_errors():
    with pytest.raises(ValueError, match="4 boxes per image but there are 3 priors"):
        postprocess_detections(torch.zeros(1, 4, 4), torch.zeros(1, 4, 3), PRIORS)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu():
    loc, logits, priors = make_inputs("random")
    cpu = postprocess_detections(loc, logits, priors)
    gpu = postprocess_detections(loc.cuda(), logits.cuda(), priors.cuda())
    for a, b in zip(cpu, gpu):
        torch.testing.assert_close(b["scores"].cpu(), a["scores"])
        assert torch.equal(b["labels"].cpu(), a["labels"])


def test_half_precision_inputs():
    loc, logits, priors = make_inputs("random")
    ours = postprocess_detections(loc.bfloat16(), logits.bfloat16(), priors)
    assert all(d["scores"].dtype == torch.float32 and len(d["scores"]) == 200 for d in ours)


def test_outputs_of_a_model_in_training_mode():
    loc, logits, priors = make_inputs("random")
    out = postprocess_detections(loc.requires_grad_(), logits.requires_grad_(), priors)
    assert not out[0]["scores"].requires_grad and len(out[0]["scores"]) == 200


def test_too_many_scores_per_image():
    priors = 2**26  # 64 classes x 2**26 priors = 2**32 class scores per image (expanded tensors: no memory)
    loc, logits = torch.zeros(1, 1, 1).expand(1, priors, 4), torch.zeros(1, 1, 1).expand(1, priors, 65)
    with pytest.raises(ValueError, match=r"fewer than 2\*\*32 class scores per image, got 64 classes x 67108864 pr"):
        postprocess_detections(loc, logits, torch.zeros(1, 4).expand(priors, 4))


def test_limits_must_be_positive():
    with pytest.raises(ValueError, match="max_detections and candidates_per_class must be positive, got 0 and 400"):
        postprocess_detections(torch.zeros(1, 3, 4), torch.zeros(1, 3, 3), PRIORS, max_detections=0)


@pytest.mark.parametrize("score_threshold", [0.0, 0.3])  # every prior scored; only the priors that can pass
def test_classes_are_kept_before_the_top_k_in_both_candidate_paths(score_threshold):
    """classes=[1, 3] gives the first max_detections of the unfiltered detections of those classes (none crowded out
    by the others), with the same scores to the bit."""
    generator = torch.Generator().manual_seed(0)
    loc = torch.randn(2, 300, 4, generator=generator) * 0.1
    logits = torch.randn(2, 300, 5, generator=generator) * 3
    priors = torch.rand(300, 4, generator=generator) * 0.5 + 0.25
    every = postprocess_detections(loc, logits, priors, score_threshold, 0.5, max_detections=10_000)
    kept = postprocess_detections(loc, logits, priors, score_threshold, 0.5, max_detections=7, classes=[1, 3])
    for full, cut in zip(every, kept):
        wanted = (full["labels"] == 1) | (full["labels"] == 3)
        assert int(wanted.sum()) > 7 and not bool(wanted[:7].all())  # the others would have taken places
        for key in ("boxes", "scores", "labels"):
            assert torch.equal(cut[key], full[key][wanted][:7])

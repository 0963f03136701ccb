"""Turn head outputs into detections: softmax, decode, per-class candidates, NMS, top-k, batched."""

from __future__ import annotations

import torch
from torch import Tensor
from torchvision.ops import batched_nms

from ssd.boxes import decode
from ssd.checks import validate_predictions

__all__ = ["postprocess", "CANDIDATES_PER_CLASS"]

CANDIDATES_PER_CLASS = 400
"""Default of ``candidates_per_class``: the best boxes per image and class that enter NMS (also in exported graphs)."""


@torch.no_grad()
def postprocess(
    loc: Tensor,
    logits: Tensor,
    priors: Tensor,
    score_threshold: float = 0.01,
    iou_threshold: float = 0.45,
    top_k: int = 200,
    candidates_per_class: int = CANDIDATES_PER_CLASS,
    variances: tuple[float, float] = (0.1, 0.2),
) -> list[dict[str, Tensor]]:
    """Detections of a batch of head outputs (not differentiable: runs without autograd).

    Args:
        loc: ``[B, P, 4]`` predicted offsets (see :func:`ssd.boxes.encode`).
        logits: ``[B, P, K+1]`` class logits, index 0 is background.
        priors: ``[P, 4]`` cxcywh normalized.
        score_threshold: keep class scores strictly above it.
        iou_threshold: NMS overlap threshold, applied per image and class.
        top_k: detections kept per image (the highest scores).
        candidates_per_class: highest-scoring boxes per image and class that enter NMS.
        variances: encoding variances.

    Returns:
        One dict per image: ``boxes [N, 4]`` xyxy normalized and clipped to ``[0, 1]``, ``scores [N]`` (float32),
        ``labels [N]`` int64 in ``0..K-1``; sorted by decreasing score, ``N <= top_k`` (``N = 0`` is fine).
    """
    num_classes = validate_predictions(loc, logits, priors)
    loc, logits = loc.float(), logits.float()  # no-op for float32; half-precision heads are scored in float32
    batch, num_priors = logits.shape[:2]
    if top_k <= 0 or candidates_per_class <= 0:
        raise ValueError(f"top_k and candidates_per_class must be positive, got {top_k} and {candidates_per_class}")
    # Per image and class: the best candidates (topk, then the threshold below: same set as the reverse order).
    scores = _object_scores(logits)  # [B, K, P]
    cand_scores, cand_prior = scores.topk(min(candidates_per_class, num_priors), dim=-1)  # [B, K, C]
    del scores
    per_class = cand_scores.shape[-1]
    cand_scores, cand_prior = cand_scores.flatten(1), cand_prior.flatten(1)  # [B, K*C]
    num_valid = (cand_scores > score_threshold).sum(dim=1)  # [B]

    # Greedy NMS keeps or drops a box looking only at higher scores of its own image and class, so running it on
    # the best `limit` candidates of each image is exact for them. Stop once every image has top_k survivors or
    # no candidate left out; otherwise widen. Usually one round, with far fewer boxes than all candidates.
    limit = min(2 * top_k, cand_scores.shape[1])
    while True:
        top_scores, top_slot = cand_scores.topk(limit, dim=1)  # [B, limit], by decreasing score
        image, column = (top_scores > score_threshold).nonzero(as_tuple=True)
        slot = top_slot[image, column]
        label = slot // per_class
        prior = cand_prior[image, slot]
        box = decode(loc[image, prior], priors[prior], variances).clamp_(0.0, 1.0)  # only the candidates
        score = top_scores[image, column]
        keep = batched_nms(box, score, image * num_classes + label, iou_threshold)  # by decreasing score
        counts = torch.bincount(image[keep], minlength=batch)
        if limit == cand_scores.shape[1] or bool(((counts >= top_k) | (num_valid <= limit)).all()):
            break
        limit = min(4 * limit, cand_scores.shape[1])

    # Group the survivors by image (stable, so still by score) and keep the first top_k of each.
    keep = keep[torch.sort(image[keep], stable=True).indices]
    kept_image = image[keep]
    first = torch.cumsum(counts, 0) - counts
    rank = torch.arange(keep.numel(), device=keep.device) - first[kept_image]
    keep = keep[rank < top_k]
    sizes = counts.clamp(max=top_k).tolist()
    return [
        {"boxes": b, "scores": s, "labels": lab}
        for b, s, lab in zip(box[keep].split(sizes), score[keep].split(sizes), label[keep].split(sizes))
    ]


def _object_scores(logits: Tensor) -> Tensor:
    """Softmax probabilities of the object classes, ``[B, P, K+1]`` logits -> contiguous ``[B, K, P]``.

    Written into one buffer, smaller than a softmax copy (no background column) and laid out for ``topk`` over
    priors (which would copy a transposed view).
    """
    batch, num_priors, channels = logits.shape
    largest = logits.amax(dim=-1)  # [B, P]
    scores = logits.new_empty(batch, channels - 1, num_priors)
    torch.sub(logits[..., 1:].transpose(1, 2), largest.unsqueeze(1), out=scores).exp_()
    total = torch.sub(logits[..., 0], largest).exp_()  # softmax denominator [B, P]: background + objects
    del largest
    total += scores.sum(dim=1)
    return scores.div_(total.unsqueeze(1))

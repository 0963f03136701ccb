"""Turn head outputs into detections: softmax, per-class candidates, decode, NMS, top-k, batched."""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torchvision.ops import batched_nms

from ssd.boxes import VARIANCES, decode
from ssd.checks import validate_predictions

__all__ = ["postprocess_detections", "CANDIDATES_PER_CLASS"]

CANDIDATES_PER_CLASS = 400
"""Default of ``candidates_per_class``: the best boxes per image and class that enter NMS (also in exported graphs)."""


@torch.no_grad()
def postprocess_detections(
    loc: Tensor,
    logits: Tensor,
    priors: Tensor,
    score_threshold: float = 0.01,
    iou_threshold: float = 0.45,
    max_detections: int = 200,
    candidates_per_class: int = CANDIDATES_PER_CLASS,
    variances: tuple[float, float] = VARIANCES,
) -> list[dict[str, Tensor]]:
    """Detections of a batch of head outputs (not differentiable: runs without autograd).

    Args:
        loc: ``[B, P, 4]`` predicted offsets (see :func:`ssd.boxes.encode`).
        logits: ``[B, P, K+1]`` class logits, index 0 is background.
        priors: ``[P, 4]`` cxcywh normalized.
        score_threshold: keep class scores strictly above it.
        iou_threshold: NMS overlap threshold, applied per image and class.
        max_detections: detections kept per image (the highest scores).
        candidates_per_class: highest-scoring boxes per image and class that enter NMS.
        variances: encoding variances.

    Returns:
        One dict per image: ``boxes [N, 4]`` xyxy normalized and clipped to ``[0, 1]``, ``scores [N]`` (float32),
        ``labels [N]`` int64 in ``0..K-1``; sorted by decreasing score, ``N <= max_detections`` (``N = 0`` is fine).
        Equal scores are ordered by label, then by prior index; where they compete for the last places (among
        the ``candidates_per_class`` of a class, or in NMS), the earlier in that order wins.
    """
    num_classes = validate_predictions(loc, logits, priors)
    loc, logits = loc.float(), logits.float()  # no-op for float32; half-precision heads are scored in float32
    batch, num_priors = logits.shape[:2]
    if max_detections <= 0 or candidates_per_class <= 0:
        raise ValueError(f"max_detections and candidates_per_class must be positive, got {max_detections} and "
                         f"{candidates_per_class}")
    index, score = _candidates(logits, score_threshold, candidates_per_class)  # (image * K + label) * P + prior
    num_valid = torch.bincount(index // (num_classes * num_priors), minlength=batch)  # [B] candidates per image
    first = torch.cumsum(num_valid, 0) - num_valid  # [B] where each image starts

    # Greedy NMS keeps or drops a box looking only at higher scores of its own image and class, so running it on
    # the best `limit` candidates of each image is exact for them. Stop once every image has max_detections survivors or
    # no candidate left out; otherwise widen. Usually one round, with far fewer boxes than all candidates.
    per_image = num_classes * min(candidates_per_class, num_priors)  # the most candidates an image can have
    limit = min(2 * max_detections, per_image)
    while True:
        taken = _firsts(first, num_valid.clamp(max=limit))  # by image, then decreasing score
        row, prior = index[taken] // num_priors, index[taken] % num_priors  # row = image * K + label
        image = row // num_classes
        box = decode(loc[image, prior], priors[prior], variances).clamp_(0.0, 1.0)
        keep = batched_nms(box, score[taken], row, iou_threshold)  # NMS per image and class
        counts = torch.bincount(image[keep], minlength=batch)
        if limit == per_image or bool(((counts >= max_detections) | (num_valid <= limit)).all()):
            break
        limit = min(4 * limit, per_image)

    # Back in input order (by image, then decreasing score, ties as documented); the first max_detections of each image.
    keep = keep.sort().values
    keep = keep[_firsts(torch.cumsum(counts, 0) - counts, counts.clamp(max=max_detections))]
    sizes = counts.clamp(max=max_detections).tolist()
    label = row[keep] % num_classes
    return [
        {"boxes": b, "scores": s, "labels": lab}
        for b, s, lab in zip(box[keep].split(sizes), score[taken[keep]].split(sizes), label.split(sizes))
    ]


def _firsts(start: Tensor, count: Tensor) -> Tensor:
    """Positions ``start[i] + j`` for ``j < count[i]``, for each ``i`` in order: ``[count.sum()]``."""
    offset = torch.cumsum(count, 0) - count  # where each run begins in the output
    return torch.repeat_interleave(start - offset, count) + torch.arange(int(count.sum()), device=count.device)


def _candidates(logits: Tensor, score_threshold: float, per_class: int) -> tuple[Tensor, Tensor]:
    """The class scores above the threshold, at most ``per_class`` per image and class (the highest).

    Args:
        logits: ``[B, P, K+1]`` class logits, index 0 is background.

    Returns:
        ``index, score``, each ``[N]``, with ``index = (image * K + label) * P + prior``, sorted by image, then by
        decreasing score, then by label and prior. On a confident model almost no score passes: only the priors
        that can pass are scored.
    """
    batch, num_priors, channels = logits.shape
    cells = (channels - 1) * num_priors  # candidates are indexed (image * K + label) * P + prior
    if batch * cells >= 2**32:  # see _order
        raise ValueError(
            f"postprocess takes fewer than 2**32 class scores per call, got {batch} images x {channels - 1} classes"
            f" x {num_priors} priors: split the batch"
        )
    best = logits[..., 1:].amax(dim=-1)  # [B, P] highest object logit
    largest = torch.maximum(logits[..., 0], best)  # [B, P], the same as logits.amax(-1)
    near = None
    if score_threshold > 0:
        # A class score is at most exp(logit - largest) (the softmax denominator is >= 1): priors whose best object
        # logit is further than log(score_threshold) below the largest cannot pass. The margin dwarfs rounding.
        mask = best - largest > math.log(score_threshold) - 1e-3  # [B, P]
        if 4 * int(mask.count_nonzero()) <= mask.numel():  # else scoring every prior is faster (same bits)
            near = mask.nonzero(as_tuple=True)
    del best  # before the [B, K, P] buffers
    if near is not None:
        index, score = _few(_scores_at(logits, largest, *near), *near, num_priors, score_threshold, per_class)
    else:
        index, score = _many(_object_scores(logits, largest), score_threshold, per_class)
    order = _order(index // cells, score, index % cells, cells)
    return index[order], score[order]


def _order(major: Tensor, score: Tensor, minor: Tensor, span: int) -> Tensor:
    """Indices that sort by ``major``, then by decreasing ``score`` (>= 0), then by ``minor`` (< ``span``).

    One int64 key: the bits of a float >= 0 read as an int32 rise with it, and
    ``(major * 2**31 + 2**31 - 1 - bits) * span + minor`` fits while ``(major + 1) * span <= 2**32``.
    """
    return ((major * 2**31 + (0x7FFFFFFF - score.view(torch.int32))) * span + minor).sort().indices


def _object_scores(logits: Tensor, largest: Tensor) -> Tensor:
    """Softmax probabilities of the object classes, ``[B, P, K+1]`` logits -> contiguous ``[B, K, P]``.

    ``largest`` is ``logits.amax(-1)`` ``[B, P]``, overwritten (its buffer takes the sum of the class terms).
    Written into one buffer, smaller than a softmax copy (no background column) and laid out for ``topk`` over
    priors (which would copy a transposed view).
    """
    batch, num_priors, channels = logits.shape
    scores = logits.new_empty(batch, channels - 1, num_priors)
    torch.sub(logits[..., 1:].transpose(1, 2), largest.unsqueeze(1), out=scores).exp_()
    total = torch.sub(logits[..., 0], largest).exp_()  # softmax denominator [B, P]: background + objects
    total += torch.sum(scores, dim=1, out=largest)
    return scores.div_(total.unsqueeze(1))


def _scores_at(logits: Tensor, largest: Tensor, image: Tensor, prior: Tensor) -> Tensor:
    """:func:`_object_scores` of the priors ``(image, prior)`` only, ``[N]`` each -> ``[N, K]``, bit for bit.

    How a sum over classes rounds depends on where its prior sits in the ``[B, K, P]`` buffer (vectorized or
    remainder loop, thread chunks), not on the other priors: so the same sum runs over a buffer that is zero
    except at these priors. Exponentials, differences and quotients do not depend on the position.
    """
    batch, num_priors, channels = logits.shape
    exps = torch.sub(logits[image, prior], largest[image, prior].unsqueeze(1)).exp_()  # [N, K+1]
    buffer = logits.new_zeros(batch, channels - 1, num_priors)
    buffer[image, :, prior] = exps[:, 1:]
    total = exps[:, 0] + buffer.sum(dim=1)[image, prior]
    return exps[:, 1:].div_(total.unsqueeze(1))


def _few(
    scores: Tensor, image: Tensor, prior: Tensor, num_priors: int, score_threshold: float, per_class: int
) -> tuple[Tensor, Tensor]:
    """Candidates ``index, score`` among the scores ``[N, K]`` of the priors ``(image, prior)``."""
    num_classes = scores.shape[1]
    column, label = (scores > score_threshold).nonzero(as_tuple=True)
    index = (image[column] * num_classes + label) * num_priors + prior[column]
    return _best_per_row(index, scores[column, label], num_priors, per_class)


def _many(scores: Tensor, score_threshold: float, per_class: int) -> tuple[Tensor, Tensor]:
    """Candidates ``index, score`` among all scores ``[B, K, P]``: ``topk`` per image and class; where equal
    scores compete for the last places (``topk`` would pick any), the row is ranked by :func:`_best_per_row`."""
    num_priors = scores.shape[-1]
    rows = scores.view(-1, num_priors)  # one row per image and class
    if per_class >= num_priors:  # no ranking needed
        index = (rows > score_threshold).view(-1).nonzero().squeeze(1)
        return index, rows.view(-1)[index]
    values, prior = rows.topk(per_class + 1, dim=1, sorted=False)  # [R, C+1]
    after, last = values.topk(2, dim=1, largest=False).values.unbind(1)  # [R] the (C+1)-th and C-th highest
    tied = (after == last) & (last > score_threshold)  # [R]
    ranked = None
    if bool(tied.any()):  # rank these rows whole
        tied_rows = tied.nonzero().squeeze(1)
        row, column = (rows[tied_rows] > score_threshold).nonzero(as_tuple=True)
        row = tied_rows[row]
        ranked = _best_per_row(row * num_priors + column, rows[row, column], num_priors, per_class)
    del scores, rows  # the largest buffer; the rest is small
    chosen = (values > score_threshold) & (values >= last.unsqueeze(1)) & ~tied.unsqueeze(1)  # [R, C+1]
    row, column = chosen.nonzero(as_tuple=True)
    index, score = row * num_priors + prior[row, column], values[row, column]
    if ranked is not None:
        index, score = torch.cat((index, ranked[0])), torch.cat((score, ranked[1]))
    return index, score


def _best_per_row(index: Tensor, score: Tensor, num_priors: int, per_class: int) -> tuple[Tensor, Tensor]:
    """The ``per_class`` highest of the scores ``[N]`` of each row (``index // num_priors``: image and class);
    equal scores by prior."""
    row = index // num_priors
    order = _order(row, score, index % num_priors, num_priors)
    index, score, row = index[order], score[order], row[order]
    counts = torch.bincount(row)
    rank = torch.arange(row.numel(), device=row.device) - (torch.cumsum(counts, 0) - counts)[row]
    return index[rank < per_class], score[rank < per_class]

"""Turn head outputs into detections: softmax, per-class candidates, decode, NMS, top-k, batched."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor
from torchvision.ops import batched_nms

from ssd.boxes import VARIANCES, decode
from ssd.checks import validate_predictions
from ssd.errors import ConfigError, InputError
from ssd.settings import CANDIDATES_PER_CLASS, EVALUATE

__all__ = ["postprocess_detections", "first_per_image", "CANDIDATES_PER_CLASS"]

_EMPTY = torch.iinfo(torch.int64).max  # the key of an empty candidate slot: after every candidate


@torch.no_grad()
def postprocess_detections(
    loc: Tensor,
    logits: Tensor,
    priors: Tensor,
    score_threshold: float = EVALUATE.score_threshold,
    iou_threshold: float = EVALUATE.iou_threshold,
    max_detections: int = EVALUATE.max_detections,
    candidates_per_class: int = CANDIDATES_PER_CLASS,
    variances: tuple[float, float] = VARIANCES,
    classes: Sequence[int] | None = None,
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
        classes: keep only these labels ``0..K-1`` (``None``: all): the others never become candidates, so they
            take no place of the ``max_detections``.

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
        raise ConfigError(f"max_detections and candidates_per_class must be positive, got {max_detections} and "
                          f"{candidates_per_class}")
    wanted = None
    if classes is not None:
        wanted = torch.zeros(num_classes, dtype=torch.bool, device=logits.device)
        wanted[torch.as_tensor(list(classes), dtype=torch.int64, device=logits.device)] = True
    keys, num_valid = _candidates(logits, score_threshold, candidates_per_class, wanted)  # [B, W] (see _key), [B]

    # Greedy NMS keeps or drops a box looking only at higher scores of its own image and class, so running it on
    # the best `limit` candidates of each image is exact for them. Stop once every image has max_detections survivors or
    # no candidate left out; otherwise widen. Usually one round, with far fewer boxes than all candidates.
    per_image = num_classes * min(candidates_per_class, num_priors)  # the most candidates an image can have
    limit = min(2 * max_detections, per_image)
    while True:
        top = keys.topk(min(limit, keys.shape[1]), dim=1, largest=False).values  # [B, L] by decreasing score
        image, column = (top != _EMPTY).nonzero(as_tuple=True)
        key = top[image, column]
        label, prior = key // num_priors % num_classes, key % num_priors
        box = decode(loc[image, prior], priors[prior], variances).clamp_(0.0, 1.0)
        score = (0x7FFFFFFF - key // (num_classes * num_priors)).int().view(torch.float32)  # see _key
        keep = batched_nms(box, score, image * num_classes + label, iou_threshold)  # by image and class
        counts = torch.bincount(image[keep], minlength=batch)
        if limit == per_image or bool(((counts >= max_detections) | (num_valid <= limit)).all()):
            break
        limit = min(4 * limit, per_image)

    # Back in input order (by image, then decreasing score, ties as documented); the first max_detections of each image.
    keep = keep.sort().values
    first, sizes = first_per_image(counts, max_detections)
    keep = keep[first]
    return [
        {"boxes": b, "scores": s, "labels": lab}
        for b, s, lab in zip(box[keep].split(sizes), score[keep].split(sizes), label[keep].split(sizes))
    ]


def first_per_image(counts: Tensor, max_detections: int) -> tuple[Tensor, list[int]]:
    """The first ``max_detections`` of each image in a list of detections ordered by image (each image's best
    first), the images having ``counts [B]`` detections: ``(positions in the list, detections kept per image)``.
    Post-processing and the tiled merge (:mod:`ssd.inference.tiling`) cut their per-image top-k with it."""
    kept = counts.clamp(max=max_detections)
    return _firsts(torch.cumsum(counts, 0) - counts, kept), kept.tolist()


def _firsts(start: Tensor, count: Tensor) -> Tensor:
    """Positions ``start[i] + j`` for ``j < count[i]``, for each ``i`` in order: ``[count.sum()]``."""
    offset = torch.cumsum(count, 0) - count  # where each run begins in the output
    return torch.repeat_interleave(start - offset, count) + torch.arange(int(count.sum()), device=count.device)


def _key(score: Tensor, label: Tensor, prior: Tensor, num_classes: int, num_priors: int) -> Tensor:
    """One int64 per candidate of an image that orders by decreasing score, then label, then prior, and holds all
    three: ``(2**31 - 1 - bits) * K * P + label * P + prior``, where ``bits``, the float32 ``score >= 0`` read as
    an int32, rise with the score (it fits while ``K * P < 2**32``)."""
    return (0x7FFFFFFF - score.view(torch.int32)).long() * (num_classes * num_priors) + label * num_priors + prior


def _candidates(logits: Tensor, score_threshold: float, per_class: int, wanted: Tensor | None = None
                ) -> tuple[Tensor, Tensor]:
    """The class scores above the threshold, at most ``per_class`` per image and class (the highest).

    Args:
        logits: ``[B, P, K+1]`` class logits, index 0 is background.
        wanted: ``[K]`` bool, the classes that may be candidates (``None``: all); the others' scores count as 0.

    Returns:
        ``keys [B, W]``: per image, the :func:`_key` of each candidate, in any order, ``_EMPTY`` in unused slots;
        ``num_valid [B]``: candidates per image. On a confident model almost no score passes: only the priors that
        can pass are scored.
    """
    batch, num_priors, channels = logits.shape
    if (channels - 1) * num_priors >= 2**32:  # see _key
        raise InputError(
            f"postprocess takes fewer than 2**32 class scores per image, got {channels - 1} classes x {num_priors}"
            " priors"
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
        scores = _scores_at(logits, largest, *near)  # [N, K]
        if wanted is not None:
            scores.masked_fill_(~wanted, 0.0)  # never above a threshold >= 0: "strictly above"
        return _few(scores, *near, batch, num_priors, score_threshold, per_class)
    scores = _object_scores(logits, largest)  # [B, K, P]
    if wanted is not None:
        scores.masked_fill_(~wanted.unsqueeze(1), 0.0)
    return _many(scores, score_threshold, per_class)


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
    scores: Tensor, image: Tensor, prior: Tensor, batch: int, num_priors: int, score_threshold: float, per_class: int
) -> tuple[Tensor, Tensor]:
    """:func:`_candidates` among the scores ``[N, K]`` of the priors ``(image, prior)``, in order of image."""
    num_classes = scores.shape[1]
    column, label = (scores > score_threshold).nonzero(as_tuple=True)  # by image, prior, label
    row, prior, score = image[column] * num_classes + label, prior[column], scores[column, label]
    if row.numel() and int(torch.bincount(row).max()) > per_class:
        row, prior, score = _best_per_row(row, prior, score, per_class)
    image, label = row // num_classes, row % num_classes
    num_valid = torch.bincount(image, minlength=batch)
    keys = image.new_full((batch, int(num_valid.max()) if batch else 0), _EMPTY)
    keys[image, _firsts(torch.zeros_like(num_valid), num_valid)] = _key(score, label, prior, num_classes, num_priors)
    return keys, num_valid


def _many(scores: Tensor, score_threshold: float, per_class: int) -> tuple[Tensor, Tensor]:
    """:func:`_candidates` among all scores ``[B, K, P]``: ``topk`` per image and class; where equal scores
    compete for the last places (``topk`` would pick any), the row is ranked by :func:`_best_per_row`."""
    batch, num_classes, num_priors = scores.shape
    rows = scores.view(-1, num_priors)  # one row per image and class
    label = torch.arange(rows.shape[0], device=rows.device).unsqueeze(1) % num_classes  # [R, 1]
    if per_class >= num_priors:  # no ranking needed
        chosen = rows > score_threshold
        prior = torch.arange(num_priors, device=rows.device)
        keys = torch.where(chosen, _key(rows, label, prior, num_classes, num_priors), _EMPTY)
        return keys.view(batch, -1), chosen.view(batch, -1).count_nonzero(dim=1)
    values, prior = rows.topk(per_class + 1, dim=1, sorted=False)  # [R, C+1]
    after, last = values.topk(2, dim=1, largest=False).values.unbind(1)  # [R] the (C+1)-th and C-th highest
    tied = ((after == last) & (last > score_threshold)).nonzero().squeeze(1)  # equal scores compete for places
    if tied.numel():  # rank these rows whole; they keep exactly per_class
        row, column = (rows[tied] > score_threshold).nonzero(as_tuple=True)
        row = tied[row]
        _, best, score = _best_per_row(row, column, rows[row, column], per_class)
        values[tied] = torch.cat((score.view(-1, per_class), values.new_full((tied.numel(), 1), -math.inf)), 1)
        prior[tied] = torch.cat((best.view(-1, per_class), prior[tied, :1]), 1)
    del scores, rows  # the largest buffer; the rest is small
    chosen = (values > score_threshold) & (values >= last.unsqueeze(1))  # [R, C+1]
    keys = torch.where(chosen, _key(values, label, prior, num_classes, num_priors), _EMPTY)
    return keys.view(batch, -1), chosen.view(batch, -1).count_nonzero(dim=1)


def _best_per_row(row: Tensor, prior: Tensor, score: Tensor, per_class: int) -> tuple[Tensor, Tensor, Tensor]:
    """Of the candidates ``[N]`` of each row (image and class), the ``per_class`` highest scores, equal ones by
    prior; sorted by row, then decreasing score, then prior."""
    within = (0x7FFFFFFF - score.view(torch.int32)).long() * (int(prior.max()) + 1) + prior  # see _key
    order = within.sort().indices
    order = order[row[order].sort(stable=True).indices]
    row, prior, score = row[order], prior[order], score[order]
    counts = torch.bincount(row)
    keep = torch.arange(row.numel(), device=row.device) - (torch.cumsum(counts, 0) - counts)[row] < per_class
    return row[keep], prior[keep], score[keep]

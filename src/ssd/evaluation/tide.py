"""Error breakdown in the TIDE classes (Bolya et al., ECCV 2020) on the library's own VOC matching.

Every detection that is not a true positive at IoU ``t_f = 0.5`` (:func:`ssd.evaluation.metrics.match_detections`;
those on difficult objects are left out) gets the first type that applies, in TIDE's order, from its best IoU with
a non-difficult object of its own class and of another class in its image:

- ``localization``: own class, ``t_b <= IoU <= t_f`` (``t_b = 0.1``);
- ``classification``: another class, IoU ``>= t_f``;
- ``duplicate``: own class, IoU ``>= t_f`` (that object was already taken by a higher score);
- ``background``: every object IoU ``<= t_b``;
- ``both``: the rest (wrong class and poorly placed).

An object no true positive took is ``missed`` unless a localization or classification error points at it.
``dAP`` of a type is the VOC mAP (area, IoU 0.5) after fixing every error of that type minus the mAP as is, fixed
as TIDE does: a localization / classification error becomes a true positive (box and class of its object) when
its object is untaken and it is the highest-scoring such error of that object, else it is removed; duplicate,
background and both errors are removed; missed objects are removed from the ground truth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ssd.evaluation.metrics import (
    VOC_IOU,
    check_inputs,
    concat_rows,
    match_detections,
    paired_iou,
    same_key_pairs,
    voc_from_rows,
)

__all__ = ["ERROR_TYPES", "DETECTION_TYPES", "OBJECT_STATES", "error_breakdown"]

DETECTION_TYPES = ("true_positive", "ignored", "localization", "classification", "duplicate", "background", "both")
"""Type of each detection, in :func:`error_breakdown`'s ``detection_type`` codes (index in this tuple)."""
ERROR_TYPES = ("classification", "localization", "both", "duplicate", "background", "missed")
"""The TIDE error classes, in the order reports list them."""
OBJECT_STATES = ("found", "missed", "mistaken", "ignored")
"""State of each object: taken by a true positive, missed, pointed at by a localization / classification error,
difficult."""


def _best_by(pair_det: Tensor, pair_gt: Tensor, iou: Tensor, mask: Tensor, n: int) -> tuple[Tensor, Tensor]:
    """``(best IoU [n], object index [n], -1 without one)`` over the pairs selected by ``mask``."""
    pair_det, pair_gt, iou = pair_det[mask], pair_gt[mask], iou[mask]
    best = torch.full((n,), -1.0, dtype=torch.float64).scatter_reduce(0, pair_det, iou, "amax", include_self=True)
    at_best = iou == best[pair_det]
    index = torch.full((n,), -1, dtype=torch.int64).scatter_reduce(0, pair_det[at_best], pair_gt[at_best], "amax",
                                                                    include_self=True)
    return best.clamp(min=0), index


def _types(det: dict[str, Tensor], gt: dict[str, Tensor], tp: Tensor, ignored: Tensor, fg: float, bg: float
           ) -> tuple[Tensor, Tensor]:
    """``(type code [N] into DETECTION_TYPES, target object [N] of localization / classification errors, else -1)``."""
    n = det["labels"].numel()
    counted = ~gt["difficult"]
    pair_det, pair_gt, _ = same_key_pairs(det["image"], gt["image"])
    iou = paired_iou(det["boxes"][pair_det], gt["boxes"][pair_gt])
    same = det["labels"][pair_det] == gt["labels"][pair_gt]
    valid = counted[pair_gt]
    own_iou, own_gt = _best_by(pair_det, pair_gt, iou, valid & same, n)
    other_iou, other_gt = _best_by(pair_det, pair_gt, iou, valid & ~same, n)
    code = torch.full((n,), DETECTION_TYPES.index("both"), dtype=torch.int64)
    rules = [  # reversed TIDE order: the first rule that applies is written last and wins
        (torch.maximum(own_iou, other_iou) <= bg, "background"),
        ((own_gt >= 0) & (own_iou >= fg), "duplicate"),
        ((other_gt >= 0) & (other_iou >= fg), "classification"),
        ((own_gt >= 0) & (own_iou >= bg) & (own_iou <= fg), "localization"),
        (ignored, "ignored"),
        (tp, "true_positive"),
    ]
    for applies, name in rules:
        code = torch.where(applies, DETECTION_TYPES.index(name), code)
    target = torch.where(code == DETECTION_TYPES.index("localization"), own_gt,
                         torch.where(code == DETECTION_TYPES.index("classification"), other_gt, -1))
    return code, target


def _fixable(det: dict[str, Tensor], target: Tensor, taken: Tensor) -> Tensor:
    """``[N]`` bool: the highest-scoring error of each untaken target object (the one a fix turns into a TP)."""
    n = target.numel()
    candidate = (target >= 0) & ~taken[target.clamp(min=0)]
    rank = torch.empty(n, dtype=torch.int64)
    rank[torch.argsort(-det["scores"], stable=True)] = torch.arange(n)
    first = torch.full((taken.numel(),), n, dtype=torch.int64)
    first = first.scatter_reduce(0, target[candidate], rank[candidate], "amin")
    return candidate & (rank == first[target.clamp(min=0)])


def error_breakdown(detections: Sequence[Mapping[str, Any]], ground_truths: Sequence[Mapping[str, Any]],
                    num_classes: int, class_names: Sequence[str] | None = None, *, foreground_iou: float = VOC_IOU,
                    background_iou: float = 0.1) -> dict[str, Any]:
    """Counts and dAP of each TIDE error type (see the module docstring).

    Inputs are the per-image dicts of :mod:`ssd.evaluation.metrics`.

    Returns:
        ``dict(map, errors, detection_type, object_state)``: ``map`` the VOC mAP at ``foreground_iou`` as is;
        ``errors`` maps each of :data:`ERROR_TYPES` to ``dict(count, dap)`` (``count``: detections, or objects for
        ``missed``; ``dap``: mAP gained by fixing them); ``detection_type`` one int64 tensor ``[N_i]`` per image of
        codes into :data:`DETECTION_TYPES`; ``object_state`` one ``[M_i]`` per image of codes into
        :data:`OBJECT_STATES`; ``localization_targets`` one ``[M_i]`` bool per image: objects a localization error
        points at.
    """
    names = check_inputs(detections, ground_truths, num_classes, class_names)
    det = concat_rows(detections, "detections", num_classes, ("boxes", "scores", "labels"))
    gt = concat_rows(ground_truths, "ground truths", num_classes, ("boxes", "labels", "difficult"))
    tp, ignored, _, _, best_gt = match_detections(det, gt, num_classes, foreground_iou)
    code, target = _types(det, gt, tp, ignored, foreground_iou, background_iou)

    m = gt["labels"].numel()
    taken = torch.zeros(m, dtype=torch.bool)
    taken[best_gt[tp]] = True
    pointed = torch.zeros(m, dtype=torch.bool)
    pointed[target[target >= 0]] = True
    localized = torch.zeros(m, dtype=torch.bool)
    localized[target[code == DETECTION_TYPES.index("localization")]] = True
    missed = ~taken & ~pointed & ~gt["difficult"]
    state = torch.where(taken, 0, torch.where(missed, 1, torch.where(gt["difficult"], 3, 2)))

    base = voc_from_rows(det, gt, names, iou_threshold=foreground_iou)["map"]
    fixable = _fixable(det, target, taken)
    errors = {}
    for name in ERROR_TYPES:
        if name == "missed":
            count, fixed = int(missed.sum()), voc_from_rows(det, {k: v[~missed] for k, v in gt.items()}, names,
                                                             iou_threshold=foreground_iou)["map"]
        else:
            of_type = code == DETECTION_TYPES.index(name)
            fixed_det = dict(det)
            if name in ("localization", "classification"):
                to_fix = of_type & fixable
                fixed_det["boxes"] = torch.where(to_fix[:, None], gt["boxes"][target.clamp(min=0)], det["boxes"])
                fixed_det["labels"] = torch.where(to_fix, gt["labels"][target.clamp(min=0)], det["labels"])
                keep = ~of_type | to_fix
            else:
                keep = ~of_type
            count = int(of_type.sum())
            fixed = voc_from_rows({k: v[keep] for k, v in fixed_det.items()}, gt, names,
                                  iou_threshold=foreground_iou)["map"]
        errors[name] = {"count": count, "dap": float(fixed - base) if count else 0.0}
    det_sizes = torch.bincount(det["image"], minlength=len(detections)).tolist()
    gt_sizes = torch.bincount(gt["image"], minlength=len(ground_truths)).tolist()
    return {"map": base, "foreground_iou": foreground_iou, "background_iou": background_iou, "errors": errors,
            "detection_type": list(code.split(det_sizes)), "object_state": list(state.split(gt_sizes)),
            "localization_targets": list(localized.split(gt_sizes))}

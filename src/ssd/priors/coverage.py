"""Default-box coverage: the share of ground-truth boxes whose best default box reaches IoU 0.5.

A box below SSD's matching threshold gets only its one forced positive and is learned poorly. Boxes are ``xyxy``
normalized to their image, which is what the model sees after its plain resize to a square input; default boxes
sit at grid centres, so a box's position matters as much as its shape. ``ssd check`` reports it
(:func:`ssd.data.coverage.prior_coverage`) and :func:`ssd.priors.fit.fit_priors` maximises it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ssd.boxes import box_iou_batched, cxcywh_to_xyxy
from ssd.matching import MATCH_IOU
from ssd.text import render_table

__all__ = ["ASPECT_BUCKETS", "SIZE_BUCKETS", "best_iou", "coverage", "coverage_lines"]

SIZE_BUCKETS = (("small", 0.0, 0.1), ("medium", 0.1, 0.3), ("large", 0.3, math.inf))
"""Object size buckets by ``sqrt(w * h)`` relative to the image (both normalized)."""
ASPECT_BUCKETS = (("tall", 0.0, 1 / 3), ("regular", 1 / 3, 3.0), ("wide", 3.0, math.inf))
"""Aspect buckets by ``w / h`` of the box after the model's plain resize to a square (normalized w / h)."""


def best_iou(boxes: Tensor, priors: Tensor) -> Tensor:
    """Best IoU ``[N]`` of each box ``[N, 4]`` (xyxy normalized) with any default box ``[P, 4]`` (cxcywh normalized)."""
    prior_xyxy = cxcywh_to_xyxy(priors.detach().float().cpu())
    boxes = boxes.float()
    if not len(boxes):
        return torch.zeros(0)
    return torch.cat([box_iou_batched(chunk[None], prior_xyxy)[0].amax(dim=1) for chunk in boxes.split(2048)])


def coverage(boxes: Tensor, priors: Tensor, iou_threshold: float = MATCH_IOU) -> dict:
    """Share of boxes ``[N, 4]`` (xyxy normalized to their image) whose best default box reaches ``iou_threshold``.

    Returns a dict with ``iou_threshold``, ``boxes``, ``covered`` (share), ``mean_iou`` (mean best IoU),
    ``by_size`` / ``by_aspect`` (lists of dicts: name, boxes, covered, median_iou, see :data:`SIZE_BUCKETS` and
    :data:`ASPECT_BUCKETS`) and ``worst`` (the size x aspect combinations with the lowest share, at least 5 boxes
    and under 90% covered, at most 3).
    """
    boxes = boxes.float().reshape(-1, 4).clamp(0, 1)
    best = best_iou(boxes, priors)
    w, h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    size, aspect = (w * h).sqrt(), w / h.clamp_min(1e-9)
    covered = best >= iou_threshold

    def summary(name: str, mask: Tensor) -> dict:
        n = int(mask.sum())
        return {"name": name, "boxes": n, "covered": float(covered[mask].float().mean()) if n else 0.0,
                "median_iou": float(best[mask].median()) if n else 0.0}

    in_size = {n: (size >= lo) & (size < hi) for n, lo, hi in SIZE_BUCKETS}
    in_aspect = {n: (aspect >= lo) & (aspect < hi) for n, lo, hi in ASPECT_BUCKETS}
    combos = [summary(f"{s} {a}", in_size[s] & in_aspect[a]) for s in in_size for a in in_aspect]
    worst = sorted((c for c in combos if c["boxes"] >= 5 and c["covered"] < 0.9), key=lambda c: c["covered"])[:3]
    return {"iou_threshold": iou_threshold, "boxes": len(boxes),
            "covered": float(covered.float().mean()) if len(boxes) else 0.0,
            "mean_iou": float(best.mean()) if len(boxes) else 0.0,
            "by_size": [summary(n, m) for n, m in in_size.items()],
            "by_aspect": [summary(n, m) for n, m in in_aspect.items()], "worst": worst}


def coverage_lines(report: dict) -> list[str]:
    """A :func:`coverage` report as text lines: the share covered, a table per bucket, the worst combinations."""
    lines = [f"default-box coverage (share of boxes whose best default box has IoU >= {report['iou_threshold']}): "
             f"{report['covered']:.1%} of {report['boxes']} boxes"]
    if report.get("crop_scale"):
        lines[0] += f", boxes at the median crop scale of --crop-scale {report['crop_scale']}"
    rows = [[b["name"], b["boxes"], f"{b['covered']:.1%}" if b["boxes"] else "-",
             f"{b['median_iou']:.2f}" if b["boxes"] else "-"] for b in report["by_size"] + report["by_aspect"]]
    lines += ["  " + r for r in render_table(["bucket", "boxes", "covered", "median IoU"], rows)]
    if report["worst"]:
        lines.append("  worst covered: " + "; ".join(f"{w['name']} ({w['covered']:.0%} of {w['boxes']})"
                                                     for w in report["worst"]))
    return lines

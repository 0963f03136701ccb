"""Default boxes fitted to a dataset: :func:`fit_priors` maximises their coverage (`priors.coverage`),
the share of ground-truth boxes whose best default box reaches IoU 0.5, SSD's matching threshold, with the mean best
IoU as the tie-break. Coverage depends on where boxes lie, not only on their shapes: default boxes sit at grid
centres.

The fit keeps every level's feature map, steps (hence the default-box centres) and, by default, the number of boxes
per location (heads keep their shapes, pretrained heads still load), and moves ``min_sizes``, ``max_sizes`` and the
aspect-ratio values inside the limits of :class:`FitRules` (what each level of the network can see). The result goes
through the same :func:`ssd.priors.default_boxes` as every model.

Search: coordinate descent in log space. Each coordinate (a level's min size, its max/min ratio, one of its aspect
ratios) is set to the best of a grid over its whole feasible interval plus small steps around its value, all
candidates scored at once; after each sweep every level also tries seeded joint random moves of all its values.
Sweeps repeat until one covers no more boxes and raises the mean best IoU by under 1e-4. A second descent from a
seeded random perturbation of the defaults guards against local optima (``restarts``). A candidate is scored by the
number of boxes covered, ties broken by the mean best IoU. Scoring is cheap because, for fixed shapes, IoU falls as
two boxes' centres move apart along either axis: a level's best default box of a given shape is the one at the grid
centre nearest the box's centre, so a level costs ``[N, boxes per location]`` IoUs, not ``[N, f * f * boxes per
location]``: the fit takes seconds for a few thousand boxes (``benchmarks/README.md``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ssd.errors import DataError, InputError
from ssd.matching import MATCH_IOU
from ssd.priors.config import PriorConfig
from ssd.priors.coverage import coverage
from ssd.priors.fit_rules import Bounds, FitRules, Layout
from ssd.priors.fit_search import Scorer, Search, free_search, perturbed
from ssd.sizes import input_size, size_text
from ssd.text import render_table

__all__ = ["FitResult", "FitRules", "fit_priors"]


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_priors` found.

    Attributes:
        priors: the configuration to use: the fitted one when ``changed``, else ``base`` unchanged.
        before, after: :func:`coverage` of the boxes with ``base`` and with the best fit found (``after`` shows the
            fit even when it did not gain enough to replace ``base``).
        changed: the fit raised coverage by at least ``min_gain``.
        base: the architecture's configuration the fit started from.
        fitted: the best configuration found (equal to ``priors`` when ``changed``).
        image_size: the input the sizes are pixels of: an int (square) or ``(height, width)``.
        ceiling: the share of the boxes that default boxes of any shapes at these centres could cover, the most
            any fit can reach (beyond it takes finer steps: a larger input).
    """

    priors: PriorConfig
    before: dict
    after: dict
    changed: bool
    base: PriorConfig
    fitted: PriorConfig
    image_size: int | tuple[int, int]
    free: bool
    min_gain: float
    ceiling: float
    seconds: float = field(compare=False)

    def to_dict(self) -> dict:
        return {"priors": self.priors.to_dict(), "changed": self.changed, "base": self.base.to_dict(),
                "fitted": self.fitted.to_dict(), "image_size": _plain(self.image_size), "free": self.free,
                "min_gain": self.min_gain, "ceiling": self.ceiling, "before": self.before, "after": self.after,
                "seconds": self.seconds}

    def format_table(self) -> str:
        """Before/after coverage per size and aspect bucket, the per-level sizes, and the verdict."""
        b, a = self.before, self.after
        mode = "aspect-ratio sets free" if self.free else "boxes per location kept"
        lines = [(f"default boxes fitted to {b['boxes']} boxes at {size_text(self.image_size)} px ({mode}, "
                  f"{self.seconds:.1f} s): "
                  f"coverage (IoU >= {b['iou_threshold']}) {b['covered']:.1%} -> {a['covered']:.1%}, mean best IoU "
                  f"{b['mean_iou']:.3f} -> {a['mean_iou']:.3f}"),
                 (f"(default boxes of any shapes centred where these are could cover at most {self.ceiling:.1%}; "
                  "more takes finer steps: a larger input size)")]
        rows = [[x["name"], x["boxes"], *(f"{c['covered']:.1%}" if c["boxes"] else "-" for c in (x, y)),
                 *(f"{c['median_iou']:.2f}" if c["boxes"] else "-" for c in (x, y))]
                for x, y in zip(b["by_size"] + b["by_aspect"], a["by_size"] + a["by_aspect"])]
        lines += ["  " + r for r in render_table(["bucket", "boxes", "before", "after", "median IoU before",
                                                  "after"], rows)]
        old, new = self.base, self.fitted
        rows = [[k, "x".join(map(str, grid)), "x".join(f"{v:g}" for v in dict.fromkeys(step)),
                 f"{old.min_sizes[k]:g} -> {new.min_sizes[k]:g}",
                 f"{old.max_sizes[k]:g} -> {new.max_sizes[k]:g}",
                 f"{_ratios(old.aspect_ratios[k])} -> {_ratios(new.aspect_ratios[k])}",
                 f"{2 + 2 * len(old.aspect_ratios[k])} -> {2 + 2 * len(new.aspect_ratios[k])}"]
                for k, (grid, step) in enumerate(old.grids())]
        lines += ["  " + r for r in render_table(["level", "map", "step", "min_size", "max_size", "aspect_ratios",
                                                  "boxes/location"], rows)]
        if self.changed:
            lines.append(f"fitted default boxes cover {a['covered'] - b['covered']:+.1%} of the boxes")
        else:
            lines.append(f"the default boxes are already as good (the best fit gains {a['covered'] - b['covered']:+.1%}"
                         f", under the {self.min_gain:.1%} needed to change them): nothing changed")
        return "\n".join(lines)


def _ratios(ratios) -> str:
    return "[" + ", ".join(f"{r:g}" for r in ratios) + "]"


def _plain(size: int | tuple[int, int]) -> int | list[int]:
    """An input size for JSON / YAML: the int of a square input, else ``[height, width]``."""
    return size if isinstance(size, int) else list(size)


def fit_priors(boxes: Tensor, image_size: int | tuple[int, int] | str, base: PriorConfig, *, free: bool = False,
               seed: int = 0, iou_threshold: float = MATCH_IOU, min_gain: float = 0.005, rules: FitRules | None = None,
               restarts: int = 2, max_sweeps: int = 12, max_boxes: int = 20000) -> FitResult:
    """Default boxes that cover the most ``boxes`` (see the module docstring for the search).

    Args:
        boxes: ``[N, 4]`` ground-truth boxes, ``xyxy`` normalized to their image (e.g. the training split); boxes
            that are not finite or have no area inside the image are left out.
        image_size: the network input (``base``'s sizes and steps are pixels of it): an int ``S`` (the square
            ``S x S``), ``(height, width)`` or ``"HxW"``. Default boxes and their scores are computed per axis, as
            :func:`ssd.priors.default_boxes` does.
        base: the architecture's configuration at ``image_size``: its feature maps and steps are kept.
        free: the number of aspect ratios of a level may change (then heads change shape and pretrained heads
            no longer load): a level gains a ratio where that covers at least ``min_gain`` more of the boxes and
            loses one that covers no box the others miss. Default: every level keeps its number of boxes per
            location; only the values change.
        seed: seeds the restarts (and the sample of ``max_boxes``): same inputs and seed, same result.
        min_gain: coverage (share) a fit must gain over ``base`` to replace it (``changed``).
        rules: the limits of :class:`FitRules` (default: ``FitRules()``).
        restarts: descents run (the first from ``base``, the others from seeded random perturbations of it).
        max_boxes: the search scores a seeded sample of this many boxes (``before``/``after`` use all of them).
    """
    start = time.perf_counter()
    boxes = _usable(boxes)
    image_size = input_size(image_size)
    generator = torch.Generator().manual_seed(seed)
    sample = boxes if len(boxes) <= max_boxes else boxes[torch.randperm(len(boxes), generator=generator)[:max_boxes]]
    scorer = Scorer(sample, base, image_size, iou_threshold)
    bounds = Bounds(FitRules() if rules is None else rules, base, image_size)
    origin, best = Layout.of(base), None
    for attempt in range(max(1, restarts)):
        begin = origin if attempt == 0 else perturbed(origin, bounds, generator, 0.5)
        search = Search(scorer, bounds, begin).run(max_sweeps, generator)
        if best is None or float(search.key) > float(best.key):
            best = search
    layout = free_search(best, min_gain, max_sweeps, generator) if free else best.layout
    fitted = layout.to_priors(base)
    before = coverage(boxes, base.boxes(image_size), iou_threshold)
    after = coverage(boxes, fitted.boxes(image_size), iou_threshold)
    changed = after["covered"] - before["covered"] >= min_gain
    full = scorer if sample is boxes else Scorer(boxes, base, image_size, iou_threshold)
    ceiling = float((full.ceiling.amax(dim=0) >= iou_threshold).double().mean())
    return FitResult(fitted if changed else base, before, after, changed, base, fitted, image_size, free, min_gain,
                     ceiling, time.perf_counter() - start)


def _usable(boxes: Tensor) -> Tensor:
    """The boxes ``[N, 4]`` clipped to the image, without non-finite ones and ones with no area inside it."""
    boxes = torch.as_tensor(boxes, dtype=torch.float64)
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
        raise InputError(f"boxes must be [N, 4] xyxy normalized to the image, got shape {list(boxes.shape)}")
    boxes = boxes[torch.isfinite(boxes).all(dim=1)].clamp(0, 1)
    boxes = boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]
    if not len(boxes):
        raise DataError("no boxes to fit default boxes to (every box is empty, not finite or outside the image)")
    return boxes

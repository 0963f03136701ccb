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

import itertools
import math
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ssd._utils import as_hw, compact_size, render_table, size_text
from ssd.priors.config import PriorConfig, _pair
from ssd.priors.coverage import coverage

__all__ = ["FitResult", "FitRules", "fit_priors"]


# ---------------------------------------------------------------------------------------------------- rules
@dataclass(frozen=True)
class FitRules:
    """What each level of the network can see: the limits a fitted configuration stays within.

    Every limit is widened where needed to include the architecture's own configuration, so the defaults are always
    a valid answer.

    Attributes:
        stride: ``(lo, hi)`` of ``min_size / step``: a level's smallest box spans at least ``lo`` cells (smaller
            ones fall between the grid centres) and at most ``hi`` cells (larger ones belong to a deeper level with
            a larger receptive field). ``min_size`` never exceeds the input size (its longer side: a larger box is
            clipped to the whole input on both axes). A level with steps ``(step_y, step_x)`` (a non-square input)
            uses their geometric mean ``sqrt(step_y * step_x)``: a box of ``s`` px spans ``s / step_x`` cells
            across and ``s / step_y`` down, ``s / sqrt(step_y * step_x)`` cells of the same area, and the models'
            default box sizes scale the same way (with ``sqrt(height * width)``), so their defaults keep the
            ratio they have at the square size.
        neighbour: ``(lo, hi)`` of ``min_size[k + 1] / min_size[k]``: sizes strictly increase with depth, and
            neighbouring levels stay close enough that no size range falls between them.
        max_size: ``(lo, hi)`` of ``max_size / min_size``: the second square box of a level,
            ``sqrt(min_size * max_size)``, is 1.05 to 1.73 times its first (SSD's ``max_size[k] = min_size[k + 1]``
            puts it between the level's first box and the next level's, 1.1 to 1.4 times the first).
        aspect: ``(lo, hi)`` of each aspect ratio ``r`` (each gives a ``r:1`` and a ``1:r`` box).
        aspect_spacing: smallest ratio between two aspect ratios of one level (no near-duplicate boxes).
        max_aspect_ratios: most aspect ratios per level when their number may change (``free``).
    """

    stride: tuple[float, float] = (0.75, 8.0)
    neighbour: tuple[float, float] = (1.1, 3.0)
    max_size: tuple[float, float] = (1.1, 3.0)
    aspect: tuple[float, float] = (1.5, 6.0)
    aspect_spacing: float = 1.2
    max_aspect_ratios: int = 3


@dataclass
class _Layout:
    """A configuration in log space: per level ``log min_size``, ``log(max_size / min_size)``, log aspect ratios."""

    m: list[float]
    g: list[float]
    r: list[list[float]]

    @classmethod
    def of(cls, priors: PriorConfig) -> _Layout:
        return cls([math.log(s) for s in priors.min_sizes],
                   [math.log(b / a) for a, b in zip(priors.min_sizes, priors.max_sizes)],
                   [sorted(math.log(r) for r in ratios) for ratios in priors.aspect_ratios])

    def copy(self) -> _Layout:
        return _Layout(list(self.m), list(self.g), [list(r) for r in self.r])

    def coords(self) -> list[tuple]:
        """Every coordinate: ``("m", level)``, ``("g", level)``, ``("r", level, index)``."""
        return [c for k, ratios in enumerate(self.r)
                for c in [("m", k), ("g", k), *(("r", k, j) for j in range(len(ratios)))]]

    def get(self, coord: tuple) -> float:
        return self.r[coord[1]][coord[2]] if coord[0] == "r" else getattr(self, coord[0])[coord[1]]

    def set(self, coord: tuple, value: float) -> None:
        if coord[0] == "r":
            self.r[coord[1]][coord[2]] = value
        else:
            getattr(self, coord[0])[coord[1]] = value

    def to_priors(self, base: PriorConfig) -> PriorConfig:
        """Rounded to 0.1 px and 0.01 of a ratio (readable YAML; the coverage is measured after rounding)."""
        mins = [round(math.exp(m), 1) for m in self.m]
        return PriorConfig(feature_maps=base.feature_maps, steps=base.steps, min_sizes=mins,
                           max_sizes=[round(s * math.exp(g), 1) for s, g in zip(mins, self.g)],
                           aspect_ratios=[[round(math.exp(r), 2) for r in rs] for rs in self.r], clip=base.clip)


def _cell(step, name: str) -> float:
    """A level's step as one length: ``step``, or ``sqrt(step_y * step_x)`` for a ``(step_y, step_x)`` pair."""
    step_y, step_x = _pair(step, name)
    return step_y if step_y == step_x else math.sqrt(step_y * step_x)


class _Bounds:
    """:class:`FitRules` in log space for one base configuration, widened to include it."""

    def __init__(self, rules: FitRules, base: PriorConfig, image_size: int | tuple[int, int]):
        layout, log, longest = _Layout.of(base), math.log, max(as_hw(image_size))
        steps = [_cell(step, f"steps[{k}]") for k, step in enumerate(base.steps)]
        self.stride = [(min(log(rules.stride[0] * s), m), max(min(log(rules.stride[1] * s), log(longest)), m))
                       for s, m in zip(steps, layout.m)]
        self.neighbour = [(min(log(rules.neighbour[0]), b - a), max(log(rules.neighbour[1]), b - a))
                          for a, b in itertools.pairwise(layout.m)]
        self.max_size = [(min(log(rules.max_size[0]), g), max(log(rules.max_size[1]), g)) for g in layout.g]
        every_ratio = [r for rs in layout.r for r in rs]
        self.aspect = (min([log(rules.aspect[0]), *every_ratio]), max([log(rules.aspect[1]), *every_ratio]))
        gaps = [b - a for rs in layout.r for a, b in itertools.pairwise(rs)]
        self.spacing = min([log(rules.aspect_spacing), *gaps])
        self.max_aspect_ratios = max([rules.max_aspect_ratios, *(len(rs) for rs in layout.r)])

    def interval(self, layout: _Layout, coord: tuple) -> tuple[float, float]:
        """The values ``coord`` may take with every other coordinate fixed (empty when ``lo > hi``)."""
        kind, k = coord[0], coord[1]
        if kind == "g":
            return self.max_size[k]
        if kind == "r":
            rs, j = layout.r[k], coord[2]
            lo = max(self.aspect[0], rs[j - 1] + self.spacing if j else -math.inf)
            hi = min(self.aspect[1], rs[j + 1] - self.spacing if j + 1 < len(rs) else math.inf)
            return lo, hi
        lo, hi = self.stride[k]
        if k > 0:
            below, (near, far) = layout.m[k - 1], self.neighbour[k - 1]
            lo, hi = max(lo, below + near), min(hi, below + far)
        if k + 1 < len(layout.m):
            above, (near, far) = layout.m[k + 1], self.neighbour[k]
            lo, hi = max(lo, above - far), min(hi, above - near)
        return lo, hi


# --------------------------------------------------------------------------------------------------- scoring
def _offset_iou(w: Tensor, h: Tensor, dx: Tensor, dy: Tensor, aw: Tensor, ah: Tensor) -> Tensor:
    """IoU of boxes of sizes ``(w, h)`` and ``(aw, ah)`` whose centres are ``(dx, dy)`` apart (broadcast)."""
    ix = torch.minimum(torch.minimum(w, aw), (w + aw) / 2 - dx).clamp_(min=0)
    iy = torch.minimum(torch.minimum(h, ah), (h + ah) / 2 - dy).clamp_(min=0)
    inter = ix * iy
    return inter / (w * h + aw * ah - inter)


class _Scorer:
    """Best IoU of ``N`` boxes with each level's default boxes (of any candidate shapes).

    A level's best IoU for a shape comes from the default box at the grid centre nearest the box centre, found once
    here (per level and axis: ``dx``, ``dy`` ``[L, N]``); centres and sizes follow :func:`ssd.priors.default_boxes`
    per axis: column ``j`` of a level is centred at ``(j + 0.5) * step_x / width``, row ``i`` at
    ``(i + 0.5) * step_y / height``, and a size of ``s`` px is ``s / width`` wide and ``s / height`` high. IoU of
    normalized boxes equals IoU in pixels (scaling an axis scales every area alike).
    ``ceiling[k]`` ``[N]`` is the best IoU any default box of level ``k`` could reach: along one axis the IoU is a
    ratio of linear functions of the default box's side between the breakpoints ``w - 2 dx`` and ``w + 2 dx``, so the
    best shape is one of the four breakpoint pairs. Boxes whose ceiling at a level is below what the other levels
    already give them cannot change when that level changes, and are not scored again.
    """

    def __init__(self, boxes: Tensor, base: PriorConfig, image_size: int | tuple[int, int], iou_threshold: float):
        boxes = boxes.double()
        centre = {"x": (boxes[:, 0] + boxes[:, 2]) / 2, "y": (boxes[:, 1] + boxes[:, 3]) / 2}
        height, width = as_hw(image_size)
        offsets = {"x": [], "y": []}
        for k, (f, step) in enumerate(zip(base.feature_maps, base.steps)):
            (rows, cols), (step_y, step_x) = _pair(f, f"feature_maps[{k}]"), _pair(step, f"steps[{k}]")
            for axis, count, side, stride in (("x", cols, width, step_x), ("y", rows, height, step_y)):
                centres = (torch.arange(count, dtype=torch.float64) + 0.5) / (side / stride)  # as default_boxes
                centres = centres.clamp(0, 1) if base.clip else centres
                offsets[axis].append((centre[axis][:, None] - centres).abs().amin(dim=1))
        self.w, self.h = (boxes[:, 2] - boxes[:, 0]).float(), (boxes[:, 3] - boxes[:, 1]).float()
        self.dx, self.dy = torch.stack(offsets["x"]).float(), torch.stack(offsets["y"]).float()
        self.height, self.width = height, width
        self.clip, self.threshold, self.count = base.clip, iou_threshold, len(boxes)
        ceilings = []
        for k in range(len(self.dx)):
            args = self.w, self.h, self.dx[k], self.dy[k]
            ceilings.append(torch.stack([_offset_iou(*args, aw.clamp(min=1e-9), ah.clamp(min=1e-9))
                                         for aw in (self.w - 2 * self.dx[k], self.w + 2 * self.dx[k])
                                         for ah in (self.h - 2 * self.dy[k], self.h + 2 * self.dy[k])]).amax(dim=0))
        self.ceiling = torch.stack(ceilings)

    def shapes(self, m: Tensor, g: Tensor, r: Tensor) -> Tensor:
        """``[C, A, 2]`` normalized ``(w, h)`` of a level's default boxes for ``C`` candidates: log min sizes ``m``
        ``[C]``, log max/min ratios ``g`` ``[C]``, log aspect ratios ``r`` ``[C, n]`` (as ``default_boxes`` does:
        a ratio's box is ``sqrt(r)`` times wider than high in pixels, its transpose follows)."""
        root, grow = (r / 2).exp(), (g / 2).exp()[:, None]
        sx, sy = (m.exp() / self.width)[:, None], (m.exp() / self.height)[:, None]
        w = torch.cat([sx, sx * grow, sx * root, sx / root], dim=1)
        h = torch.cat([sy, sy * grow, sy / root, sy * root], dim=1)
        wh = torch.stack([w, h], dim=-1).float()
        return wh.clamp(max=1.0) if self.clip else wh

    def level(self, k: int, wh: Tensor, index: Tensor | None = None) -> Tensor:
        """Best IoU ``[C, n]`` of the boxes ``index`` (default: all) with level ``k``'s default boxes ``wh``."""
        w, h, dx, dy = (t if index is None else t[index] for t in (self.w, self.h, self.dx[k], self.dy[k]))
        return _offset_iou(w[None, :, None], h[None, :, None], dx[None, :, None], dy[None, :, None],
                           wh[:, None, :, 0], wh[:, None, :, 1]).amax(dim=2)


# ---------------------------------------------------------------------------------------------------- search
_GRID = 12
_LOCAL_STEPS = (-0.05, -0.015, 0.015, 0.05)
_JIGGLES = 32
"""Joint random moves of all of a level's values tried per level and sweep (escape coordinate-wise optima)."""
_MIN_GAIN_IOU = 1e-4
"""A sweep that covers no more boxes and raises the mean best IoU by less than this ends a descent."""


class _Search:
    """Coordinate descent on a :class:`_Layout`, with the per-level best IoUs ``levels`` ``[L, N]`` kept current.

    Scores: boxes covered, plus the mean best IoU (in ``[0, 1)``) as the tie-break, rounded so that summation order
    (thread count) cannot change a comparison.
    """

    def __init__(self, scorer: _Scorer, bounds: _Bounds, layout: _Layout):
        self.scorer, self.bounds, self.layout = scorer, bounds, layout.copy()
        self.levels = torch.cat([scorer.level(k, scorer.shapes(*self.params(k))) for k in range(len(layout.m))])
        best = self.levels.amax(dim=0)
        self.key = self._keys((best >= scorer.threshold).sum()[None], best.sum(dtype=torch.float64)[None])[0]

    def params(self, k: int, count: int = 1) -> tuple[Tensor, Tensor, Tensor]:
        """Level ``k``'s ``(m [count], g [count], r [count, n])`` (float64)."""
        m, g = (torch.full((count,), v[k], dtype=torch.float64) for v in (self.layout.m, self.layout.g))
        return m, g, torch.tensor(self.layout.r[k], dtype=torch.float64).reshape(1, -1).repeat(count, 1)

    def _keys(self, covered: Tensor, iou_sum: Tensor) -> Tensor:
        return covered.double() + (iou_sum / self.scorer.count * 1e9).round() / 1e9 * 0.999

    def offer(self, k: int, m: Tensor, g: Tensor, r: Tensor) -> bool:
        """Score ``C`` candidate values of level ``k``; take the best if it beats the current score."""
        others = torch.cat([self.levels[:k], self.levels[k + 1:]]).amax(dim=0) if len(self.levels) > 1 else \
            torch.zeros_like(self.levels[0])
        moving = self.scorer.ceiling[k] + 1e-6 > others
        still, index = others[~moving], moving.nonzero()[:, 0]
        total = torch.maximum(self.scorer.level(k, self.scorer.shapes(m, g, r), index), others[index])
        keys = self._keys((still >= self.scorer.threshold).sum() + (total >= self.scorer.threshold).sum(dim=1),
                          still.sum(dtype=torch.float64) + total.sum(dim=1, dtype=torch.float64))
        best = int(keys.argmax())
        if float(keys[best]) <= float(self.key):
            return False
        self.layout.m[k], self.layout.g[k], self.layout.r[k] = float(m[best]), float(g[best]), r[best].tolist()
        chosen = slice(best, best + 1)
        self.levels[k] = self.scorer.level(k, self.scorer.shapes(m[chosen], g[chosen], r[chosen]))[0]
        self.key = keys[best]
        return True

    def line(self, coord: tuple) -> bool:
        """One coordinate: a grid over its feasible interval and small steps around its value."""
        lo, hi = self.bounds.interval(self.layout, coord)
        if lo > hi:
            return False
        values = torch.cat([torch.linspace(lo, hi, _GRID, dtype=torch.float64),
                            self.layout.get(coord) + torch.tensor(_LOCAL_STEPS, dtype=torch.float64)]).clamp(lo, hi)
        m, g, r = self.params(coord[1], len(values))
        if coord[0] == "m":
            m = values
        elif coord[0] == "g":
            g = values
        else:
            r[:, coord[2]] = values
        return self.offer(coord[1], m, g, r)

    def jiggle(self, k: int, generator: torch.Generator, scale: float = 0.1) -> bool:
        """Joint Gaussian moves of all of level ``k``'s values (log space), projected into their limits."""
        m, g, r = self.params(k, _JIGGLES)
        noise = torch.randn(_JIGGLES, 2 + r.shape[1], generator=generator, dtype=torch.float64) * scale
        m = (m + noise[:, 0]).clamp(*self.bounds.interval(self.layout, ("m", k)))
        g = (g + noise[:, 1]).clamp(*self.bounds.max_size[k])
        moved = (r + noise[:, 2:]).sort(dim=1).values.clamp(*self.bounds.aspect)
        spaced = (moved.diff(dim=1) >= self.bounds.spacing - 1e-12).all(dim=1, keepdim=True)
        return self.offer(k, m, g, torch.where(spaced, moved, r))

    def refit_level(self, k: int, generator: torch.Generator) -> _Search:
        """One pass over level ``k``'s values alone."""
        for coord in self.layout.coords():
            if coord[1] == k:
                self.line(coord)
        self.jiggle(k, generator)
        return self

    def run(self, max_sweeps: int, generator: torch.Generator) -> _Search:
        """Sweeps (every coordinate, then a jiggle of every level) until one gains no box and under
        :data:`_MIN_GAIN_IOU` of mean best IoU."""
        for _ in range(max_sweeps):
            start = float(self.key)
            for coord in self.layout.coords():
                self.line(coord)
            for k in range(len(self.layout.m)):
                self.jiggle(k, generator)
            if float(self.key) - start < _MIN_GAIN_IOU:
                break
        return self


def _perturbed(layout: _Layout, bounds: _Bounds, generator: torch.Generator, scale: float) -> _Layout:
    """A feasible random start: each coordinate in turn moved by up to ``scale`` (log) inside its interval."""
    out = layout.copy()
    for coord in out.coords():
        lo, hi = bounds.interval(out, coord)
        step = scale * (2 * float(torch.rand((), generator=generator, dtype=torch.float64)) - 1)
        if lo <= hi:
            out.set(coord, min(max(out.get(coord) + step, lo), hi))
    return out


def _free_search(search: _Search, ratio_cost: float, max_sweeps: int, generator: torch.Generator) -> _Layout:
    """Greedy changes of the aspect-ratio sets: add one ratio to a level or remove one, whichever most raises
    ``coverage - ratio_cost * (ratios beyond the level's original number)``, minus a tie-breaking hair per ratio,
    until none does: a ratio beyond the original ones must cover ``ratio_cost`` more of the boxes, one is removed
    only if that loses no box. A change is judged after re-fitting its level alone; the accepted one is followed by
    a sweep of every level."""
    scorer, bounds = search.scorer, search.bounds
    original = [len(r) for r in search.layout.r]

    def value(s: _Search) -> float:
        counts = [len(r) for r in s.layout.r]
        extra = sum(max(0, n - n0) for n, n0 in zip(counts, original))
        return math.floor(float(s.key)) / scorer.count - ratio_cost * extra - 1e-9 * sum(counts)

    while True:
        tried = []
        for k, ratios in enumerate(search.layout.r):
            options = [[r for i, r in enumerate(ratios) if i != j] for j in range(len(ratios))]
            if len(ratios) < bounds.max_aspect_ratios:  # a new ratio enters at either end, then moves
                options += [sorted([*ratios, r]) for r in bounds.aspect if all(abs(r - x) >= bounds.spacing
                                                                                for x in ratios)]
            for option in options:
                layout = search.layout.copy()
                layout.r[k] = option
                tried.append(_Search(scorer, bounds, layout).refit_level(k, generator))
        best = max(tried, key=value, default=None)
        if best is None or value(best) <= value(search) + 1e-12:
            return search.run(max_sweeps, generator).layout
        search = best.run(1, generator)


# ------------------------------------------------------------------------------------------------------ fit
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
        rows = [[k, "x".join(map(str, _pair(f, "feature map"))), "x".join(f"{v:g}" for v in dict.fromkeys(
                    _pair(step, "step"))), f"{old.min_sizes[k]:g} -> {new.min_sizes[k]:g}",
                 f"{old.max_sizes[k]:g} -> {new.max_sizes[k]:g}",
                 f"{_ratios(old.aspect_ratios[k])} -> {_ratios(new.aspect_ratios[k])}",
                 f"{2 + 2 * len(old.aspect_ratios[k])} -> {2 + 2 * len(new.aspect_ratios[k])}"]
                for k, (f, step) in enumerate(zip(old.feature_maps, old.steps))]
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
               seed: int = 0, iou_threshold: float = 0.5, min_gain: float = 0.005, rules: FitRules = FitRules(),
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
        rules: the limits of :class:`FitRules`.
        restarts: descents run (the first from ``base``, the others from seeded random perturbations of it).
        max_boxes: the search scores a seeded sample of this many boxes (``before``/``after`` use all of them).
    """
    start = time.perf_counter()
    boxes = _usable(boxes)
    image_size = compact_size(image_size)
    generator = torch.Generator().manual_seed(seed)
    sample = boxes if len(boxes) <= max_boxes else boxes[torch.randperm(len(boxes), generator=generator)[:max_boxes]]
    scorer = _Scorer(sample, base, image_size, iou_threshold)
    bounds = _Bounds(rules, base, image_size)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # many small tensor operations: 7x faster on one thread on a busy 2-core machine
    try:
        origin, best = _Layout.of(base), None
        for attempt in range(max(1, restarts)):
            begin = origin if attempt == 0 else _perturbed(origin, bounds, generator, 0.5)
            search = _Search(scorer, bounds, begin).run(max_sweeps, generator)
            if best is None or float(search.key) > float(best.key):
                best = search
        layout = _free_search(best, min_gain, max_sweeps, generator) if free else best.layout
    finally:
        torch.set_num_threads(threads)
    fitted = layout.to_priors(base)
    before = coverage(boxes, base.boxes(image_size), iou_threshold)
    after = coverage(boxes, fitted.boxes(image_size), iou_threshold)
    changed = after["covered"] - before["covered"] >= min_gain
    full = scorer if sample is boxes else _Scorer(boxes, base, image_size, iou_threshold)
    ceiling = float((full.ceiling.amax(dim=0) >= iou_threshold).double().mean())
    return FitResult(fitted if changed else base, before, after, changed, base, fitted, image_size, free, min_gain,
                     ceiling, time.perf_counter() - start)


def _usable(boxes: Tensor) -> Tensor:
    """The boxes ``[N, 4]`` clipped to the image, without non-finite ones and ones with no area inside it."""
    boxes = torch.as_tensor(boxes, dtype=torch.float64)
    if boxes.ndim != 2 or boxes.shape[-1] != 4:
        raise ValueError(f"boxes must be [N, 4] xyxy normalized to the image, got shape {list(boxes.shape)}")
    boxes = boxes[torch.isfinite(boxes).all(dim=1)].clamp(0, 1)
    boxes = boxes[(boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])]
    if not len(boxes):
        raise ValueError("no boxes to fit default boxes to (every box is empty, not finite or outside the image)")
    return boxes

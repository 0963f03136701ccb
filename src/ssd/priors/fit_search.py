"""Scoring and search of the default-box fit (see :mod:`ssd.priors.fit`): :class:`Scorer` gives the best IoU of
every box with each level's candidate default boxes, :class:`Search` runs the coordinate descent,
:func:`free_search` changes the aspect-ratio sets."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ssd.priors.config import PriorConfig
from ssd.priors.fit_rules import Bounds, Layout
from ssd.sizes import as_hw

__all__ = ["Scorer", "Search", "free_search", "perturbed"]


def _offset_iou(w: Tensor, h: Tensor, dx: Tensor, dy: Tensor, aw: Tensor, ah: Tensor) -> Tensor:
    """IoU of boxes of sizes ``(w, h)`` and ``(aw, ah)`` whose centres are ``(dx, dy)`` apart (broadcast)."""
    ix = torch.minimum(torch.minimum(w, aw), (w + aw) / 2 - dx).clamp_(min=0)
    iy = torch.minimum(torch.minimum(h, ah), (h + ah) / 2 - dy).clamp_(min=0)
    inter = ix * iy
    return inter / (w * h + aw * ah - inter)


class Scorer:
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
        for (rows, cols), (step_y, step_x) in base.grids():
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


_GRID = 12
_LOCAL_STEPS = (-0.05, -0.015, 0.015, 0.05)
_JIGGLES = 32
"""Joint random moves of all of a level's values tried per level and sweep (escape coordinate-wise optima)."""
_MIN_GAIN_IOU = 1e-4
"""A sweep that covers no more boxes and raises the mean best IoU by less than this ends a descent."""


class Search:
    """Coordinate descent on a :class:`Layout`, with the per-level best IoUs ``levels`` ``[L, N]`` kept current.

    Scores: boxes covered, plus the mean best IoU (in ``[0, 1)``) as the tie-break, rounded so that summation order
    (thread count) cannot change a comparison.
    """

    def __init__(self, scorer: Scorer, bounds: Bounds, layout: Layout):
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

    def refit_level(self, k: int, generator: torch.Generator) -> Search:
        """One pass over level ``k``'s values alone."""
        for coord in self.layout.coords():
            if coord[1] == k:
                self.line(coord)
        self.jiggle(k, generator)
        return self

    def run(self, max_sweeps: int, generator: torch.Generator) -> Search:
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


def perturbed(layout: Layout, bounds: Bounds, generator: torch.Generator, scale: float) -> Layout:
    """A feasible random start: each coordinate in turn moved by up to ``scale`` (log) inside its interval."""
    out = layout.copy()
    for coord in out.coords():
        lo, hi = bounds.interval(out, coord)
        step = scale * (2 * float(torch.rand((), generator=generator, dtype=torch.float64)) - 1)
        if lo <= hi:
            out.set(coord, min(max(out.get(coord) + step, lo), hi))
    return out


def free_search(search: Search, ratio_cost: float, max_sweeps: int, generator: torch.Generator) -> Layout:
    """Greedy changes of the aspect-ratio sets: add one ratio to a level or remove one, whichever most raises
    ``coverage - ratio_cost * (ratios beyond the level's original number)``, minus a tie-breaking hair per ratio,
    until none does: a ratio beyond the original ones must cover ``ratio_cost`` more of the boxes, one is removed
    only if that loses no box. A change is judged after re-fitting its level alone; the accepted one is followed by
    a sweep of every level."""
    scorer, bounds = search.scorer, search.bounds
    original = [len(r) for r in search.layout.r]

    def value(s: Search) -> float:
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
                tried.append(Search(scorer, bounds, layout).refit_level(k, generator))
        best = max(tried, key=value, default=None)
        if best is None or value(best) <= value(search) + 1e-12:
            return search.run(max_sweeps, generator).layout
        search = best.run(1, generator)

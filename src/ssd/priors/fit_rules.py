"""The limits of a default-box fit (:class:`FitRules`: what each level of the network can see) and the fit's
coordinates: :class:`Layout` (a configuration in log space) and :class:`Bounds` (the rules in log space)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ssd.priors.config import PriorConfig
from ssd.sizes import as_hw

__all__ = ["Bounds", "FitRules", "Layout"]


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
class Layout:
    """A configuration in log space: per level ``log min_size``, ``log(max_size / min_size)``, log aspect ratios."""

    m: list[float]
    g: list[float]
    r: list[list[float]]

    @classmethod
    def of(cls, priors: PriorConfig) -> Layout:
        return cls([math.log(s) for s in priors.min_sizes],
                   [math.log(b / a) for a, b in zip(priors.min_sizes, priors.max_sizes)],
                   [sorted(math.log(r) for r in ratios) for ratios in priors.aspect_ratios])

    def copy(self) -> Layout:
        return Layout(list(self.m), list(self.g), [list(r) for r in self.r])

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


def _cell(step_y: float, step_x: float) -> float:
    """A level's step as one length: ``step``, or ``sqrt(step_y * step_x)`` for a ``(step_y, step_x)`` pair."""
    return step_y if step_y == step_x else math.sqrt(step_y * step_x)


class Bounds:
    """:class:`FitRules` in log space for one base configuration, widened to include it."""

    def __init__(self, rules: FitRules, base: PriorConfig, image_size: int | tuple[int, int]):
        layout, log, longest = Layout.of(base), math.log, max(as_hw(image_size))
        steps = [_cell(*step) for _, step in base.grids()]
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

    def interval(self, layout: Layout, coord: tuple) -> tuple[float, float]:
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

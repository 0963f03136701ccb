"""Default boxes (priors) of SSD, in the order of the original implementation.

The input is ``height x width`` pixels (an int ``image_size`` is the square ``S x S``). For each feature map ``k``
of ``rows x cols`` cells, each row ``i`` and each column ``j`` the boxes are centred at
``((j + 0.5) * step_x / width, (i + 0.5) * step_y / height)``; a box size ``s`` in pixels is ``s / width`` wide and
``s / height`` high (normalized), so the boxes are square in pixels and aspect ratios apply in pixels. With
``min_sizes[k] = m`` and ``max_sizes[k] = M`` the boxes are: the ``m x m`` square, the ``sqrt(m M) x sqrt(m M)``
square, then for each ratio ``r`` of ``aspect_ratios[k]`` the ``m sqrt(r) x m / sqrt(r)`` box and its transpose
(sizes as width x height in pixels). A square input with square maps and scalar steps is computed exactly as the
original SSD does (bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

from ssd._utils import as_hw

__all__ = ["default_boxes", "PriorConfig", "PRIOR_CONFIGS", "as_hw"]

PRIOR_CONFIGS: dict[str, dict] = {
    "ssd300": {
        "image_size": 300,
        "feature_maps": [38, 19, 10, 5, 3, 1],
        "steps": [8, 16, 32, 64, 100, 300],
        "min_sizes": [30, 60, 111, 162, 213, 264],
        "max_sizes": [60, 111, 162, 213, 264, 315],
        "aspect_ratios": [[2], [2, 3], [2, 3], [2, 3], [2], [2]],
    },
    "ssd512": {
        "image_size": 512,
        "feature_maps": [64, 32, 16, 8, 4, 2, 1],
        "steps": [8, 16, 32, 64, 128, 256, 512],
        "min_sizes": [35.84, 76.8, 153.6, 230.4, 307.2, 384.0, 460.8],
        "max_sizes": [76.8, 153.6, 230.4, 307.2, 384.0, 460.8, 537.65],
        "aspect_ratios": [[2], [2, 3], [2, 3], [2, 3], [2, 3], [2], [2]],
    },
}
"""Named keyword sets for :func:`default_boxes`: SSD300 gives 8732 boxes, SSD512 gives 24564."""


@dataclass(frozen=True)
class PriorConfig:
    """The :func:`default_boxes` arguments besides ``image_size`` (sizes and steps in pixels of the input).

    A ``feature_maps`` entry is an int (square map) or ``(rows, cols)``; a ``steps`` entry a number or
    ``(step_y, step_x)``; a pair with equal values is stored as the single value, so square configurations compare
    equal whatever form they were given in. Lists become tuples, so a configuration is immutable and comparable;
    :meth:`to_dict` gives plain lists (checkpoints, YAML) and :meth:`from_dict` reads them back.
    """

    feature_maps: tuple[int | tuple[int, int], ...]
    steps: tuple[float | tuple[float, float], ...]
    min_sizes: tuple[float, ...]
    max_sizes: tuple[float, ...]
    aspect_ratios: tuple[tuple[float, ...], ...]
    clip: bool | str = True

    def __post_init__(self) -> None:
        for name in ("feature_maps", "steps"):
            values = tuple(_compact(v, f"{name}[{k}]") for k, v in enumerate(getattr(self, name)))
            object.__setattr__(self, name, values)
        for name in ("min_sizes", "max_sizes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "aspect_ratios", tuple(tuple(r) for r in self.aspect_ratios))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PriorConfig:
        """From :meth:`to_dict`'s keys (an ``image_size`` key, as in :data:`PRIOR_CONFIGS`, is ignored)."""
        return cls(**{k: v for k, v in values.items() if k != "image_size"})

    def to_dict(self) -> dict[str, Any]:
        return {k: _lists(v) for k, v in asdict(self).items()}

    def boxes(self, image_size: int | tuple[int, int]) -> Tensor:
        """:func:`default_boxes` of this configuration at ``image_size`` (an int or ``(height, width)``)."""
        return default_boxes(image_size, self.feature_maps, self.steps, self.min_sizes, self.max_sizes,
                             self.aspect_ratios, self.clip)


def default_boxes(
    image_size: int | Sequence[int],
    feature_maps: Sequence[int | Sequence[int]],
    steps: Sequence[float | Sequence[float]],
    min_sizes: Sequence[float],
    max_sizes: Sequence[float],
    aspect_ratios: Sequence[Sequence[float]],
    clip: bool | str = True,
) -> Tensor:
    """Default boxes of an ``image_size`` input, ``[P, 4]`` float32 ``(cx, cy, w, h)`` normalized per axis.

    ``image_size`` is an int (square) or ``(height, width)``; a ``feature_maps`` entry an int (square map) or
    ``(rows, cols)``; a ``steps`` entry a number or ``(step_y, step_x)``. All sizes and steps are in pixels of the
    input. ``P = sum(rows * cols * (2 + 2 * len(ratios)))`` over the maps, ordered level, row, column, box.
    With ``clip=True`` each of ``cx, cy, w, h`` is clamped to ``[0, 1]`` (as the original SSD does; the corners are
    not clipped); ``clip="size"`` clamps only ``w, h`` (torchvision's ``DefaultBoxGenerator``, whose centres may
    pass 1 when a step does not divide the image). Computed in float64 and rounded once to float32.
    """
    height, width = as_hw(image_size)
    lengths = {len(feature_maps), len(steps), len(min_sizes), len(max_sizes), len(aspect_ratios)}
    if len(lengths) != 1:
        raise ValueError(
            "feature_maps, steps, min_sizes, max_sizes and aspect_ratios must have the same length, got "
            f"{len(feature_maps)}, {len(steps)}, {len(min_sizes)}, {len(max_sizes)}, {len(aspect_ratios)}"
        )
    per_map = []
    for k, (f, step, min_size, max_size, ratios) in enumerate(zip(feature_maps, steps, min_sizes, max_sizes,
                                                                   aspect_ratios)):
        (rows, cols), (step_y, step_x) = _pair(f, f"feature_maps[{k}]"), _pair(step, f"steps[{k}]")
        # the same float operations per axis as the square original (bit-identical when width == height)
        sx, sy = min_size / width, min_size / height
        sx_prime, sy_prime = math.sqrt(sx * (max_size / width)), math.sqrt(sy * (max_size / height))
        sizes = [(sx, sy), (sx_prime, sy_prime)]
        for r in ratios:
            sizes += [(sx * math.sqrt(r), sy / math.sqrt(r)), (sx / math.sqrt(r), sy * math.sqrt(r))]
        wh = torch.tensor(sizes, dtype=torch.float64)  # [A, 2]
        # (j + 0.5) * step / size, written as the original implementation does for bit-identical float32
        centres_x = (torch.arange(cols, dtype=torch.float64) + 0.5) / (width / step_x)
        centres_y = (torch.arange(rows, dtype=torch.float64) + 0.5) / (height / step_y)
        cy, cx = torch.meshgrid(centres_y, centres_x, indexing="ij")  # row i, column j
        xy = torch.stack((cx, cy), dim=-1).reshape(-1, 1, 2).expand(-1, len(sizes), 2)  # [rows*cols, A, 2]
        per_map.append(torch.cat((xy, wh.expand_as(xy)), dim=-1).reshape(-1, 4))
    boxes = torch.cat(per_map)
    if clip not in (True, False, "size"):
        raise ValueError(f"clip must be True, False or 'size', got {clip!r}")
    if clip == "size":
        boxes[:, 2:] = boxes[:, 2:].clamp(0.0, 1.0)
    elif clip:
        boxes = boxes.clamp(0.0, 1.0)
    return boxes.to(torch.float32)


def _pair(value: Any, name: str) -> tuple[Any, Any]:
    """``(y, x)`` of a per-axis setting given as one number (both axes) or a ``(y, x)`` pair."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise ValueError(f"{name} = {list(value)!r} must be one number or a (y, x) pair (rows, cols for a "
                             "feature map; step_y, step_x for a step)")
        return value[0], value[1]
    return value, value


def _compact(value: Any, name: str) -> Any:
    """A per-axis setting as stored in :class:`PriorConfig`: the single value when both axes agree."""
    y, x = _pair(value, name)
    return y if y == x else (y, x)


def _lists(value: Any) -> Any:
    """Tuples (nested too) as lists, for YAML and checkpoints."""
    return [_lists(v) for v in value] if isinstance(value, (tuple, list)) else value

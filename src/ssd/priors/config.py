"""Default boxes (priors) of SSD: :class:`PriorConfig` (validated, immutable), the presets and the one rescaling rule.

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

from ssd.errors import PriorConfigError
from ssd.limits import MAX_INPUT_SIDE, MAX_PRIORS, MAX_VALUE_CHARS, is_real, is_whole
from ssd.sizes import as_hw, input_size

__all__ = ["PRIOR_CONFIGS", "PriorConfig", "default_boxes"]


@dataclass(frozen=True)
class PriorConfig:
    """The default boxes of a network, in pixels of its input (the size is the model's, not stored here).

    A ``feature_maps`` entry is an int (square map) or ``(rows, cols)``; a ``steps`` entry a number or
    ``(step_y, step_x)``; a pair with equal values is stored as the single value, so square configurations compare
    equal whatever form they were given in. Lists become tuples, so a configuration is immutable and comparable;
    :meth:`to_dict` gives plain lists (checkpoints, YAML) and :meth:`from_dict` reads them back. Construction
    checks every value (:class:`PriorConfigError`): one entry per level in every field, feature maps of positive
    ints up to :data:`ssd.limits.MAX_INPUT_SIDE` cells a side, finite positive steps, sizes and aspect ratios,
    ``clip`` one of ``True``, ``False``, ``"size"``, at most :data:`ssd.limits.MAX_PRIORS` boxes.
    """

    feature_maps: tuple[int | tuple[int, int], ...]
    steps: tuple[float | tuple[float, float], ...]
    min_sizes: tuple[float, ...]
    max_sizes: tuple[float, ...]
    aspect_ratios: tuple[tuple[float, ...], ...]
    clip: bool | str = True

    def __post_init__(self) -> None:
        for name in ("feature_maps", "steps", "min_sizes", "max_sizes", "aspect_ratios"):
            if isinstance(getattr(self, name), (str, bytes)) or not isinstance(getattr(self, name), Sequence):
                raise PriorConfigError(f"{name} = {_shown(getattr(self, name))} must be a list with one entry per "
                                       "feature map")
        lengths = [len(getattr(self, n)) for n in ("feature_maps", "steps", "min_sizes", "max_sizes", "aspect_ratios")]
        if len(set(lengths)) != 1 or not lengths[0]:
            raise PriorConfigError("feature_maps, steps, min_sizes, max_sizes and aspect_ratios must have the same "
                                   "length (one entry per feature map, at least one), got "
                                   + ", ".join(map(str, lengths)))
        maps = tuple(_compact(_checked(v, f"feature_maps[{k}]", _is_cell_count, "cell counts must be ints from 1 to "
                                       f"{MAX_INPUT_SIDE} (ssd.limits.MAX_INPUT_SIDE)"), f"feature_maps[{k}]")
                     for k, v in enumerate(self.feature_maps))
        positive = "must be finite numbers > 0"
        steps = tuple(_compact(_checked(v, f"steps[{k}]", _is_positive, positive), f"steps[{k}]")
                      for k, v in enumerate(self.steps))
        object.__setattr__(self, "feature_maps", maps)
        object.__setattr__(self, "steps", steps)
        for name in ("min_sizes", "max_sizes"):
            values = tuple(getattr(self, name))
            for k, v in enumerate(values):
                if not _is_positive(v):
                    raise PriorConfigError(f"{name}[{k}] = {_shown(v)}: box sizes {positive} (pixels of the input)")
            object.__setattr__(self, name, values)
        ratios = []
        for k, rs in enumerate(self.aspect_ratios):
            if isinstance(rs, (str, bytes)) or not isinstance(rs, Sequence) or not all(map(_is_positive, rs)):
                raise PriorConfigError(f"aspect_ratios[{k}] = {_shown(rs)}: a level's aspect ratios are a list; "
                                       f"they {positive} (each gives an r:1 and a 1:r box)")
            ratios.append(tuple(rs))
        object.__setattr__(self, "aspect_ratios", tuple(ratios))
        if not (isinstance(self.clip, bool) or self.clip == "size"):
            raise PriorConfigError(f"clip must be True, False or 'size', got {_shown(self.clip)}")
        if self.count() > MAX_PRIORS:
            raise PriorConfigError(f"these default boxes number {self.count():,} (feature maps "
                                   f"{_shown(list(maps))}), more than the {MAX_PRIORS:,} of ssd.limits.MAX_PRIORS")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PriorConfig:
        """From :meth:`to_dict`'s keys; anything else (a missing or unknown key) raises :class:`PriorConfigError`."""
        if not isinstance(values, Mapping):
            raise PriorConfigError(f"a prior configuration is a mapping of {', '.join(_FIELDS)}, got "
                                   f"{type(values).__name__}")
        unknown, missing = sorted(set(values) - set(_FIELDS)), [f for f in _FIELDS[:-1] if f not in values]
        if unknown or missing:
            raise PriorConfigError(f"a prior configuration has the keys {', '.join(_FIELDS)} (clip optional); "
                                   + "; ".join(([f"unknown: {', '.join(map(str, unknown))}"] if unknown else [])
                                               + ([f"missing: {', '.join(missing)}"] if missing else [])))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {k: _lists(v) for k, v in asdict(self).items()}

    def grids(self) -> list[tuple[tuple[int, int], tuple[float, float]]]:
        """Per level ``((rows, cols), (step_y, step_x))``: the grid of default-box centres."""
        return [(_pair(f, ""), _pair(s, "")) for f, s in zip(self.feature_maps, self.steps)]

    def count(self) -> int:
        """Number of default boxes ``P`` (the same at every input size with these feature maps)."""
        return sum(rows * cols * (2 + 2 * len(rs)) for ((rows, cols), _), rs in zip(self.grids(), self.aspect_ratios))

    def scaled_to(self, source_size: int | Sequence[int] | str, image_size: int | Sequence[int] | str,
                  feature_maps: Sequence[int | Sequence[int]], steps: Sequence[Any] | None = None) -> PriorConfig:
        """These boxes, in pixels of ``source_size``, for an ``image_size`` input whose network has ``feature_maps``.

        Box sizes scale by ``sqrt(height * width)`` over that of ``source_size``: the square of the same pixel
        count keeps every box size in pixels, which is what the network's strides and receptive fields (fixed in
        pixels) call for; a square input scales by ``side / side`` (exact). Aspect ratios and ``clip`` stay.
        ``steps`` default to ``height / rows`` and ``width / cols`` per level (centres spread evenly over each
        map). The same sizes and maps give ``self`` unchanged.
        """
        (height, width), (h0, w0) = as_hw(input_size(image_size)), as_hw(input_size(source_size))
        maps = [_pair(f, f"feature_maps[{k}]") for k, f in enumerate(feature_maps)]
        if (height, width) == (h0, w0) and tuple(_compact(f, "") for f in maps) == self.feature_maps and steps is None:
            return self
        scale = math.sqrt(height * width) / math.sqrt(h0 * w0)
        return PriorConfig(feature_maps=[tuple(f) for f in maps],
                           steps=[(height / rows, width / cols) for rows, cols in maps] if steps is None else steps,
                           min_sizes=[s * scale for s in self.min_sizes], max_sizes=[s * scale for s in self.max_sizes],
                           aspect_ratios=self.aspect_ratios, clip=self.clip)

    def boxes(self, image_size: int | Sequence[int] | str) -> Tensor:
        """Default boxes of an ``image_size`` input, ``[P, 4]`` float32 ``(cx, cy, w, h)`` normalized per axis.

        ``P = sum(rows * cols * (2 + 2 * len(ratios)))`` over the maps, ordered level, row, column, box. With
        ``clip=True`` each of ``cx, cy, w, h`` is clamped to ``[0, 1]`` (as the original SSD does; the corners are
        not clipped); ``clip="size"`` clamps only ``w, h`` (torchvision's ``DefaultBoxGenerator``, whose centres may
        pass 1 when a step does not divide the image). Computed in float64 and rounded once to float32.
        """
        height, width = as_hw(input_size(image_size))
        per_map = []
        for ((rows, cols), (step_y, step_x)), min_size, max_size, ratios in zip(self.grids(), self.min_sizes,
                                                                                self.max_sizes, self.aspect_ratios):
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
        if self.clip == "size":
            boxes[:, 2:] = boxes[:, 2:].clamp(0.0, 1.0)
        elif self.clip:
            boxes = boxes.clamp(0.0, 1.0)
        return boxes.to(torch.float32)


_FIELDS = ("feature_maps", "steps", "min_sizes", "max_sizes", "aspect_ratios", "clip")

def default_boxes(image_size: int | Sequence[int] | str, feature_maps: Sequence[int | Sequence[int]],
                  steps: Sequence[float | Sequence[float]], min_sizes: Sequence[float], max_sizes: Sequence[float],
                  aspect_ratios: Sequence[Sequence[float]], clip: bool | str = True) -> Tensor:
    """``[P, 4]`` default boxes of an ``image_size`` input: :meth:`PriorConfig.boxes` of these fields."""
    return PriorConfig(feature_maps, steps, min_sizes, max_sizes, aspect_ratios, clip).boxes(image_size)


def _is_positive(value: Any) -> bool:
    return is_real(value, any_real=True) and 0 < value < math.inf


def _is_cell_count(value: Any) -> bool:
    return is_whole(value, integral=True) and 1 <= value <= MAX_INPUT_SIDE


def _checked(value: Any, name: str, valid: Any, rule: str) -> Any:
    """``value`` (one number or a ``(y, x)`` pair) if both axes pass ``valid``, else :class:`PriorConfigError`."""
    if not all(valid(v) for v in _pair(value, name)):
        raise PriorConfigError(f"{name} = {_shown(value)}: {rule}")
    return value


def _pair(value: Any, name: str) -> tuple[Any, Any]:
    """``(y, x)`` of a per-axis setting given as one number (both axes) or a ``(y, x)`` pair."""
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != 2:
            raise PriorConfigError(f"{name} = {_shown(list(value))} must be one number or a (y, x) pair (rows, cols "
                                   "for a feature map; step_y, step_x for a step)")
        return value[0], value[1]
    return value, value


def _compact(value: Any, name: str) -> Any:
    """A per-axis setting as stored in :class:`PriorConfig`: the single value when both axes agree."""
    y, x = _pair(value, name)
    return y if y == x else (y, x)


def _lists(value: Any) -> Any:
    """Tuples (nested too) as lists, for YAML and checkpoints."""
    return [_lists(v) for v in value] if isinstance(value, (tuple, list)) else value


def _shown(value: Any) -> str:
    """``repr(value)`` cut to :data:`ssd.limits.MAX_VALUE_CHARS` (an edited file may hold a huge value)."""
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= MAX_VALUE_CHARS else text[:MAX_VALUE_CHARS - 3] + "..."


PRIOR_CONFIGS: dict[str, PriorConfig] = {
    "ssd300": PriorConfig(feature_maps=[38, 19, 10, 5, 3, 1], steps=[8, 16, 32, 64, 100, 300],
                          min_sizes=[30, 60, 111, 162, 213, 264], max_sizes=[60, 111, 162, 213, 264, 315],
                          aspect_ratios=[[2], [2, 3], [2, 3], [2, 3], [2], [2]]),
    "ssd512": PriorConfig(feature_maps=[64, 32, 16, 8, 4, 2, 1], steps=[8, 16, 32, 64, 128, 256, 512],
                          min_sizes=[35.84, 76.8, 153.6, 230.4, 307.2, 384.0, 460.8],
                          max_sizes=[76.8, 153.6, 230.4, 307.2, 384.0, 460.8, 537.65],
                          aspect_ratios=[[2], [2, 3], [2, 3], [2, 3], [2, 3], [2], [2]]),
}
"""The paper's default boxes, named by their input: ``"ssd300"`` in pixels of 300 x 300 (8732 boxes),
``"ssd512"`` of 512 x 512 (24564 boxes)."""

"""Default boxes (priors) of SSD, in the order of the original implementation.

For each feature map ``k`` (size ``f``), each row ``i`` and each column ``j`` the boxes centred at
``((j + 0.5) * steps[k] / image_size, (i + 0.5) * steps[k] / image_size)`` are, with
``s = min_sizes[k] / image_size`` and ``s' = max_sizes[k] / image_size``:
the square ``(s, s)``, the square ``(sqrt(s * s'), sqrt(s * s'))``, then for each ratio ``r`` of
``aspect_ratios[k]`` the pair ``(s * sqrt(r), s / sqrt(r))`` and ``(s / sqrt(r), s * sqrt(r))``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["default_boxes", "PriorConfig", "PRIOR_CONFIGS"]

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

    Lists become tuples, so a configuration is immutable and comparable; :meth:`to_dict` gives plain lists
    (checkpoints, YAML) and :meth:`from_dict` reads them back.
    """

    feature_maps: tuple[int, ...]
    steps: tuple[float, ...]
    min_sizes: tuple[float, ...]
    max_sizes: tuple[float, ...]
    aspect_ratios: tuple[tuple[float, ...], ...]
    clip: bool | str = True

    def __post_init__(self) -> None:
        for name in ("feature_maps", "steps", "min_sizes", "max_sizes"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(self, "aspect_ratios", tuple(tuple(r) for r in self.aspect_ratios))

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> PriorConfig:
        """From :meth:`to_dict`'s keys (an ``image_size`` key, as in :data:`PRIOR_CONFIGS`, is ignored)."""
        return cls(**{k: v for k, v in values.items() if k != "image_size"})

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        return {k: [list(r) for r in v] if k == "aspect_ratios" else (list(v) if isinstance(v, tuple) else v)
                for k, v in values.items()}

    def boxes(self, image_size: int) -> Tensor:
        """:func:`default_boxes` of this configuration at ``image_size``."""
        return default_boxes(image_size, self.feature_maps, self.steps, self.min_sizes, self.max_sizes,
                             self.aspect_ratios, self.clip)


def default_boxes(
    image_size: int,
    feature_maps: Sequence[int],
    steps: Sequence[float],
    min_sizes: Sequence[float],
    max_sizes: Sequence[float],
    aspect_ratios: Sequence[Sequence[float]],
    clip: bool | str = True,
) -> Tensor:
    """Default boxes of a square ``image_size`` input, ``[P, 4]`` float32 ``(cx, cy, w, h)`` normalized.

    All sizes and steps are in pixels of the input. ``P = sum(f * f * (2 + 2 * len(ratios)))`` over the maps.
    With ``clip=True`` each of ``cx, cy, w, h`` is clamped to ``[0, 1]`` (as the original SSD does; the corners are
    not clipped); ``clip="size"`` clamps only ``w, h`` (torchvision's ``DefaultBoxGenerator``, whose centres may
    pass 1 when a step does not divide the image). Computed in float64 and rounded once to float32.
    """
    lengths = {len(feature_maps), len(steps), len(min_sizes), len(max_sizes), len(aspect_ratios)}
    if len(lengths) != 1:
        raise ValueError(
            "feature_maps, steps, min_sizes, max_sizes and aspect_ratios must have the same length, got "
            f"{len(feature_maps)}, {len(steps)}, {len(min_sizes)}, {len(max_sizes)}, {len(aspect_ratios)}"
        )
    per_map = []
    for f, step, min_size, max_size, ratios in zip(feature_maps, steps, min_sizes, max_sizes, aspect_ratios):
        s = min_size / image_size
        s_prime = math.sqrt(s * (max_size / image_size))
        sizes = [(s, s), (s_prime, s_prime)]
        for r in ratios:
            sizes += [(s * math.sqrt(r), s / math.sqrt(r)), (s / math.sqrt(r), s * math.sqrt(r))]
        wh = torch.tensor(sizes, dtype=torch.float64)  # [A, 2]
        # (j + 0.5) * step / image_size, written as the original implementation does for bit-identical float32
        centres = (torch.arange(f, dtype=torch.float64) + 0.5) / (image_size / step)
        cy, cx = torch.meshgrid(centres, centres, indexing="ij")  # row i, column j
        xy = torch.stack((cx, cy), dim=-1).reshape(-1, 1, 2).expand(-1, len(sizes), 2)  # [f*f, A, 2]
        per_map.append(torch.cat((xy, wh.expand_as(xy)), dim=-1).reshape(-1, 4))
    boxes = torch.cat(per_map)
    if clip not in (True, False, "size"):
        raise ValueError(f"clip must be True, False or 'size', got {clip!r}")
    if clip == "size":
        boxes[:, 2:] = boxes[:, 2:].clamp(0.0, 1.0)
    elif clip:
        boxes = boxes.clamp(0.0, 1.0)
    return boxes.to(torch.float32)

"""What a named model configuration provides to :func:`ssd.models.build_model`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ssd.models.ssd import LevelHead

__all__ = ["Architecture", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


@dataclass(frozen=True)
class Architecture:
    """A named SSD configuration.

    Attributes:
        backbone: ``(options, weights, source) -> module`` mapping ``[B, 3, S, S]`` to a list of feature maps;
            ``weights`` is a torchvision ImageNet state dict (or ``None``: random init) read from ``source``.
        head: ``(in_channels, boxes_per_location, num_outputs) -> LevelHead`` for one level.
        priors: :func:`ssd.priors.default_boxes` keyword arguments at the native ``image_size`` (included);
            other input sizes scale the box sizes with the image (see ``build.prior_config``).
        options: the architecture options ``build_model`` accepts, with their defaults.
        channels_last: recommended memory format (the trainer applies it; measured faster on CPU).
        imagenet_file: torchvision's file name of the backbone's ImageNet weights (``None``: no such weights).
        description: one line for ``list_models``.
    """

    backbone: Callable[[dict[str, Any], dict[str, Tensor] | None, str | None], nn.Module]
    head: Callable[[int, int, int], LevelHead]
    priors: dict[str, Any]
    description: str
    options: dict[str, Any] = field(default_factory=dict)
    channels_last: bool = True
    imagenet_file: str | None = None
    mean: list[float] = field(default_factory=lambda: list(IMAGENET_MEAN))
    std: list[float] = field(default_factory=lambda: list(IMAGENET_STD))

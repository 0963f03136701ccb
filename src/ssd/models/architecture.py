"""What a named model configuration provides to :func:`ssd.models.build_model`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from ssd.models.ssd import LevelHead
from ssd.priors import PriorConfig

__all__ = ["Architecture", "MultiScaleBackbone", "IMAGENET_MEAN", "IMAGENET_STD"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Architecture:
    """A named SSD configuration.

    Attributes:
        backbone: ``(options, weights, source) -> module`` mapping ``[B, 3, S, S]`` to a list of feature maps;
            ``weights`` is a torchvision ImageNet state dict (or ``None``: random init) read from ``source``.
        head: ``(in_channels, boxes_per_location, num_outputs) -> LevelHead`` for one level.
        image_size: the native input size.
        priors: the default boxes at ``image_size``; other input sizes scale the box sizes with the image
            (:meth:`ssd.priors.PriorConfig.scaled_to`).
        description: one line for ``list_models``.
        options: the architecture options ``build_model`` accepts, with their defaults.
        channels_last: recommended memory format (the trainer and ``predict`` apply it).
        imagenet_weights: the :func:`ssd.weights.hub.catalog` name of torchvision's ImageNet weights of the backbone,
            what ``backbone_weights="imagenet"`` reads (``None``: no such weights).
        mean, std: input normalization of images in ``[0, 1]``.
        weights_normalization: ``state -> (mean, std) | None``: the input normalization a backbone weights file
            was trained with when it is not ``mean`` / ``std`` (e.g. VGG16 files that take 0..255 pixels).
        train_defaults: ``TrainConfig`` fields this architecture trains best with when the user leaves them unset
            (e.g. ``optimizer``, ``lr``, ``weight_decay``); the rest come from the optimizer's defaults.
    """

    backbone: Callable[[dict[str, Any], dict[str, Tensor] | None, str | None], nn.Module]
    head: Callable[[int, int, int], LevelHead]
    image_size: int
    priors: PriorConfig
    description: str
    options: dict[str, Any] = field(default_factory=dict)
    channels_last: bool = True
    imagenet_weights: str | None = None
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    weights_normalization: Callable[[dict[str, Tensor]], tuple[tuple[float, ...], tuple[float, ...]] | None] | None \
        = None
    train_defaults: Mapping[str, Any] = field(default_factory=dict)


class MultiScaleBackbone(nn.Module):
    """A backbone whose feature levels are the outputs of ``stages`` then ``extras``, each fed the previous one.

    Subclasses set ``self.stages`` and ``self.extras`` (``nn.ModuleList`` / ``nn.Sequential``; either may be
    empty): ``[B, 3, S, S]`` -> one feature map per stage and extra block.
    """

    def forward(self, x: Tensor) -> list[Tensor]:
        outputs: list[Tensor] = []
        for stage in self.stages:
            x = stage(x)
            outputs.append(x)
        for block in self.extras:
            x = block(x)
            outputs.append(x)
        return outputs

"""``ssd_tiny``: a small plain conv-BN-ReLU SSD that trains from scratch in minutes on a 2-core CPU.

Backbone 16-32-32-64-64 then 128 channels (3x3 convolutions, BatchNorm with the default momentum), five levels at
strides 8, 16, 32, 64, 128 (32, 16, 8, 4, 2 at 256 px), four boxes per location (aspect ratio 2), default-box
sizes from 16 px (stride 8) to the whole image. About 1.1 M parameters for a handful of classes. It trains with
AdamW at lr 3e-3 by default: throughput decides from-scratch results on a CPU, and this recipe converges in
minutes there (see benchmarks/README.md).

``ssd_tiny_fpn``: the same backbone and default boxes plus :class:`FusionNeck`, a light FPN-style top-down path
that brings the context of the coarse levels into the stride-8 and stride-16 levels, whose small objects the plain
network sees with little semantic context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F
from torchvision.ops.misc import Conv2dNormActivation

from ssd.errors import BackboneWeightsError
from ssd.models.architecture import Architecture, MultiScaleBackbone
from ssd.models.ssd import LevelHead
from ssd.priors import PriorConfig

__all__ = ["TinyBackbone", "FusionNeck", "TinyFPNBackbone", "ARCHITECTURES"]

STAGES = [
    # (out_channels, stride) of the 3x3 convolutions of each level's stage
    [(16, 2), (32, 2), (32, 1), (64, 2), (64, 1)],  # stride 8
    [(128, 2), (128, 1)],  # 16
    [(128, 2), (128, 1)],  # 32
    [(128, 2)],  # 64
    [(128, 2)],  # 128
]


class TinyBackbone(MultiScaleBackbone):
    """``[B, 3, S, S]`` -> five feature maps (64, 128, 128, 128, 128 channels at strides 8 ... 128)."""

    def __init__(self):
        super().__init__()
        stages = []
        channels = 3
        for convs in STAGES:
            layers = []
            for out_channels, stride in convs:
                layers.append(Conv2dNormActivation(channels, out_channels, kernel_size=3, stride=stride))
                channels = out_channels
            stages.append(nn.Sequential(*layers))
        self.stages = nn.Sequential(*stages)
        self.extras = nn.ModuleList()
        _kaiming_init(self)


LEVEL_CHANNELS = [convs[-1][0] for convs in STAGES]
NECK_WIDTH = 64  # the stride-8 level's own width: the fused levels cost no more than that level already does
FUSED_LEVELS = 2  # strides 8 and 16: the levels of the objects under about 64 px at 256 px


class FusionNeck(nn.Module):
    """Top-down feature fusion (FPN / FSSD style) into the finest ``fused`` levels.

    Every level gets a 1x1 conv-BN-ReLU lateral to ``width`` channels; from the coarsest level down, each lateral
    adds the nearest-neighbour upsampled sum of the level above (resized to the lateral's own size, so odd and
    non-square maps work); the sums of the ``fused`` finest levels go through a 3x3 conv-BN-ReLU and replace those
    levels. The coarser levels pass through unchanged: their laterals only feed the top-down path, so that the fusion
    costs 1x1 convolutions there and the heads of those levels keep their inputs.

    torchvision's ``FeaturePyramidNetwork`` is not used: it smooths and outputs every level at one width (a 3x3
    convolution and new head inputs on every level) and its blocks have no activation.

    Args:
        in_channels: channels of each level, finest first.
        width: channels of the laterals and of the fused outputs.
        fused: how many of the finest levels are replaced by fused maps (at least 1, fewer than the levels).

    ``forward``: the levels ``[B, C_l, H_l, W_l]``, finest first -> the same list with the first ``fused`` levels
    ``[B, width, H_l, W_l]``.
    """

    def __init__(self, in_channels: Sequence[int], width: int, fused: int):
        super().__init__()
        self.lateral = nn.ModuleList([Conv2dNormActivation(c, width, kernel_size=1) for c in in_channels])
        self.smooth = nn.ModuleList([Conv2dNormActivation(width, width, kernel_size=3) for _ in range(fused)])

    def forward(self, features: list[Tensor]) -> list[Tensor]:
        laterals: list[Tensor] = []
        for i, lateral in enumerate(self.lateral):
            laterals.append(lateral(features[i]))
        top_down = laterals[-1]
        sums = [top_down]  # finest first once complete
        for i in range(len(laterals) - 2, -1, -1):
            top_down = laterals[i] + F.interpolate(top_down, size=laterals[i].shape[-2:], mode="nearest")
            sums.insert(0, top_down)
        outputs: list[Tensor] = []
        for i, smooth in enumerate(self.smooth):
            outputs.append(smooth(sums[i]))
        return outputs + features[len(outputs):]


class TinyFPNBackbone(nn.Module):
    """``[B, 3, S, S]`` -> the five :class:`TinyBackbone` levels, the stride-8 and 16 ones fused by a
    :class:`FusionNeck` (64, 64, 128, 128, 128 channels).

    ``body`` is the base network (what ``--freeze backbone`` freezes), ``neck`` trains with the heads.
    """

    def __init__(self):
        super().__init__()
        self.body = TinyBackbone()
        self.neck = FusionNeck(LEVEL_CHANNELS, NECK_WIDTH, FUSED_LEVELS)
        _kaiming_init(self.neck)

    def forward(self, x: Tensor) -> list[Tensor]:
        return self.neck(self.body(x))


def _kaiming_init(module: nn.Module) -> None:
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")


def _no_weights(name: str, weights: dict[str, Tensor] | None, source: str | None) -> None:
    if weights is not None:
        raise BackboneWeightsError(f"{name} has no ImageNet backbone (it trains from scratch); got backbone "
                                   f"weights {source}")


def _backbone(options: dict[str, Any], weights: dict[str, Tensor] | None, source: str | None) -> nn.Module:
    _no_weights("ssd_tiny", weights, source)
    return TinyBackbone()


def _fpn_backbone(options: dict[str, Any], weights: dict[str, Tensor] | None, source: str | None) -> nn.Module:
    _no_weights("ssd_tiny_fpn", weights, source)
    return TinyFPNBackbone()


def _head(in_channels: int, boxes: int, num_outputs: int) -> LevelHead:
    return LevelHead(nn.Conv2d(in_channels, boxes * 4, 3, padding=1),
                     nn.Conv2d(in_channels, boxes * num_outputs, 3, padding=1), num_outputs)


_SIZE = 256
_PRIORS = PriorConfig(
    feature_maps=(32, 16, 8, 4, 2),
    steps=(8, 16, 32, 64, 128),
    min_sizes=(16, 32, 64, 112, 176),
    max_sizes=(32, 64, 112, 176, 256),
    aspect_ratios=((2,),) * 5,
)
_TRAIN_DEFAULTS = {"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.01}
ARCHITECTURES = {
    "ssd_tiny": Architecture(
        backbone=_backbone,
        head=_head,
        image_size=_SIZE,
        priors=_PRIORS,
        description="small plain conv-BN-ReLU SSD for CPU training from scratch (5456 default boxes at 256 px)",
        train_defaults=_TRAIN_DEFAULTS,
    ),
    "ssd_tiny_fpn": Architecture(
        backbone=_fpn_backbone,
        head=_head,
        image_size=_SIZE,
        priors=_PRIORS,
        description="ssd_tiny with a top-down fusion neck into its stride-8 and 16 levels (5456 default boxes at "
                    "256 px)",
        train_defaults=_TRAIN_DEFAULTS,
    ),
}

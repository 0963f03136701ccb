"""``ssd_tiny``: a small plain conv-BN-ReLU SSD that trains from scratch in minutes on a 2-core CPU.

Backbone 16-32-32-64-64 then 128 channels (3x3 convolutions, BatchNorm with the default momentum), five levels at
strides 8, 16, 32, 64, 128 (32, 16, 8, 4, 2 at 256 px), four boxes per location (aspect ratio 2), default-box
sizes from 16 px (stride 8) to the whole image. About 1.1 M parameters for a handful of classes. It trains with
AdamW at lr 3e-3 by default: throughput decides from-scratch results on a CPU, and this recipe converges in
minutes there (see benchmarks/README.md).
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from torchvision.ops.misc import Conv2dNormActivation

from ssd.models.architecture import Architecture, MultiScaleBackbone
from ssd.models.backbone_weights import BackboneWeightsError
from ssd.models.ssd import LevelHead
from ssd.priors import PriorConfig

__all__ = ["TinyBackbone", "ARCHITECTURES"]

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
        for layer in self.modules():
            if isinstance(layer, nn.Conv2d):
                nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")


def _backbone(options: dict[str, Any], weights: dict[str, Tensor] | None, source: str | None) -> nn.Module:
    if weights is not None:
        raise BackboneWeightsError(f"ssd_tiny has no ImageNet backbone (it trains from scratch); got backbone "
                                   f"weights {source}")
    return TinyBackbone()


def _head(in_channels: int, boxes: int, num_outputs: int) -> LevelHead:
    return LevelHead(nn.Conv2d(in_channels, boxes * 4, 3, padding=1),
                     nn.Conv2d(in_channels, boxes * num_outputs, 3, padding=1), num_outputs)


_SIZE = 256
ARCHITECTURES = {
    "ssd_tiny": Architecture(
        backbone=_backbone,
        head=_head,
        image_size=_SIZE,
        priors=PriorConfig(
            feature_maps=(32, 16, 8, 4, 2),
            steps=(8, 16, 32, 64, 128),
            min_sizes=(16, 32, 64, 112, 176),
            max_sizes=(32, 64, 112, 176, 256),
            aspect_ratios=((2,),) * 5,
        ),
        description="small plain conv-BN-ReLU SSD for CPU training from scratch (5456 default boxes at 256 px)",
        train_defaults={"optimizer": "adamw", "lr": 3e-3, "weight_decay": 0.01},
    )
}

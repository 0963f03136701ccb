"""SSDLite on torchvision's MobileNetV3-Large, as torchvision's ``ssdlite320_mobilenet_v3_large``.

Six levels at 320 px: the C4 block's expansion (20x20, 672 channels), the last features (10x10, 960, or 480 with
``reduced_tail``), then four depthwise-separable extra blocks (5, 3, 2, 1). Heads are depthwise 3x3 + BN + ReLU6
followed by a 1x1 convolution. BatchNorm uses eps 0.001 and momentum 0.03; convolutions start from N(0, 0.03).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import Tensor, nn
from torchvision.models import mobilenet_v3_large
from torchvision.ops.misc import Conv2dNormActivation

from ssd.models.architecture import Architecture, MultiScaleBackbone
from ssd.models.backbone_weights import load_backbone_state
from ssd.models.ssd import LevelHead
from ssd.priors import PriorConfig

__all__ = ["MobileNetV3Backbone", "ARCHITECTURES"]

NORM = partial(nn.BatchNorm2d, eps=0.001, momentum=0.03)


def normal_init(module: nn.Module) -> None:
    """N(0, 0.03) weights and zero biases for every convolution in ``module`` (torchvision's SSDLite init)."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.normal_(layer.weight, mean=0.0, std=0.03)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _conv(in_channels: int, out_channels: int, kernel: int, stride: int = 1, groups: int = 1) -> nn.Module:
    return Conv2dNormActivation(in_channels, out_channels, kernel_size=kernel, stride=stride, groups=groups,
                                norm_layer=NORM, activation_layer=nn.ReLU6)


def _extra(in_channels: int, out_channels: int) -> nn.Sequential:
    mid = out_channels // 2
    return nn.Sequential(_conv(in_channels, mid, 1), _conv(mid, mid, 3, stride=2, groups=mid),
                         _conv(mid, out_channels, 1))


class MobileNetV3Backbone(MultiScaleBackbone):
    """``[B, 3, S, S]`` -> six feature maps (strides 16, 32, 64, 128, 256, 512 for ``S = 320``: 20 ... 1).

    Args:
        reduced_tail: halve the channels of the last blocks (torchvision does so for SSDLite without ImageNet
            weights; the ImageNet weights need ``False``).
        weights: a torchvision ``mobilenet_v3_large`` state dict (the classifier is ignored), or ``None``.
        source: where ``weights`` came from, for messages.
    """

    def __init__(self, reduced_tail: bool, weights: dict[str, Tensor] | None = None, source: str | None = None):
        super().__init__()
        net = mobilenet_v3_large(norm_layer=NORM, reduced_tail=reduced_tail)
        if weights is None:
            normal_init(net)
        else:
            what = f"mobilenet_v3_large (reduced_tail={reduced_tail})"
            load_backbone_state(net, weights, source=source, what=what, ignore_prefixes=("classifier.",))
        features = net.features
        c4 = [i for i, block in enumerate(features) if getattr(block, "_is_cn", False)][-1]
        self.stages = nn.Sequential(
            nn.Sequential(*features[:c4], features[c4].block[0]),  # up to the C4 expansion (stride 16)
            nn.Sequential(features[c4].block[1:], *features[c4 + 1:]),  # C4 depthwise to the end (stride 32)
        )
        extras = nn.ModuleList([_extra(features[-1].out_channels, 512), _extra(512, 256), _extra(256, 256),
                                _extra(256, 128)])
        normal_init(extras)
        self.extras = extras


def lite_head(in_channels: int, boxes: int, num_outputs: int) -> LevelHead:
    """Depthwise-separable predictors: depthwise 3x3 + BN + ReLU6, then 1x1 to ``boxes * (4 | num_outputs)``."""

    def block(out_channels: int) -> nn.Sequential:
        return nn.Sequential(_conv(in_channels, in_channels, 3, groups=in_channels),
                             nn.Conv2d(in_channels, out_channels, 1))

    head = LevelHead(block(boxes * 4), block(boxes * num_outputs), num_outputs)
    normal_init(head)
    return head


def _backbone(options: dict[str, Any], weights: dict[str, Tensor] | None, source: str | None) -> nn.Module:
    return MobileNetV3Backbone(options["reduced_tail"], weights, source)


_SIZE = 320
_MAPS = [20, 10, 5, 3, 2, 1]
_SCALES = [0.2 + (0.95 - 0.2) * k / (len(_MAPS) - 1) for k in range(len(_MAPS))] + [1.0]  # torchvision's
ARCHITECTURES = {
    "ssdlite320_mobilenet_v3_large": Architecture(
        backbone=_backbone,
        head=lite_head,
        image_size=_SIZE,
        priors=PriorConfig(
            feature_maps=_MAPS,
            steps=[_SIZE / f for f in _MAPS],
            min_sizes=[s * _SIZE for s in _SCALES[:-1]],
            max_sizes=[s * _SIZE for s in _SCALES[1:]],
            aspect_ratios=[[2, 3]] * len(_MAPS),
        ),
        description="SSDLite on MobileNetV3-Large as torchvision's (3234 default boxes at 320 px)",
        options={"reduced_tail": None},  # None: True without ImageNet weights (as torchvision), False with them
        imagenet_weights="mobilenet_v3_large",
    )
}

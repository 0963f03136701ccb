"""The paper's SSD300 / SSD512 on VGG16 (Liu et al., 2016).

VGG16 ``features`` (torchvision layout, so ``vgg16-397923af.pth`` keys ``features.N.*`` load as they are) with
pool3 in ceil mode, conv4_3 L2-normalized with a learnable per-channel scale (initialised to 20), pool5 3x3 stride
1, conv6 3x3 dilation 6 (1024) and conv7 1x1 (1024), then the extra layers conv8_2... Given ImageNet weights, conv6
and conv7 are subsampled from fc6 / fc7 as in the paper; otherwise they are Xavier-initialised like the extras
and the heads.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.models.vgg import cfgs, make_layers

from ssd.errors import BackboneWeightsError
from ssd.models.architecture import Architecture
from ssd.models.backbone_weights import load_backbone_state
from ssd.models.ssd import LevelHead
from ssd.priors import PRIOR_CONFIGS
from ssd.weights.identify import identify

__all__ = ["L2Norm", "VGG16Backbone", "ARCHITECTURES", "weights_normalization"]



class L2Norm(nn.Module):
    """Per-position L2 normalization over channels, times a learnable per-channel scale: ``[B, C, H, W]`` -> same."""

    def __init__(self, channels: int, scale: float = 20.0):
        super().__init__()
        self.weight = nn.Parameter(torch.full((channels,), scale))

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(x, dim=1, eps=1e-10) * self.weight.view(1, -1, 1, 1)


def _extra(in_channels: int, mid: int, out: int, kernel: int, stride: int, padding: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, mid, 1), nn.ReLU(inplace=True),
                         nn.Conv2d(mid, out, kernel, stride=stride, padding=padding), nn.ReLU(inplace=True))


EXTRAS = {
    # (in, mid, out, kernel, stride, padding) of conv8_2, conv9_2, ...
    300: [(1024, 256, 512, 3, 2, 1), (512, 128, 256, 3, 2, 1), (256, 128, 256, 3, 1, 0), (256, 128, 256, 3, 1, 0)],
    512: [(1024, 256, 512, 3, 2, 1), (512, 128, 256, 3, 2, 1), (256, 128, 256, 3, 2, 1), (256, 128, 256, 3, 2, 1),
          (256, 128, 256, 4, 1, 1)],
}


class VGG16Backbone(nn.Module):
    """VGG16 SSD feature extractor: ``[B, 3, S, S]`` -> [conv4_3 (L2-normalized), conv7, conv8_2, ...].

    At ``S = 300`` the maps are 38, 19, 10, 5, 3, 1; with the SSD512 extras at ``S = 512``: 64, 32, 16, 8, 4, 2, 1.
    """

    def __init__(self, extras: list[tuple[int, int, int, int, int, int]]):
        super().__init__()
        self.conv4_3 = 22  # index in ``features`` of conv4_3's ReLU, the first source
        features = make_layers(cfgs["D"])[:-1]  # through conv5_3 + ReLU; pool5 is replaced below
        features[16].ceil_mode = True  # pool3: 75 -> 38 at 300 px
        for layer in features.modules():
            if isinstance(layer, nn.Conv2d):  # torchvision's VGG initialisation
                nn.init.kaiming_normal_(layer.weight, mode="fan_out", nonlinearity="relu")
                nn.init.zeros_(layer.bias)
        self.features = features
        self.l2norm = L2Norm(512)
        self.fc = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1),  # pool5
            nn.Conv2d(512, 1024, kernel_size=3, padding=6, dilation=6),  # conv6 (fc6)
            nn.ReLU(inplace=True),
            nn.Conv2d(1024, 1024, kernel_size=1),  # conv7 (fc7)
            nn.ReLU(inplace=True),
        )
        self.extras = nn.ModuleList([_extra(*spec) for spec in extras])
        xavier_init(self.fc)
        xavier_init(self.extras)

    def forward(self, x: Tensor) -> list[Tensor]:
        outputs: list[Tensor] = []
        for i, layer in enumerate(self.features):
            x = layer(x)
            if i == self.conv4_3:
                outputs.append(self.l2norm(x))
        x = self.fc(x)
        outputs.append(x)
        for block in self.extras:
            x = block(x)
            outputs.append(x)
        return outputs

    def load_imagenet(self, state: dict[str, Tensor], source: str) -> None:
        """Load VGG16 backbone weights, in one of three layouts (recognised by :func:`ssd.weights.identify.identify`):

        - torchvision ``vgg16`` (``vgg16-397923af.pth``): ``features.*`` as is, fc6 / fc7 subsampled into conv6 /
          conv7: fc6 ``[4096, 512*7*7]`` keeps every 4th output and every 3rd row and column of its 7x7 window
          (the dilation of conv6 makes up for the spacing), fc7 every 4th input and output; fc8 is ignored.
        - torchvision ``vgg16_features-amdegroot-88682ab5.pth``: the same keys, but the classifier holds no values
          (NaN): ``features.*`` only, conv6 / conv7 keep their initialisation.
        - ssd.pytorch's ``vgg16_reducedfc.pth``: ``N.weight`` / ``N.bias`` of its ``vgg`` layer list, conv1_1 ...
          conv5_3 at the indices of ``features`` and conv6 / conv7 (already reduced) at 31 / 33.
        """
        if identify(state).format == "vgg16_reducedfc":
            renamed = {(f"features.{n}.{p}" if int(n) < 30 else f"fc.{int(n) - 30}.{p}"): v
                       for n, p, v in ((*k.split(".", 1), v) for k, v in state.items())}
            load_backbone_state(self, renamed, source=source, what="vgg16_reducedfc (ssd.pytorch)",
                                ignore_prefixes=("extras.", "l2norm."))
            return
        load_backbone_state(self.features, state, source=source, what="vgg16", prefix="features.",
                            ignore_prefixes=("classifier.",))
        fc6, fc7 = state.get("classifier.0.weight"), state.get("classifier.3.weight")
        if fc6 is None or fc7 is None or not (fc6.isfinite().all() and fc7.isfinite().all()):
            return  # features only: conv6 / conv7 keep their random initialisation
        if fc6.shape != (4096, 512 * 7 * 7) or fc7.shape != (4096, 4096):
            raise BackboneWeightsError(f"backbone weights {source}: classifier.0.weight {list(fc6.shape)} / "
                                       f"classifier.3.weight {list(fc7.shape)} are not vgg16's fc6 [4096, 25088] / "
                                       "fc7 [4096, 4096]")
        with torch.no_grad():
            self.fc[1].weight.copy_(fc6.view(4096, 512, 7, 7)[::4, :, ::3, ::3])
            self.fc[1].bias.copy_(state["classifier.0.bias"][::4])
            self.fc[3].weight.copy_(fc7[::4, ::4].view(1024, 1024, 1, 1))
            self.fc[3].bias.copy_(state["classifier.3.bias"][::4])


SSD_PYTORCH_MEAN = (123 / 255, 117 / 255, 104 / 255)
"""Input mean of the ssd.pytorch / lufficc VGG16 weights for RGB images in [0, 1] (they subtract R 123, G 117,
B 104 from 0..255 pixels, without scaling)."""
TORCHVISION_SSD_MEAN = (0.48235, 0.45882, 0.40784)
"""torchvision's rounding of the same mean (``ssd300_vgg16`` and ``vgg16_features-amdegroot-88682ab5.pth``)."""
UNSCALED_STD = (1 / 255, 1 / 255, 1 / 255)
"""Undoes the scaling to [0, 1]: those weights take pixels in 0..255 (minus the mean)."""


def weights_normalization(state: dict[str, Tensor]) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """The input normalization (mean, std of RGB images in [0, 1]) that VGG16 backbone weights were trained with:
    ssd.pytorch's ``vgg16_reducedfc.pth`` and torchvision's ``vgg16_features`` take 0..255 pixels minus the mean;
    ``None`` (the architecture's ImageNet mean / std) for torchvision's ImageNet ``vgg16``."""
    return {"vgg16_reducedfc": (SSD_PYTORCH_MEAN, UNSCALED_STD),
            "vgg16_features": (TORCHVISION_SSD_MEAN, UNSCALED_STD)}.get(identify(state).format)


def xavier_init(module: nn.Module) -> None:
    """Xavier-uniform weights and zero biases for every convolution in ``module`` (the original SSD init)."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def conv_head(in_channels: int, boxes: int, num_outputs: int) -> LevelHead:
    """3x3 convolutions predicting ``boxes * 4`` offsets and ``boxes * num_outputs`` logits per location."""
    head = LevelHead(nn.Conv2d(in_channels, boxes * 4, 3, padding=1),
                     nn.Conv2d(in_channels, boxes * num_outputs, 3, padding=1), num_outputs)
    xavier_init(head)
    return head


def _backbone(size: int):
    def build(options: dict[str, Any], weights: dict[str, Tensor] | None, source: str | None) -> VGG16Backbone:
        backbone = VGG16Backbone(EXTRAS[size])
        if weights is not None:
            backbone.load_imagenet(weights, source)
        return backbone

    return build


ARCHITECTURES = {
    f"ssd{size}_vgg16": Architecture(
        backbone=_backbone(size),
        head=conv_head,
        image_size=size,
        priors=PRIOR_CONFIGS[f"ssd{size}"],
        description=f"SSD{size} on VGG16 as in the paper ({boxes} default boxes at {size} px)",
        imagenet_weights="vgg16",
        weights_normalization=weights_normalization,
    )
    for size, boxes in ((300, 8732), (512, 24564))
}

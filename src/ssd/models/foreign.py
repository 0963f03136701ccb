"""The foreign detector formats :mod:`ssd.models.importers` reads: how the tensors, input normalization and
default boxes of each map onto this library's architectures (a :class:`Plan` per recognised file).

- ``ssd.pytorch`` (the original PyTorch port) and ``lufficc`` (lufficc/SSD), VGG16 SSD300 / SSD512: the layer
  lists ``vgg`` (conv1_1 ... conv7, conv6 / conv7 at 31 / 33), ``extras`` (conv8_1, conv8_2, ...) and one loc / conf
  convolution per level map one to one onto ``backbone.features`` / ``backbone.fc`` / ``backbone.extras`` /
  ``heads``; their heads are laid out as ours (row, column, box; channels box-major) and their default boxes are
  generated in the same order, so no tensor is permuted. Both feed the network RGB channels in 0..255 minus
  (123, 117, 104): ssd.pytorch subtracts (104, 117, 123) from OpenCV's BGR image and then reorders it to RGB
  (``img[:, :, (2, 1, 0)]`` in its datasets and demo), lufficc subtracts ``PIXEL_MEAN = [123, 117, 104]`` from a
  PIL RGB image. The stored normalization is therefore mean ``(123, 117, 104) / 255`` and std ``1 / 255``, and the
  first convolution is kept as it is. Default boxes: ssd.pytorch uses its VOC sizes for 21 outputs and its COCO
  sizes (21 ... 315 px) otherwise; lufficc its COCO sizes for 81 outputs and the VOC ones otherwise.
- ``torchvision`` ``ssd300_vgg16`` (mean ``(0.48235, 0.45882, 0.40784)``, std ``1 / 255``, box scales 0.07 ... 1.05
  with only the sizes clipped: ``clip="size"``) and ``ssdlite320_mobilenet_v3_large`` (mean = std = 0.5; reduced
  tail or not, read from the shapes). Their head outputs and default boxes are in our order too. A COCO model's 91
  outputs (background, 80 classes, 10 unused "N/A" ids) become the background and the 80 classes: the N/A columns
  are dropped (torchvision's softmax also gives them a share, which a trained model keeps near zero).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from torch import Tensor

from ssd.errors import WeightsImportError
from ssd.models.build import MODEL_CONFIGS
from ssd.models.config import ModelConfig
from ssd.models.vgg import SSD_PYTORCH_MEAN, TORCHVISION_SSD_MEAN, UNSCALED_STD
from ssd.priors import PRIOR_CONFIGS, PriorConfig
from ssd.weights.identify import VOC_NAMES, Identified, coco_names, few_keys

__all__ = ["Plan", "PLANS"]

# Default-box sizes (pixels) of the COCO configurations of ssd.pytorch (300) and lufficc/SSD (300, 512).
_COCO_SIZES = {
    300: ([21, 45, 99, 153, 207, 261], [45, 99, 153, 207, 261, 315]),
    512: ([20.48, 51.2, 133.12, 215.04, 296.96, 378.88, 460.8], [51.2, 133.12, 215.04, 296.96, 378.88, 460.8, 542.72]),
}


@dataclass(frozen=True)
class Plan:
    """How one recognised file becomes a model: its configuration (``num_classes`` as in the file), the source key
    of each of our state-dict keys (``None``: not in the file, e.g. ``priors``), the default class names and what
    the file is, for messages."""

    config: ModelConfig
    to_source: Callable[[str], str | None]
    default_names: Sequence[str] | None
    what: str


# ------------------------------------------------------------------------------------------------ renaming rules
def _renamer(rules: list[tuple[str, Callable[[re.Match], str]]]) -> Callable[[str], str | None]:
    """Our key -> the file's key, by the first rule whose pattern matches the whole key (``None``: no rule)."""
    compiled = [(re.compile(pattern), build) for pattern, build in rules]

    def rename(key: str) -> str | None:
        for pattern, build in compiled:
            match = pattern.fullmatch(key)
            if match:
                return build(match)
        return None

    return rename


def _vgg_list_renamer(vgg: str, l2norm: str, extras: str, loc: str, conf: str) -> Callable[[str], str | None]:
    """ssd.pytorch / lufficc: flat layer lists (``vgg.N``, ``extras.N`` with the 1x1 and 3x3 convolutions in turn)."""
    return _renamer([
        (r"backbone\.features\.(\d+)\.(.+)", lambda m: f"{vgg}.{m[1]}.{m[2]}"),
        (r"backbone\.fc\.(\d+)\.(.+)", lambda m: f"{vgg}.{30 + int(m[1])}.{m[2]}"),  # pool5 is vgg.30
        (r"backbone\.l2norm\.weight", lambda m: l2norm),
        (r"backbone\.extras\.(\d+)\.(\d+)\.(.+)", lambda m: f"{extras}.{2 * int(m[1]) + int(m[2]) // 2}.{m[3]}"),
        (r"heads\.(\d+)\.loc\.(.+)", lambda m: f"{loc}.{m[1]}.{m[2]}"),
        (r"heads\.(\d+)\.cls\.(.+)", lambda m: f"{conf}.{m[1]}.{m[2]}"),
    ])


_TORCHVISION_HEADS = [
    (r"heads\.(\d+)\.loc\.(.+)", lambda m: f"head.regression_head.module_list.{m[1]}.{m[2]}"),
    (r"heads\.(\d+)\.cls\.(.+)", lambda m: f"head.classification_head.module_list.{m[1]}.{m[2]}"),
]


def _torchvision_vgg_source(key: str) -> str | None:
    """torchvision's SSD300: ``features`` stops after conv4_3's ReLU (index 22); ``extra.0`` continues with pool4 ...
    conv5_3 (indices 23 ... 29 shifted by 23) then conv6 / conv7 (``extra.0.7``); ``extra.1 ..`` are our extras."""
    return _renamer([
        (r"backbone\.features\.(\d+)\.(.+)", lambda m: f"backbone.features.{m[1]}.{m[2]}" if int(m[1]) <= 22
         else f"backbone.extra.0.{int(m[1]) - 23}.{m[2]}"),
        (r"backbone\.fc\.(.+)", lambda m: f"backbone.extra.0.7.{m[1]}"),
        (r"backbone\.l2norm\.weight", lambda m: "backbone.scale_weight"),
        (r"backbone\.extras\.(\d+)\.(.+)", lambda m: f"backbone.extra.{int(m[1]) + 1}.{m[2]}"),
        *_TORCHVISION_HEADS,
    ])(key)


_torchvision_lite_source = _renamer([
    (r"backbone\.stages\.(.+)", lambda m: f"backbone.features.{m[1]}"),
    (r"backbone\.extras\.(.+)", lambda m: f"backbone.extra.{m[1]}"),
    *_TORCHVISION_HEADS,
])


# ----------------------------------------------------------------------------------------------------- plans
def _outputs(state: dict[str, Tensor], loc_prefix: str, conf_prefix: str, source: str, what: str) -> int:
    """K + 1 from the first level's predictors (the last 4-d tensors under the two prefixes): rows / (loc rows / 4)."""
    def last_conv(prefix: str) -> Tensor | None:
        return next((v for k, v in reversed(state.items()) if k.startswith(prefix) and v.dim() == 4), None)

    loc, conf = last_conv(loc_prefix), last_conv(conf_prefix)
    if loc is None or conf is None or loc.shape[0] % 4 or conf.shape[0] % (loc.shape[0] // 4):
        shapes = [None if t is None else list(t.shape) for t in (loc, conf)]
        raise WeightsImportError(f"{source} is a {what} whose first-level predictors {loc_prefix}* / {conf_prefix}* "
                                 f"have shapes {shapes}: not 4 x A box offsets and A x (K+1) class scores")
    outputs = conf.shape[0] // (loc.shape[0] // 4)
    if outputs < 2:
        raise WeightsImportError(f"{source} is a {what} with {outputs} class output per box: no object class")
    return outputs


def _vgg_config(size: int, outputs: int, coco_sizes: bool, mean: Sequence[float], priors: PriorConfig | None = None
                ) -> ModelConfig:
    name = f"ssd{size}_vgg16"
    arch = MODEL_CONFIGS[name]
    if priors is None:
        priors = PRIOR_CONFIGS[f"ssd{size}"]
        if coco_sizes:
            priors = PriorConfig(**{**priors.to_dict(), "min_sizes": _COCO_SIZES[size][0],
                                    "max_sizes": _COCO_SIZES[size][1]})
    return ModelConfig(name=name, num_classes=outputs - 1, image_size=size, priors=priors, mean=mean,
                       std=UNSCALED_STD, channels_last=arch.channels_last, options={})


def _plan_layer_lists(found: Identified, source: str) -> Plan:
    """ssd.pytorch and lufficc/SSD VGG16 models."""
    if found.format == "ssd.pytorch":
        keys = ("vgg", "L2Norm.weight", "extras", "loc", "conf")
    else:
        if found.family != "vgg":
            raise _lufficc_other(found, source)
        keys = ("backbone.vgg", "backbone.l2_norm.weight", "backbone.extras", "box_head.predictor.reg_headers",
                "box_head.predictor.cls_headers")
    levels = sum(1 for k in found.state if re.fullmatch(rf"{re.escape(keys[3])}\.\d+\.weight", k))
    what = f"{found.format} VGG16 SSD"
    if levels not in (6, 7):
        raise WeightsImportError(f"{source} is a {what} with {levels} prediction levels ({keys[3]}.0 ...); ssd "
                                 "imports SSD300 (6 levels) and SSD512 (7 levels)")
    size = 300 if levels == 6 else 512
    outputs = _outputs(found.state, f"{keys[3]}.0.", f"{keys[4]}.0.", source, what)
    # ssd.pytorch builds its VOC configuration for 21 outputs and its COCO one otherwise; lufficc's COCO configs
    # are the 81-output ones, every other config of it keeps the VOC default boxes.
    coco = outputs != 21 if found.format == "ssd.pytorch" else outputs == 81
    names = VOC_NAMES if outputs == 21 else (coco_names() if outputs == 81 else None)
    return Plan(_vgg_config(size, outputs, coco, SSD_PYTORCH_MEAN), _vgg_list_renamer(*keys), names,
                 f"{what}{size} ({outputs} outputs, {'COCO' if coco else 'VOC'} default boxes)")


def _plan_torchvision(found: Identified, source: str) -> Plan:
    what = f"torchvision {'SSD300 VGG16' if found.family == 'vgg' else 'SSDLite MobileNetV3-Large'} detector"
    if found.family == "other":
        raise WeightsImportError(f"{source} is a torchvision SSD with a backbone ssd does not have "
                                 f"({few_keys(found.state, 3)}); ssd imports ssd300_vgg16 and "
                                 "ssdlite320_mobilenet_v3_large")
    outputs = _outputs(found.state, "head.regression_head.module_list.0.", "head.classification_head.module_list.0.",
                       source, what)
    names = VOC_NAMES if outputs == 21 else (coco_names() if outputs == 81 else None)
    if found.family == "vgg":
        priors = PriorConfig(**{**PRIOR_CONFIGS["ssd300"].to_dict(),
                                "min_sizes": _COCO_SIZES[300][0], "max_sizes": _COCO_SIZES[300][1], "clip": "size"})
        return Plan(_vgg_config(300, outputs, True, TORCHVISION_SSD_MEAN, priors), _torchvision_vgg_source, names,
                     f"{what} ({outputs} outputs)")
    name = "ssdlite320_mobilenet_v3_large"
    arch = MODEL_CONFIGS[name]
    tail = found.state.get("backbone.extra.0.0.0.weight")
    reduced = tail is not None and tail.shape[1] == 480  # the last block has 480 channels instead of 960
    config = ModelConfig(name=name, num_classes=outputs - 1, image_size=arch.image_size, priors=arch.priors,
                         mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), channels_last=arch.channels_last,
                         options={"reduced_tail": reduced})
    return Plan(config, _torchvision_lite_source, names,
                 f"{what} ({outputs} outputs, reduced_tail={reduced})")


def _lufficc_other(found: Identified, source: str) -> WeightsImportError:
    """lufficc/SSD's MobileNet / EfficientNet models: its own networks, whose keys and head differ from ours."""
    inputs = []
    for level in range(8):
        conv = [v for k, v in found.state.items()
                if k.startswith(f"box_head.predictor.cls_headers.{level}.") and v.dim() == 4]
        if conv:
            inputs.append(conv[0].shape[0] if conv[0].shape[1] == 1 else conv[0].shape[1])
    backbone = [k for k in found.state if k.startswith("backbone.")][:3]
    return WeightsImportError(
        f"{source} is a lufficc/SSD detector whose backbone is not VGG16 (keys {', '.join(backbone)}, ...; prediction "
        f"levels with {inputs} channels): lufficc's MobileNet and EfficientNet backbones are its own networks and "
        "its SSDLite head ends with a plain 1x1 convolution on the last level, so they fit none of ssd's "
        "architectures (ssdlite320_mobilenet_v3_large is torchvision's MobileNetV3-Large with levels of "
        "672, 960 (or 480), 512, 256, 256, 128 channels). ssd imports lufficc's VGG16 SSD300 and SSD512")


PLANS: dict[str, Callable[[Identified, str], Plan]] = {
    "ssd.pytorch": _plan_layer_lists,
    "lufficc": _plan_layer_lists,
    "torchvision": _plan_torchvision,
}
"""Format (a key of :data:`ssd.weights.identify.DETECTOR_FORMATS`) -> its planner: ``(file, source) -> Plan``."""

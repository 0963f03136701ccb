"""Build named SSD configurations, and the model of a complete :class:`ModelConfig` (what checkpoints hold)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ssd.errors import BackboneWeightsError, ConfigError, PriorConfigError
from ssd.limits import is_whole
from ssd.log import LOGGER
from ssd.models import mobilenet, tiny, vgg
from ssd.models.architecture import Architecture
from ssd.models.backbone_weights import read_backbone_weights
from ssd.models.config import ModelConfig
from ssd.models.ssd import SSD
from ssd.names import class_names_problem, did_you_mean
from ssd.priors import PriorConfig
from ssd.sizes import as_hw, compact_size, input_size, size_text

__all__ = ["MODEL_CONFIGS", "build_model", "build_from_config", "default_priors", "list_models", "checked_priors",
           "checked_class_names"]


MODEL_CONFIGS: dict[str, Architecture] = {**vgg.ARCHITECTURES, **mobilenet.ARCHITECTURES, **tiny.ARCHITECTURES}
"""The named configurations :func:`build_model` knows."""


def list_models() -> dict[str, str]:
    """Name -> one-line description of every configuration."""
    return {name: arch.description for name, arch in MODEL_CONFIGS.items()}


def build_model(name: str, num_classes: int | None = None, class_names: Sequence[str] | None = None, *,
                backbone_weights: str | os.PathLike | None = None,
                image_size: int | tuple[int, int] | str | None = None,
                priors: PriorConfig | None = None, **options: Any) -> SSD:
    """A new SSD of a named configuration (see :func:`list_models`).

    Args:
        name: configuration name, e.g. ``"ssd300_vgg16"``, ``"ssd512_vgg16"``, ``"ssdlite320_mobilenet_v3_large"``,
            ``"ssd_tiny"``.
        num_classes: K, the number of object classes (background excluded).
        class_names: the K class names (wins over ``num_classes``; without it names are ``class0 .. classK-1``).
        backbone_weights: path to a torchvision state dict for the backbone; ``"imagenet"`` for torchvision's
            ImageNet weights of the backbone, or another known backbone name (``ssd weights``, e.g.
            ``vgg16_features``): the file in the torch hub cache (``torch.hub.get_dir()/checkpoints``), downloaded
            there once when missing (see :mod:`ssd.weights.hub`). ``None``: random initialisation.
        image_size: the input size (default: the configuration's square size): an int (square), a
            ``(height, width)`` pair or a ``"HxW"`` string such as ``"512x288"`` (height x width). The default boxes
            are scaled to it (see :meth:`ssd.priors.PriorConfig.scaled_to`); the heads keep their shapes, so
            weights trained at one size load at another. A side above ``ssd.limits.MAX_INPUT_SIDE`` is refused.
        priors: default boxes to use instead of the configuration's (e.g. fitted by
            :func:`ssd.priors.fit.fit_priors`), in pixels of ``image_size``: the same feature maps as the network
            at that size (see :func:`default_priors`); boxes per location may differ (the heads are new).
        options: architecture options (``ssdlite320_mobilenet_v3_large``: ``reduced_tail``).

    Returns:
        The model in training mode, its ``config`` the :class:`ModelConfig` that rebuilds it.
    """
    arch = _architecture(name)
    class_names = checked_class_names(num_classes, class_names)
    options, size = _options(name, options, backbone_weights, image_size)
    default = _architecture_priors(arch, name, options, size)
    config = ModelConfig(name=name, num_classes=len(class_names), image_size=size,
                         priors=default if priors is None else checked_priors(priors, default, name, size),
                         mean=arch.mean, std=arch.std, channels_last=arch.channels_last, options=options)
    return _assemble(config, class_names, backbone_weights)


def default_priors(name: str, image_size: int | tuple[int, int] | str | None = None, **options: Any) -> PriorConfig:
    """The default boxes :func:`build_model` gives ``name`` at ``image_size`` (default: its own), without building
    (the feature maps come from a forward pass on the meta device: no weights, no memory). A size too small for
    the network raises ``ValueError``."""
    options, size = _options(name, options, None, image_size)
    return _architecture_priors(_architecture(name), name, options, size)


def _architecture_priors(arch: Architecture, name: str, options: Mapping[str, Any], size: int | tuple[int, int]
                   ) -> PriorConfig:
    """``arch.priors`` (pixels of its own size) scaled to ``size`` (:meth:`ssd.priors.PriorConfig.scaled_to`)."""
    return arch.priors.scaled_to(arch.image_size, size, _probe(name, options, size)[0])


def _options(name: str, options: Mapping[str, Any], backbone_weights: Any,
             image_size: int | tuple[int, int] | str | None) -> tuple[dict[str, Any], int | tuple[int, int]]:
    """``(every architecture option, input size)``, checked."""
    arch = _architecture(name)
    unknown = sorted(set(options) - set(arch.options))
    if unknown:
        accepted = ", ".join(arch.options) or "none"
        raise ConfigError(f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r} "
                          f"(accepted: {accepted})")
    options = {**arch.options, **options}
    if "reduced_tail" in options and options["reduced_tail"] is None:
        options["reduced_tail"] = backbone_weights is None
    size = input_size(arch.image_size if image_size is None else image_size)
    return options, size


def checked_priors(priors: PriorConfig, default: PriorConfig, name: str, size: int | tuple[int, int],
                   same_heads: bool = False) -> PriorConfig:
    """``priors`` if they fit the network: ``default``'s feature maps (its number of levels), and with
    ``same_heads`` also its boxes per location (so that trained heads still load). A :class:`PriorConfig` checks
    its own values when it is made."""
    if not isinstance(priors, PriorConfig):
        raise PriorConfigError(f"priors for {name} must be an ssd.priors.PriorConfig (PriorConfig.from_dict reads "
                               f"its dict), got {type(priors).__name__}")
    where = f"{name} at {size_text(size)} px"
    if priors.feature_maps != default.feature_maps:
        raise PriorConfigError(f"the priors are for feature maps {list(priors.feature_maps)} but {where} has "
                               f"{list(default.feature_maps)} (fitted for another model or input size?)")
    boxes, expected = ([2 + 2 * len(r) for r in p.aspect_ratios] for p in (priors, default))
    if same_heads and boxes != expected:
        raise PriorConfigError(f"the priors give {boxes} boxes per location but the heads of {where} have "
                               f"{expected}: fit them keeping the boxes per location (`ssd check --fit-priors`, not "
                               "`=free`) or train from scratch")
    return priors




def build_from_config(config: ModelConfig, class_names: Sequence[str]) -> SSD:
    """A new model (initial weights) of a complete :class:`ModelConfig` (what checkpoints and importers hold)."""
    return _assemble(config, checked_class_names(config.num_classes, class_names))


def _assemble(config: ModelConfig, class_names: list[str], backbone_weights: str | os.PathLike | None = None
              ) -> SSD:
    arch = MODEL_CONFIGS[config.name]
    weights, source = None, None
    if backbone_weights is not None:
        if arch.imagenet_weights is None:
            raise BackboneWeightsError(f"{config.name} has no ImageNet backbone (it trains from scratch); "
                                       f"got backbone_weights={str(backbone_weights)!r}")
        weights, source = read_backbone_weights(backbone_weights, config.name, arch.imagenet_weights)
        normalization = arch.weights_normalization(weights) if arch.weights_normalization else None
        if normalization is not None:  # these weights were trained on other inputs than the architecture's default
            config = config.replace(mean=normalization[0], std=normalization[1])
            LOGGER.info("backbone weights %s: input normalization mean %s, std %s (per RGB channel in [0, 1])",
                        source, _rounded(config.mean), _rounded(config.std))
    feature_maps, channels = _probe(config.name, config.options, config.image_size)
    if tuple(feature_maps) != config.priors.feature_maps:
        raise ConfigError(f"{config.name} at {size_text(config.image_size)} px has feature maps {feature_maps}, but "
                          f"the configuration says {list(config.priors.feature_maps)}")
    backbone = arch.backbone(dict(config.options), weights, source)
    num_outputs = config.num_classes + 1
    heads = nn.ModuleList([arch.head(c, 2 + 2 * len(ratios), num_outputs)
                           for c, ratios in zip(channels, config.priors.aspect_ratios)])
    return SSD(backbone, heads, config.priors.boxes(config.image_size), config, class_names)


def _rounded(values: Sequence[float]) -> list[float]:
    return [round(v, 5) for v in values]


def _probe(name: str, options: Mapping[str, Any], size: int | tuple[int, int]
           ) -> tuple[list[int | tuple[int, int]], list[int]]:
    """``(feature map sizes, channels)`` at ``size`` (an int or ``(height, width)``), from a forward pass on the meta
    device (no memory, no compute). A map size is an int for a square map, else ``(rows, cols)``."""
    maps, channels = _probe_cached(name, tuple(sorted(options.items())), as_hw(size))
    return list(maps), list(channels)


@functools.lru_cache(maxsize=64)
def _probe_cached(name: str, options: tuple, size: tuple[int, int]) -> tuple[tuple, tuple[int, ...]]:
    arch = MODEL_CONFIGS[name]
    with torch.device("meta"):
        backbone = arch.backbone(dict(options), None, None).eval()
        try:
            features = backbone(torch.empty(1, 3, *size))
        except RuntimeError as exc:
            raise ConfigError(f"image_size={size_text(size)} is too small for {name} (native size "
                              f"{arch.image_size}): {str(exc).splitlines()[0]}") from None
    return tuple(compact_size(tuple(f.shape[-2:])) for f in features), tuple(f.shape[1] for f in features)


def checked_class_names(num_classes: int | None, class_names: Sequence[str] | None) -> list[str]:
    """Validated class names: ``class_names`` (non-empty distinct strings), else ``class0 .. class{K-1}``."""
    if num_classes is not None and (not is_whole(num_classes) or num_classes < 1):
        raise ConfigError(f"num_classes must be an int >= 1 (object classes, background excluded), got {num_classes!r}")
    if class_names is None:
        if num_classes is None:
            raise ConfigError("give num_classes (K, background excluded) or class_names")
        return [f"class{k}" for k in range(num_classes)]
    if isinstance(class_names, str) or not isinstance(class_names, Sequence):
        raise ConfigError(f"class_names must be a list of strings, got {type(class_names).__name__}")
    names = list(class_names)
    if not names:
        raise ConfigError("class_names is empty: a detector needs at least one object class")
    if (problem := class_names_problem(names)) is not None:
        raise ConfigError(problem)
    if num_classes is not None and num_classes != len(names):
        raise ConfigError(f"num_classes={num_classes} but {len(names)} class_names were given {_names(names)}")
    return names


def _names(names: list[str], limit: int = 30) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return f"[{shown}{', ...' if len(names) > limit else ''}]"


def _architecture(name: str) -> Architecture:
    if name not in MODEL_CONFIGS:
        raise ConfigError(f"unknown model {name!r}{did_you_mean(name, MODEL_CONFIGS)} (known models: "
                          f"{', '.join(MODEL_CONFIGS)})")
    return MODEL_CONFIGS[name]

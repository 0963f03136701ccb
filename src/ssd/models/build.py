"""Build named SSD configurations, and rebuild them from checkpoints."""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ssd._utils import as_hw, compact_size, did_you_mean, size_text, state_dict_mismatch
from ssd.models import mobilenet, tiny, vgg
from ssd.models.architecture import Architecture
from ssd.models.backbone_weights import BackboneWeightsError, read_backbone_weights
from ssd.models.config import ModelConfig, ModelConfigError
from ssd.models.ssd import SSD
from ssd.priors import PriorConfig, PriorConfigError, input_size
from ssd.weights.checkpoint import CheckpointError, checked_checkpoint, checkpoint_dict, read_file
from ssd.weights.finetune import match_classes, remap_class_rows

__all__ = ["MODEL_CONFIGS", "build_model", "build_from_config", "default_priors", "list_models",
           "model_from_checkpoint", "read_weights"]

logger = logging.getLogger("ssd")

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
        backbone_weights: path to a torchvision ImageNet state dict for the backbone, or ``"imagenet"`` to use the
            file in the torch hub cache (``torch.hub.get_dir()/checkpoints``); nothing is ever downloaded.
            ``None``: random initialisation.
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
    class_names = _class_names(num_classes, class_names)
    options, size = _options(name, options, backbone_weights, image_size)
    default = _architecture_priors(arch, name, options, size)
    config = ModelConfig(name=name, num_classes=len(class_names), image_size=size,
                         priors=default if priors is None else _checked_priors(priors, default, name, size),
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
        raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))} for model {name!r} (accepted: {accepted})")
    options = {**arch.options, **options}
    if "reduced_tail" in options and options["reduced_tail"] is None:
        options["reduced_tail"] = backbone_weights is None
    size = input_size(arch.image_size if image_size is None else image_size)
    return options, size


def _checked_priors(priors: PriorConfig, default: PriorConfig, name: str, size: int | tuple[int, int],
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


def model_from_checkpoint(ckpt_or_path: Mapping[str, Any] | str | os.PathLike, class_names: Sequence[str] | None = None,
                          reinit_heads: bool = False, priors: PriorConfig | Mapping[str, Any] | None = None) -> SSD:
    """Rebuild the model saved in a checkpoint (a path or the dict from :func:`ssd.weights.checkpoint.load_checkpoint`).

    A file (or dict) that is not a checkpoint of this library is imported when it is a detector of a known format
    (ssd.pytorch, torchvision, lufficc/SSD: see :func:`ssd.weights.importers.import_model`, the format is logged).

    Args:
        class_names: the classes wanted (default: the checkpoint's). Different names (or order) are refused unless
            ``reinit_heads``.
        reinit_heads: with different ``class_names``, fine-tune to them: keep every weight (backbone, extra layers,
            box regressors, the background row) but the class predictor rows of the classes, which start from
            their initialisation, except for a wanted class that names a class of the checkpoint (case-insensitive,
            VOC / COCO synonyms, see :func:`ssd.weights.finetune.match_classes`): it starts from that class's rows.
            The mapping is logged on the ``ssd`` logger.
        priors: default boxes replacing the checkpoint's (fine-tuning with fitted default boxes): its feature maps
            and, so that every head loads, its boxes per location.
    """
    is_path = isinstance(ckpt_or_path, (str, os.PathLike))
    source = str(ckpt_or_path) if is_path else "the checkpoint"
    ckpt = read_file(ckpt_or_path) if is_path else ckpt_or_path
    if not _is_own_checkpoint(ckpt):
        from ssd.weights.importers import import_weights  # importers build models with this module

        model = import_weights(ckpt, source)
        config, saved, state = model.config, model.class_names, model.state_dict()
    else:
        model = None
        config, saved, state = _read_own(checked_checkpoint(ckpt, source) if is_path else ckpt, source)
    if priors is not None:  # new default boxes: the same heads, another priors buffer
        config = config.replace(priors=_checked_priors(priors, config.priors, config.name, config.image_size,
                                                       same_heads=True))
        state, model = {**state, "priors": config.priors.boxes(config.image_size)}, None
    wanted = saved if class_names is None else _class_names(None, class_names)
    if wanted == saved:
        if model is None:
            model = _assemble(config, wanted)
            _load(model, state, source)
        return model
    if not reinit_heads:
        order = " (the same names in another order)" if sorted(wanted) == sorted(saved) else ""
        raise CheckpointError(f"{source} was trained for {len(saved)} classes {_names(saved)} but the class "
                              f"names given are {len(wanted)} classes {_names(wanted)}{order}; pass "
                              "reinit_heads=True to fine-tune it with new class heads")
    return _fine_tune(config, saved, state, wanted, source)


def read_weights(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dict of a weights file, whatever wrote it: a checkpoint of this library as
    :func:`ssd.weights.checkpoint.load_checkpoint` reads it, or a foreign detector imported (its format logged, see
    :func:`ssd.weights.importers.import_model`) as the dict :func:`ssd.weights.checkpoint.save_checkpoint` would write.
    For code that needs more of a checkpoint than the model (its config, extras); :func:`model_from_checkpoint`
    takes the dict."""
    obj = read_file(path)
    if _is_own_checkpoint(obj):
        return checked_checkpoint(obj, path)
    from ssd.weights.importers import import_weights  # importers build models with this module

    return checkpoint_dict(import_weights(obj, str(path)))


def build_from_config(config: ModelConfig, class_names: Sequence[str]) -> SSD:
    """A new model (initial weights) of a complete :class:`ModelConfig` (what checkpoints and importers hold)."""
    return _assemble(config, _class_names(config.num_classes, class_names))


def _is_own_checkpoint(ckpt: Any) -> bool:
    """A checkpoint of this library (possibly damaged: its own checks report that), not a foreign file."""
    return isinstance(ckpt, Mapping) and ("format" in ckpt or "config" in ckpt or "class_names" in ckpt)


def _read_own(ckpt: Mapping[str, Any], source: str) -> tuple[ModelConfig, list[str], Mapping[str, torch.Tensor]]:
    """``(config, class names, state dict)`` of a checkpoint of this library."""
    if not all(k in ckpt for k in ("config", "class_names", "model")):
        raise CheckpointError(f"{source} is not an ssd checkpoint dict (needs 'config', 'class_names' and 'model'; "
                              "see ssd.load_checkpoint)")
    try:
        config = ModelConfig.from_dict(ckpt["config"], source=source)
    except ModelConfigError as exc:
        raise CheckpointError(str(exc)) from None
    if config.name not in MODEL_CONFIGS:
        raise CheckpointError(f"{source} holds a model named {config.name!r}, which this version of ssd does "
                              f"not know (known: {', '.join(MODEL_CONFIGS)})")
    return config, list(ckpt["class_names"]), ckpt["model"]


def _fine_tune(config: ModelConfig, saved: list[str], state: Mapping[str, torch.Tensor], wanted: list[str],
               source: str) -> SSD:
    """A model for ``wanted`` classes from the weights of one trained for ``saved`` (see model_from_checkpoint)."""
    model = _assemble(config.replace(num_classes=len(wanted)), wanted)
    columns = match_classes(saved, wanted)
    _load(model, remap_class_rows(state, model, columns), source)
    carried = [f"{name} <- {saved[c - 1]}" if name != saved[c - 1] else name
               for name, c in zip(wanted, columns[1:]) if c is not None]
    fresh = [name for name, c in zip(wanted, columns[1:]) if c is None]
    logger.warning("%s: fine-tuning from %d classes to %d: kept the backbone, extra layers, box regressors and "
                   "background row; class rows carried over for %d (%s); initialised for %d (%s)", source,
                   len(saved), len(wanted), len(carried), ", ".join(carried) or "none", len(fresh),
                   ", ".join(fresh) or "none")
    return model


def _assemble(config: ModelConfig, class_names: list[str], backbone_weights: str | os.PathLike | None = None
              ) -> SSD:
    arch = MODEL_CONFIGS[config.name]
    weights, source = None, None
    if backbone_weights is not None:
        if arch.imagenet_file is None:
            raise BackboneWeightsError(f"{config.name} has no ImageNet backbone (it trains from scratch); "
                                       f"got backbone_weights={str(backbone_weights)!r}")
        weights, source = read_backbone_weights(backbone_weights, arch.imagenet_file, config.name)
        normalization = arch.weights_normalization(weights) if arch.weights_normalization else None
        if normalization is not None:  # these weights were trained on other inputs than the architecture's default
            config = config.replace(mean=normalization[0], std=normalization[1])
            logger.info("backbone weights %s: input normalization mean %s, std %s (per RGB channel in [0, 1])",
                        source, _rounded(config.mean), _rounded(config.std))
    feature_maps, channels = _probe(config.name, config.options, config.image_size)
    if tuple(feature_maps) != config.priors.feature_maps:
        raise ValueError(f"{config.name} at {size_text(config.image_size)} px has feature maps {feature_maps}, but "
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
            raise ValueError(f"image_size={size_text(size)} is too small for {name} (native size "
                             f"{arch.image_size}): {str(exc).splitlines()[0]}") from None
    return tuple(compact_size(tuple(f.shape[-2:])) for f in features), tuple(f.shape[1] for f in features)


def _load(model: SSD, state: Mapping[str, torch.Tensor], source: str) -> None:
    """Load a checkpoint's weights, refusing (``CheckpointError``) keys or shapes that do not fit its own config."""
    mismatch = state_dict_mismatch(model.state_dict(), state)
    if mismatch:
        raise CheckpointError(f"the weights in {source} do not fit the model configuration saved with them "
                              f"(damaged or edited checkpoint?): {mismatch}")
    model.load_state_dict(state, strict=False)


def _class_names(num_classes: int | None, class_names: Sequence[str] | None) -> list[str]:
    """Validated class names: ``class_names`` (non-empty distinct strings), else ``class0 .. class{K-1}``."""
    if class_names is None:
        if num_classes is None:
            raise ValueError("give num_classes (K, background excluded) or class_names")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be an int >= 1 (object classes, background excluded), "
                             f"got {num_classes!r}")
        return [f"class{k}" for k in range(num_classes)]
    if isinstance(class_names, str) or not isinstance(class_names, Sequence):
        raise ValueError(f"class_names must be a list of strings, got {type(class_names).__name__}")
    names = list(class_names)
    if not names:
        raise ValueError("class_names is empty: a detector needs at least one object class")
    for index, item in enumerate(names):
        if not isinstance(item, str) or not item.strip():
            raise ValueError(f"class_names[{index}] = {item!r}: class names must be non-empty strings")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"class_names has duplicates {duplicates}: every class needs a distinct name")
    if num_classes is not None and num_classes != len(names):
        raise ValueError(f"num_classes={num_classes} but {len(names)} class_names were given {_names(names)}")
    return names


def _names(names: list[str], limit: int = 30) -> str:
    shown = ", ".join(map(repr, names[:limit]))
    return f"[{shown}{', ...' if len(names) > limit else ''}]"


def _architecture(name: str) -> Architecture:
    if name not in MODEL_CONFIGS:
        raise ValueError(f"unknown model {name!r}{did_you_mean(name, MODEL_CONFIGS)} (known models: "
                         f"{', '.join(MODEL_CONFIGS)})")
    return MODEL_CONFIGS[name]

"""Backbone weights for a new model: a local state dict file, or torchvision's by name (fetched once into the torch
hub cache by :mod:`ssd.weights.hub`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from torch import Tensor, nn

import ssd.weights.hub as hub
from ssd.errors import BackboneWeightsError, CheckpointError
from ssd.nn import state_dict_mismatch
from ssd.weights.checkpoint import read_file
from ssd.weights.identify import identify

__all__ = ["read_backbone_weights", "load_backbone_state"]


def read_backbone_weights(spec: str | os.PathLike, model: str, imagenet: str) -> tuple[dict[str, Tensor], str]:
    """Read a torchvision state dict for a backbone.

    Args:
        spec: a file path (an existing path always wins); ``"imagenet"`` for torchvision's ImageNet weights of the
            backbone, or the name of other known backbone weights for ``model`` (:func:`ssd.weights.hub.catalog`,
            e.g. ``vgg16_features``): the file in ``torch.hub.get_dir()/checkpoints/``, downloaded there when
            missing (progress bar, checksum verified).
        model: the model whose backbone it is (e.g. ``"ssd300_vgg16"``), for messages and the names that fit.
        imagenet: the catalog name of torchvision's ImageNet weights for this backbone (e.g. ``"vgg16"``).

    Returns:
        ``(state_dict, source)``, ``source`` being the file path used (for later messages).

    Raises:
        BackboneWeightsError: a missing file, an unknown name (the closest names for ``model``), a name for another
            model, a failed download (which file to put where), or a file that is no backbone state dict.
    """
    entry = _known(spec, model, imagenet)
    example = hub.catalog()[imagenet].filename
    if entry is not None:
        try:
            path = hub.fetch(entry)
        except CheckpointError as exc:
            raise BackboneWeightsError(str(exc)) from None
    else:
        path = Path(spec)
        if not path.is_file():
            raise BackboneWeightsError(f"backbone weights file {path} does not exist (expected a torchvision state "
                                       f"dict for {model}, such as {example})")
    try:
        state = read_file(path)
    except CheckpointError as exc:
        raise BackboneWeightsError(f"cannot read backbone weights: {exc} (expected a torchvision state dict for "
                                   f"{model}, such as {example})") from None
    found = identify(state)
    if found.kind in ("ours", "detector"):
        raise BackboneWeightsError(f"backbone weights {path} is not a backbone: it holds {found.description}; "
                                   f"{found.use}")
    if found.state is None:
        raise BackboneWeightsError(f"backbone weights {path} is not a state dict of tensors: it holds "
                                   f"{found.description}; expected a torchvision state dict for {model}, such as "
                                   f"{example}")
    return found.state, str(path)


def _known(spec: str | os.PathLike, model: str, imagenet: str) -> hub.HubWeights | None:
    """The catalog entry ``spec`` names for ``model``'s backbone, ``None`` for a path (existing or not)."""
    if Path(spec).exists():
        return None
    name = imagenet if str(spec) == "imagenet" else str(spec)
    fitting = ["imagenet", *(n for n, e in hub.catalog().items() if e.kind == "backbone" and model in e.models)]
    try:
        entry = hub.lookup(name, "backbone")
    except CheckpointError as exc:
        raise BackboneWeightsError(str(exc)) from None
    if entry is not None and model not in entry.models:
        raise BackboneWeightsError(f"--backbone-weights {spec}: {entry.description} is a backbone of "
                                   f"{', '.join(entry.models)}, not of {model}; for {model}: {', '.join(fitting)}")
    if entry is None and hub.looks_like_name(spec):
        raise BackboneWeightsError(hub.unknown_name(spec, "backbone", fitting))
    return entry


def load_backbone_state(module: nn.Module, state: Mapping[str, Tensor], *, source: str, what: str, prefix: str = "",
                 ignore_prefixes: Iterable[str] = ()) -> None:
    """Load ``state`` into ``module`` after checking that keys and shapes match exactly.

    Keys of ``state`` are ``prefix`` + the module's keys (e.g. ``features.`` for a VGG ``features`` module). Keys
    starting with one of ``ignore_prefixes`` (e.g. an ImageNet classifier) are skipped on both sides. Raises
    :class:`BackboneWeightsError` naming the missing, unexpected and mismatched keys (a few of each, with counts).
    """
    ignore = tuple(ignore_prefixes)
    given = {k: v for k, v in state.items() if not k.startswith(ignore)}
    expected = {prefix + k: v for k, v in module.state_dict().items() if not (prefix + k).startswith(ignore)}
    mismatch = state_dict_mismatch(expected, given)
    if mismatch:
        raise BackboneWeightsError(f"backbone weights {source} do not fit the {what} backbone (wrong file or "
                                   f"architecture?): {mismatch}")
    module.load_state_dict({k[len(prefix):]: v for k, v in given.items()}, strict=False)

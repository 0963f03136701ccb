"""ImageNet backbone weights from local torchvision state dict files (never downloaded)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch
from torch import Tensor, nn

from ssd._utils import state_dict_mismatch
from ssd.weights.checkpoint import CheckpointError, read_file
from ssd.weights.identify import identify

__all__ = ["read_backbone_weights", "load_backbone_state", "BackboneWeightsError"]


class BackboneWeightsError(ValueError):
    """A backbone weights file that is missing, unreadable or made for another architecture."""


def read_backbone_weights(spec: str | os.PathLike, filename: str, what: str) -> tuple[dict[str, Tensor], str]:
    """Read a torchvision state dict for a backbone.

    Args:
        spec: a file path, or ``"imagenet"`` for ``torch.hub.get_dir()/checkpoints/<filename>`` (the file torchvision
            would have downloaded there; it is only looked up, never downloaded).
        filename: torchvision's file name for the ImageNet weights of this backbone (e.g. ``vgg16-397923af.pth``).
        what: the backbone, for messages (e.g. ``"vgg16 (ssd300_vgg16)"``).

    Returns:
        ``(state_dict, source)``, ``source`` being the file path used (for later messages).
    """
    if str(spec) == "imagenet":
        path = Path(torch.hub.get_dir()) / "checkpoints" / filename
        if not path.is_file():
            raise BackboneWeightsError(
                f"backbone_weights='imagenet': {path} not found (nothing is downloaded). Copy torchvision's "
                f"ImageNet weights for {what} ({filename}) there, or pass backbone_weights=PATH to the file")
    else:
        path = Path(spec)
        if not path.is_file():
            raise BackboneWeightsError(f"backbone weights file {path} does not exist (expected a torchvision state "
                                       f"dict for {what}, such as {filename})")
    try:
        state = read_file(path)
    except CheckpointError as exc:
        raise BackboneWeightsError(f"cannot read backbone weights: {exc} (expected a torchvision state dict for "
                                   f"{what}, such as {filename})") from None
    found = identify(state)
    if found.kind in ("ours", "detector"):
        raise BackboneWeightsError(f"backbone weights {path} is not a backbone: it holds {found.description}; "
                                   f"{found.use}")
    if found.state is None:
        raise BackboneWeightsError(f"backbone weights {path} is not a state dict of tensors: it holds "
                                   f"{found.description}; expected a torchvision state dict for {what}, such as "
                                   f"{filename}")
    return found.state, str(path)


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

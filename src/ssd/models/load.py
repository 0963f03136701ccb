"""Models from weights files: a checkpoint of this library rebuilt, a foreign detector imported, either one given
new default boxes or fine-tuned to other classes.

:func:`read_weights` turns any weights file into a checkpoint dict, by the one decision of
:func:`ssd.weights.identify.identify`; :func:`model_from_checkpoint` builds the model such a dict describes, as saved,
with new default boxes, or fine-tuned to other classes. Every load checks the saved configuration (the error names
the file) and the weights against it: names and shapes, floating-point parameters stored as integers, values that
are not finite.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor

from ssd.errors import CheckpointError
from ssd.log import LOGGER
from ssd.models.build import MODEL_CONFIGS, build_from_config, checked_class_names, checked_priors
from ssd.models.config import ModelConfig
from ssd.models.finetune import match_classes, remap_class_rows
from ssd.models.importers import import_weights
from ssd.models.ssd import SSD
from ssd.nn import state_dict_mismatch
from ssd.priors import PriorConfig
from ssd.text import few
from ssd.weights.checkpoint import checked_checkpoint, checkpoint_card, checkpoint_dict, read_file
from ssd.weights.hub import weights_file
from ssd.weights.identify import identify

__all__ = ["read_weights", "model_from_checkpoint"]



def read_weights(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint dict of a weights file, whatever wrote it: a checkpoint of this library as
    :func:`ssd.weights.checkpoint.load_checkpoint` reads it, or a foreign detector imported (its format logged, see
    :func:`ssd.models.importers.import_model`) as the dict :func:`ssd.weights.checkpoint.save_checkpoint` would write.
    For code that needs more of a checkpoint than the model (its config, extras); :func:`model_from_checkpoint`
    takes the dict. ``path`` may also be a known detector name (``ssd300_vgg16_coco``, see :mod:`ssd.weights.hub`):
    its cached file, downloaded once; an existing path always wins.

    Raises:
        CheckpointError: the file cannot be read, is a checkpoint of another format version, a backbone, or no
            weights at all (``WeightsImportError`` for a detector that does not convert); an unknown name, or known
            weights that cannot be downloaded.
    """
    path = weights_file(path)
    return _checkpoint_of(read_file(path), str(path))


def _checkpoint_of(obj: Any, source: str) -> dict[str, Any]:
    """:func:`read_weights` of an already loaded file (``source`` names it in messages)."""
    if identify(obj).kind == "ours":
        return checked_checkpoint(obj, source)
    return checkpoint_dict(import_weights(obj, source))  # which refuses backbones and non-weights by name


def model_from_checkpoint(ckpt_or_path: Mapping[str, Any] | str | os.PathLike, class_names: Sequence[str] | None = None,
                          reinit_heads: bool = False, priors: PriorConfig | Mapping[str, Any] | None = None) -> SSD:
    """Rebuild the model saved in a checkpoint (a path or the dict from :func:`read_weights` /
    :func:`ssd.weights.checkpoint.load_checkpoint`).

    A file (or dict) that is not a checkpoint of this library is imported when it is a detector of a known format
    (ssd.pytorch, torchvision, lufficc/SSD: see :func:`ssd.models.importers.import_model`, the format is logged).

    Args:
        class_names: the classes wanted (default: the checkpoint's). Different names (or order) are refused unless
            ``reinit_heads``.
        reinit_heads: with different ``class_names``, fine-tune to them: keep every weight (backbone, extra layers,
            box regressors, the background row) but the class predictor rows of the classes, which start from
            their initialisation, except for a wanted class that names a class of the checkpoint (case-insensitive,
            VOC / COCO synonyms, see :func:`ssd.models.finetune.match_classes`): it starts from that class's rows.
            The mapping is logged on the ``ssd`` LOGGER.
        priors: default boxes replacing the checkpoint's (fine-tuning with fitted default boxes): its feature maps
            and, so that every head loads, its boxes per location.

    A model rebuilt as saved carries the checkpoint's ``category_ids`` and ``operating_point`` (its
    :attr:`ssd.models.SSD.card` is the checkpoint's).

    Raises:
        CheckpointError: what :func:`read_weights` refuses; a saved configuration that is malformed or does not build
            (edited?); weights that do not fit it, are stored as integers or are not finite; other class names
            without ``reinit_heads``; a model card that is not the contents' or fails its checksum (the field named,
            :func:`ssd.weights.checkpoint.checkpoint_card`).
    """
    is_path = isinstance(ckpt_or_path, (str, os.PathLike))
    source = str(ckpt_or_path) if is_path else "the checkpoint"
    ckpt = read_weights(ckpt_or_path) if is_path else _checkpoint_of(ckpt_or_path, source)
    config, saved = _saved_config(ckpt, source)
    state = ckpt["model"]
    if priors is not None:
        config, state = _with_priors(config, state, priors)
    wanted = saved if class_names is None else checked_class_names(None, class_names)
    if wanted == saved:
        model = _rebuilt(config, saved, state, source)
        card = checkpoint_card(ckpt, source)
        if priors is None:  # the stored point was measured with the saved default boxes
            model.category_ids = None if card.category_ids is None else list(card.category_ids)
            model.operating_point = card.operating_point
        return model
    if not reinit_heads:
        order = " (the same names in another order)" if sorted(wanted) == sorted(saved) else ""
        raise CheckpointError(f"{source} was trained for {len(saved)} classes {_listed(saved)} but the class "
                              f"names given are {len(wanted)} classes {_listed(wanted)}{order}; pass "
                              "reinit_heads=True to fine-tune it with new class heads")
    model = _fine_tuned(config, saved, state, wanted, source)
    checkpoint_card(ckpt, source)
    return model


def _saved_config(ckpt: Mapping[str, Any], source: str) -> tuple[ModelConfig, list[str]]:
    """``(config, class names)`` of a checked checkpoint dict, validated: an edited one is refused naming ``source``."""
    config = ModelConfig.from_dict(ckpt["config"], source=source)
    if config.name not in MODEL_CONFIGS:
        raise CheckpointError(f"{source} holds a model named {config.name!r}, which this version of ssd does "
                              f"not know (known: {', '.join(MODEL_CONFIGS)})")
    try:
        names = checked_class_names(config.num_classes, ckpt["class_names"])
    except ValueError as exc:
        raise CheckpointError(f"{source}: the saved class names do not fit its model configuration (edited?): "
                              f"{exc}") from None
    return config, names


def _with_priors(config: ModelConfig, state: Mapping[str, Tensor], priors: PriorConfig | Mapping[str, Any]
                 ) -> tuple[ModelConfig, dict[str, Tensor]]:
    """New default boxes: the same heads (same boxes per location), another ``priors`` buffer."""
    config = config.replace(priors=checked_priors(priors, config.priors, config.name, config.image_size,
                                                  same_heads=True))
    return config, {**state, "priors": config.priors.boxes(config.image_size)}


def _rebuilt(config: ModelConfig, class_names: list[str], state: Mapping[str, Tensor], source: str) -> SSD:
    """The model of ``config`` with the checkpoint's weights."""
    model = _built(config, class_names, source)
    _load(model, state, source)
    return model


def _fine_tuned(config: ModelConfig, saved: list[str], state: Mapping[str, Tensor], wanted: list[str],
                source: str) -> SSD:
    """A model for ``wanted`` classes from the weights of one trained for ``saved`` (see model_from_checkpoint)."""
    model = _built(config.replace(num_classes=len(wanted)), wanted, source)
    columns = match_classes(saved, wanted)
    _load(model, remap_class_rows(state, model, columns), source)
    carried = [f"{name} <- {saved[c - 1]}" if name != saved[c - 1] else name
               for name, c in zip(wanted, columns[1:]) if c is not None]
    fresh = [name for name, c in zip(wanted, columns[1:]) if c is None]
    LOGGER.warning("%s: fine-tuning from %d classes to %d: kept the backbone, extra layers, box regressors and "
                   "background row; class rows carried over for %d (%s); initialised for %d (%s)", source,
                   len(saved), len(wanted), len(carried), ", ".join(carried) or "none", len(fresh),
                   ", ".join(fresh) or "none")
    return model


def _built(config: ModelConfig, class_names: list[str], source: str) -> SSD:
    """A new model of a saved configuration; one that does not build (edited sizes, boxes ...) names ``source``."""
    try:
        return build_from_config(config, class_names)
    except ValueError as exc:
        raise CheckpointError(f"{source}: its model configuration does not build a {config.name} (edited or "
                              f"damaged checkpoint?): {exc}") from None


def _load(model: SSD, state: Mapping[str, Tensor], source: str) -> None:
    """Load a checkpoint's weights, refusing (``CheckpointError``) keys, shapes or types that do not fit its own
    config, and values that are not finite (a diverged training or a damaged file: every prediction would be lost)."""
    mismatch = state_dict_mismatch(model.state_dict(), state)
    if mismatch:
        raise CheckpointError(f"the weights in {source} do not fit the model configuration saved with them "
                              f"(damaged or edited checkpoint?): {mismatch}")
    invalid = [key for key, value in state.items() if value.is_floating_point() and not bool(value.isfinite().all())]
    if invalid:
        raise CheckpointError(f"the weights in {source} hold NaN or infinite values in {len(invalid)} of {len(state)} "
                              f"tensors ({few(invalid)}): the training diverged or the file is damaged; use an "
                              "earlier checkpoint")
    model.load_state_dict(state, strict=False)


def _listed(names: list[str], limit: int = 30) -> str:
    return f"[{few([repr(name) for name in names], limit)}]"

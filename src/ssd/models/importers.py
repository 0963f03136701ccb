"""Import detectors trained with other SSD implementations as models of this library.

:func:`import_model` recognises a file by its keys and shapes (:func:`ssd.weights.identify.identify`), renames its
tensors to this library's layout, checks every shape against the architecture it maps to, and records the input
normalization and default boxes the weights were trained with, so that the imported model takes this library's
ordinary input (RGB in ``[0, 1]``, through :meth:`SSD.preprocess`) and gives the original's outputs.

How each format maps onto this library is :mod:`ssd.models.foreign`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ssd.errors import ConfigError, WeightsImportError
from ssd.log import LOGGER
from ssd.models.build import MODEL_CONFIGS, build_from_config
from ssd.models.finetune import remap_class_rows
from ssd.models.foreign import PLANS, Plan
from ssd.models.ssd import SSD
from ssd.nn import state_dict_mismatch
from ssd.weights.checkpoint import read_file
from ssd.weights.hub import weights_file
from ssd.weights.identify import (
    DETECTOR_FORMATS,
    VOC_NAMES,
    Identified,
    coco_categories,
    coco_names,
    few_keys,
    identify,
)

__all__ = ["FORMAT_CHOICES", "import_model", "import_weights", "resolve_class_names"]


FORMAT_CHOICES = ("auto", *DETECTOR_FORMATS)


def import_model(path: str | os.PathLike, format: str = "auto", class_names: Sequence[str] | str | None = None
                 ) -> SSD:
    """A model of this library from a detector trained with ssd.pytorch, torchvision or lufficc/SSD.

    Args:
        path: the weights file (read with ``torch.load(weights_only=True)``), or a known detector name
            (``ssd300_vgg16_coco``, ``ssdlite320_mobilenet_v3_large_coco``: see :mod:`ssd.weights.hub`): its file in
            the torch hub cache, downloaded once; an existing path always wins.
        format: ``"auto"`` (recognised by keys and shapes) or one of ``"ssd.pytorch"``, ``"torchvision"``,
            ``"lufficc"`` (then a file of another format is refused).
        class_names: the names of the file's classes (``"voc"``, ``"coco"`` or a list); default: the 20 VOC names
            for 21 outputs, the 80 COCO names for 81 (and torchvision's 91), else ``class0 ..``.

    Returns:
        The model in eval mode, with the input normalization and default boxes the weights were trained with.

    Raises:
        WeightsImportError: not a detector of these formats (the message names the formats tried and shows keys),
            a backbone-only file, or an architecture that differs (which layer, which shapes).
        CheckpointError: a missing, truncated or corrupt file; an unknown name, or known weights that cannot be
            downloaded.
    """
    path = weights_file(path)
    return import_weights(read_file(path), str(path), format=format, class_names=class_names)


def import_weights(obj: Any, source: str, *, format: str = "auto", class_names: Sequence[str] | str | None = None
                   ) -> SSD:
    """:func:`import_model` of an already loaded file (``source`` names it in messages)."""
    found = _recognise(obj, source, format)
    plan = PLANS[found.format](found, source)
    names, columns = _names_and_columns(found, plan, class_names, source)
    state = _converted(found, plan, source)
    model = build_from_config(plan.config.replace(num_classes=len(names)), names)
    if columns is not None:
        state = remap_class_rows(state, model, columns)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing != ["priors"] or unexpected:  # the renaming covers every tensor but the computed default boxes
        raise RuntimeError(f"internal error importing {source}: missing {missing}, unexpected {unexpected}")
    dropped = f", dropped the {plan.config.num_classes + 1 - len(columns)} N/A columns" if columns else ""
    LOGGER.info("%s: imported %s as %s with %d classes (%s%s); input normalization mean %s, std %s", source,
                plan.what, plan.config.name, len(names), _preview(names), dropped,
                [round(v, 5) for v in plan.config.mean], [round(v, 5) for v in plan.config.std])
    return model.eval()


def resolve_class_names(spec: Sequence[str] | str | os.PathLike | None) -> list[str] | None:
    """``"voc"`` / ``"coco"`` -> those names; a path -> one name per non-empty line of the file; a list as is."""
    if spec is None:
        return None
    if isinstance(spec, str) and spec.lower() in ("voc", "coco"):
        return list(VOC_NAMES if spec.lower() == "voc" else coco_names())
    if isinstance(spec, (str, os.PathLike)):
        path = Path(spec)
        if not path.is_file():
            raise ConfigError(f"class names {str(spec)!r}: not 'voc', 'coco' or an existing text file (one class "
                              "name per line)")
        return [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]
    return list(spec)


def _recognise(obj: Any, source: str, format: str) -> Identified:
    if format not in FORMAT_CHOICES:
        raise ConfigError(f"format={format!r} is not one of {', '.join(FORMAT_CHOICES)}")
    found = identify(obj)
    if found.kind == "ours":
        raise WeightsImportError(f"{source} is already a checkpoint of this library: {found.use}")
    if found.kind == "backbone":
        models = "ssd300_vgg16 / ssd512_vgg16" if found.family == "vgg" else "ssdlite320_mobilenet_v3_large"
        raise WeightsImportError(f"{source} is a backbone file ({found.format}: {few_keys(obj, 3)}), not a detector: "
                                 f"train a detector from it with backbone_weights= (ssd train --model {models} "
                                 f"--backbone-weights {source})")
    if found.kind != "detector" or (format != "auto" and found.format != format):
        tried = DETECTOR_FORMATS if format == "auto" else {format: DETECTOR_FORMATS[format]}
        listed = "; ".join(f"{name}: {keys}" for name, keys in tried.items())
        seen = f" (it looks like {found.description})" if found.kind == "detector" else ""
        held = found.keys if found.kind == "detector" else found.description
        hint = f": {found.use}" if found.format == "ssd state dict" else ""
        raise WeightsImportError(f"{source} is not an ssd checkpoint and fits none of the formats tried ({listed})"
                                 f"{seen}; it holds {held}{hint}")
    return found


def _converted(found: Identified, plan: Plan, source: str) -> dict[str, Tensor]:
    """The file's tensors under our names, after checking every name and shape against the architecture."""
    with torch.device("meta"):  # shapes only: nothing is allocated or initialised
        expected = build_from_config(plan.config, [f"class{k}" for k in range(plan.config.num_classes)]).state_dict()
    table = {ours: src for ours in expected if (src := plan.to_source(ours)) is not None}
    mismatch = state_dict_mismatch({src: expected[ours] for ours, src in table.items()}, found.state)
    if mismatch:
        raise WeightsImportError(f"{source} is a {plan.what} but does not fit {plan.config.name} (the architecture "
                                 f"it maps to: {MODEL_CONFIGS[plan.config.name].description}): {mismatch}")
    return {ours: found.state[src] for ours, src in table.items()}


def _names_and_columns(found: Identified, plan: Plan, class_names: Sequence[str] | str | None, source: str
                       ) -> tuple[list[str], list[int] | None]:
    """The class names of the imported model and, for torchvision's COCO outputs, the file columns kept."""
    outputs = plan.config.num_classes + 1
    columns = None
    names = list(plan.default_names) if plan.default_names else [f"class{k}" for k in range(outputs - 1)]
    if found.format == "torchvision" and outputs == len(coco_categories()):
        columns = [i for i, name in enumerate(coco_categories()) if name != "N/A"]
        names = list(coco_names())
    given = resolve_class_names(class_names)
    if given is not None:
        if len(given) != len(names):
            raise WeightsImportError(f"{source} has {len(names)} classes (its default names: {_preview(names)}) but "
                                     f"{len(given)} class names were given ({_preview(given)})")
        names = given
    return names, columns


def _preview(names: Sequence[str], limit: int = 6) -> str:
    return ", ".join(names[:limit]) + (f", ... ({len(names)} in all)" if len(names) > limit else "")

"""Recognise weight files by their keys and shapes (never by file name): foreign detectors, backbones, and the
VOC / COCO class lists their outputs stand for.

Nothing here builds a model: :mod:`ssd.weights.importers` converts what :func:`identify` recognises, and the backbone
loader uses it to refuse a detector given as a backbone with a useful message.

Detectors (``kind="detector"``):
    ``ssd.pytorch``  the original PyTorch port (amdegroot): a plain state dict ``vgg.N.*``, ``L2Norm.weight``,
                     ``extras.N.*``, ``loc.N.*``, ``conf.N.*``.
    ``torchvision``  ``torchvision.models.detection`` SSD / SSDLite: ``backbone.*``, ``head.classification_head.*``,
                     ``head.regression_head.*`` (also inside a ``{"model": ...}`` training checkpoint).
    ``lufficc``      lufficc/SSD: ``{"model": {backbone.*, box_head.predictor.cls_headers.*, ...}, ...}``.
Backbones (``kind="backbone"``): ``vgg16_reducedfc.pth`` (``0.weight`` ... ``33.bias``), torchvision ``vgg16``
state dicts (``features.N.*``, ``classifier.*``) and ``mobilenet_v3_large`` ones (``features.N.M.*``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import Tensor

__all__ = ["DETECTOR_FORMATS", "VOC_NAMES", "Identified", "coco_names", "coco_categories", "identify", "few_keys"]

DETECTOR_FORMATS: dict[str, str] = {
    "ssd.pytorch": "the original PyTorch port (vgg.N.*, L2Norm.weight, extras.N.*, loc.N.*, conf.N.*)",
    "torchvision": "torchvision ssd300_vgg16 / ssdlite320_mobilenet_v3_large (backbone.*, head.classification_head.*)",
    "lufficc": "lufficc/SSD ({'model': {backbone.*, box_head.predictor.*}})",
}
"""The detector formats :func:`ssd.weights.importers.import_model` reads, with the keys that identify them."""

VOC_NAMES = ("aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow", "diningtable",
             "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")
"""The 20 Pascal VOC classes in their usual (alphabetical) order: outputs 1..20 of a 21-output VOC detector."""


@functools.lru_cache(maxsize=1)
def coco_categories() -> tuple[str, ...]:
    """torchvision's 91 COCO output slots: ``"__background__"``, the 80 classes and 10 ``"N/A"`` (unused ids)."""
    from torchvision.models.detection import SSD300_VGG16_Weights

    return tuple(SSD300_VGG16_Weights.COCO_V1.meta["categories"])


def coco_names() -> tuple[str, ...]:
    """The 80 COCO classes in category-id order: outputs 1..80 of an 81-output COCO detector."""
    return tuple(name for name in coco_categories()[1:] if name != "N/A")


@dataclass(frozen=True)
class Identified:
    """What :func:`identify` recognised.

    Attributes:
        format: a key of :data:`DETECTOR_FORMATS`, or a backbone name (``vgg16_reducedfc``, ``vgg16``,
            ``vgg16_features`` (torchvision's ssd.pytorch-derived file, classifier without values),
            ``mobilenet_v3_large``).
        kind: ``"detector"`` or ``"backbone"``.
        family: ``"vgg"``, ``"mobilenet"`` or ``"other"`` (the backbone network).
        state: the state dict (unwrapped from ``{"model": ...}``, a ``module.`` prefix removed).
    """

    format: str
    kind: str
    family: str
    state: dict[str, Tensor]

    @property
    def description(self) -> str:
        what = {"vgg": "VGG16", "mobilenet": "MobileNet", "other": "unrecognised"}[self.family]
        return f"{self.format} {self.kind} ({what} backbone)" if self.kind == "detector" else f"{self.format} backbone"


def identify(obj: Any) -> Identified | None:
    """Recognise a loaded weights file (what ``torch.load`` returned), or ``None``."""
    state = state_dict_of(obj)
    if state is None:
        return None
    has = state.__contains__
    if has("vgg.0.weight") and has("loc.0.weight") and has("conf.0.weight"):
        return Identified("ssd.pytorch", "detector", "vgg", state)
    if any(k.startswith("head.classification_head.module_list.") for k in state):
        family = "vgg" if has("backbone.scale_weight") else (
            "mobilenet" if has("backbone.features.0.0.0.weight") else "other")
        return Identified("torchvision", "detector", family, state)
    if any(k.startswith("box_head.predictor.cls_headers.") for k in state):
        family = "vgg" if has("backbone.vgg.0.weight") else "other"
        return Identified("lufficc", "detector", family, state)
    return _identify_backbone(state)


def _identify_backbone(state: dict[str, Tensor]) -> Identified | None:
    has = state.__contains__
    if has("0.weight") and has("31.weight") and has("33.weight"):
        return Identified("vgg16_reducedfc", "backbone", "vgg", state)
    if has("features.0.weight") and has("features.28.weight"):
        classifier = state.get("classifier.0.weight")
        values = classifier is not None and bool(classifier.isfinite().all())
        return Identified("vgg16" if values or classifier is None else "vgg16_features", "backbone", "vgg", state)
    if has("features.0.0.weight") and any(k.startswith("features.16.") for k in state):
        return Identified("mobilenet_v3_large", "backbone", "mobilenet", state)
    return None


def state_dict_of(obj: Any) -> dict[str, Tensor] | None:
    """The state dict in a loaded file: the file itself, or its ``"model"`` / ``"state_dict"`` entry (training
    checkpoints of torchvision's references and lufficc/SSD); a common ``module.`` prefix (DataParallel) removed.
    ``None`` when there is no mapping of tensors."""
    if isinstance(obj, Mapping) and not _all_tensors(obj):
        inner = next((obj[k] for k in ("model", "state_dict") if isinstance(obj.get(k), Mapping)), None)
        obj = inner
    if not isinstance(obj, Mapping) or not obj or not _all_tensors(obj):
        return None
    state = {str(k): v for k, v in obj.items()}
    if all(k.startswith("module.") for k in state):
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def few_keys(obj: Any, limit: int = 6) -> str:
    """A few keys of a loaded file (of its state dict when it holds one), for messages."""
    state = state_dict_of(obj)
    if state is None and isinstance(obj, Mapping):
        keys = [f"{k!r}" for k in list(obj)[:limit]]
        return f"keys {', '.join(keys)}{', ...' if len(obj) > limit else ''} ({len(obj)} in all)"
    if state is None:
        return f"a {type(obj).__name__}, not a dict"
    shown = ", ".join(f"{k} {list(v.shape)}" for k, v in list(state.items())[:limit])
    return f"keys {shown}{', ...' if len(state) > limit else ''} ({len(state)} tensors)"


def _all_tensors(mapping: Mapping) -> bool:
    return all(isinstance(v, Tensor) for v in mapping.values())

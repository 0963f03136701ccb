"""What a weights file is, decided once for every reader: a checkpoint of this library (``"ours"``), a foreign
detector (its format), a backbone, or not weights at all; recognised by keys and shapes, never by file name.

Nothing here builds a model: :mod:`ssd.models.load` reads checkpoints, :mod:`ssd.models.importers` converts the
detectors, the backbone loader takes the backbones, and each refuses the other kinds with the message
:attr:`Identified.description` gives. :func:`file_kind` says what the bytes of a file that ``torch.load`` cannot read
look like (text, a pickle, an archive).

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

import codecs
import functools
import io
import pickletools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from torch import Tensor

__all__ = ["DETECTOR_FORMATS", "VOC_NAMES", "Identified", "coco_names", "coco_categories", "identify",
           "state_dict_of", "few_keys", "file_kind", "foreign_format"]

DETECTOR_FORMATS: dict[str, str] = {
    "ssd.pytorch": "the original PyTorch port (vgg.N.*, L2Norm.weight, extras.N.*, loc.N.*, conf.N.*)",
    "torchvision": "torchvision ssd300_vgg16 / ssdlite320_mobilenet_v3_large (backbone.*, head.classification_head.*)",
    "lufficc": "lufficc/SSD ({'model': {backbone.*, box_head.predictor.*}})",
}
"""The detector formats :func:`ssd.models.importers.import_model` reads, with the keys that identify them."""

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
        kind: ``"ours"`` (a checkpoint of this library, possibly of another format version or damaged: its reader
            says what is wrong), ``"detector"``, ``"backbone"`` or ``"not weights"``.
        format: for a detector a key of :data:`DETECTOR_FORMATS`; for a backbone its name (``vgg16_reducedfc``,
            ``vgg16``, ``vgg16_features`` (torchvision's ssd.pytorch-derived file, classifier without values),
            ``mobilenet_v3_large``); ``"ssd"`` for ours; for anything else ``"ssd state dict"`` (the weights of a
            model of this library without its configuration), ``"state dict"`` or ``""``.
        family: ``"vgg"``, ``"mobilenet"`` or ``"other"`` (the backbone network).
        state: the state dict (unwrapped from ``{"model": ...}``, a ``module.`` prefix removed); ``None`` when the
            object holds no mapping of tensors.
        keys: a few keys of the object (of its state dict when it holds one), for messages.
    """

    kind: Literal["ours", "detector", "backbone", "not weights"]
    format: str
    family: str
    state: dict[str, Tensor] | None
    keys: str

    @property
    def description(self) -> str:
        """What the object is, for refusals: ``a detector of the torchvision format (VGG16 backbone)``,
        ``a vgg16_reducedfc backbone``, ``a plain state dict of no known detector or backbone (keys ...)`` ..."""
        if self.kind == "detector":
            what = {"vgg": "VGG16", "mobilenet": "MobileNet", "other": "unrecognised"}[self.family]
            return f"a detector of the {self.format} format ({what} backbone)"
        if self.kind == "backbone":
            return f"a {self.format} backbone"
        if self.kind == "ours":
            return "an ssd checkpoint"
        if self.format == "ssd state dict":
            return f"the state dict of an ssd model without its configuration and class names ({self.keys})"
        if self.format == "state dict":
            return f"a plain state dict of no known detector or backbone ({self.keys})"
        return f"no weights ({self.keys})"

    @property
    def use(self) -> str:
        """Where the file goes instead, for the refusals of readers it does not fit."""
        return {
            "ours": "give it to weights= (--weights) or ssd.model_from_checkpoint as it is",
            "detector": "give it to weights= (--weights), which imports it, or convert it once with `ssd import`",
            "backbone": "train a detector from it with backbone_weights= (--backbone-weights)",
        }.get(self.kind, "rebuild the model with ssd.build_model(...) and load_state_dict()"
              if self.format == "ssd state dict" else "give a checkpoint of this library or a detector ssd imports")


def identify(obj: Any) -> Identified:
    """Recognise a loaded weights file (what ``torch.load`` returned)."""
    if _is_own_checkpoint(obj):
        return Identified("ours", "ssd", "other", state_dict_of(obj.get("model")), few_keys(obj))
    state = state_dict_of(obj)
    keys = few_keys(obj)
    if state is None:
        return Identified("not weights", "", "other", None, keys)
    has = state.__contains__
    if has("vgg.0.weight") and has("loc.0.weight") and has("conf.0.weight"):
        return Identified("detector", "ssd.pytorch", "vgg", state, keys)
    if any(k.startswith("head.classification_head.module_list.") for k in state):
        family = "vgg" if has("backbone.scale_weight") else (
            "mobilenet" if has("backbone.features.0.0.0.weight") else "other")
        return Identified("detector", "torchvision", family, state, keys)
    if any(k.startswith("box_head.predictor.cls_headers.") for k in state):
        family = "vgg" if has("backbone.vgg.0.weight") else "other"
        return Identified("detector", "lufficc", family, state, keys)
    backbone = _identify_backbone(state)
    if backbone is not None:
        return Identified("backbone", *backbone, state, keys)
    own = any(k.startswith("heads.0.") for k in state)
    return Identified("not weights", "ssd state dict" if own else "state dict", "other", state, keys)


def _is_own_checkpoint(obj: Any) -> bool:
    """A checkpoint of this library, by its reserved keys (of any format version, or damaged: its checks say so)."""
    return isinstance(obj, Mapping) and any(key in obj for key in ("format", "config", "class_names"))


def _identify_backbone(state: dict[str, Tensor]) -> tuple[str, str] | None:
    """``(format, family)`` of a backbone state dict, or ``None``."""
    has = state.__contains__
    if has("0.weight") and has("31.weight") and has("33.weight"):
        return "vgg16_reducedfc", "vgg"
    if has("features.0.weight") and has("features.28.weight"):
        classifier = state.get("classifier.0.weight")
        values = classifier is not None and bool(classifier.isfinite().all())
        return "vgg16" if values or classifier is None else "vgg16_features", "vgg"
    if has("features.0.0.weight") and any(k.startswith("features.16.") for k in state):
        return "mobilenet_v3_large", "mobilenet"
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


def file_kind(head: bytes) -> Literal["empty", "archive", "pickle", "text", "binary"]:
    """What a file whose first bytes are ``head`` looks like: ``"archive"`` (zip, PyTorch's own format),
    ``"pickle"`` (a binary pickle, or a whole text-protocol one: ``torch.load``'s legacy format and pickled objects),
    ``"text"`` (UTF-8 without control characters), ``"empty"`` or ``"binary"`` (anything else)."""
    if not head:
        return "empty"
    if head.startswith(b"PK"):
        return "archive"
    if head.startswith(b"\x80") or _whole_pickle(head):
        return "pickle"
    text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(head).removeprefix("\ufeff")
    if "\ufffd" not in text and all(c.isprintable() or c in "\n\r\t\f" for c in text):
        return "text"
    return "binary"


def _onnx(head: bytes) -> bool:
    """A protobuf ``ModelProto``: ``ir_version`` (field 1, a small varint) first, then another of its fields."""
    return len(head) > 2 and head[0] == 0x08 and 3 <= head[1] <= 20 and head[2] in b"\x12\x1a\x22\x2a\x32\x3a\x42"


def _safetensors(head: bytes) -> bool:
    """An 8-byte little-endian header length, then the JSON header."""
    return len(head) > 10 and head[8:10] == b'{"' and 0 < int.from_bytes(head[:8], "little") < 100 * 2**20


# Formats a user may hand over where PyTorch weights are due: what the file is, and what to do with it.
_FOREIGN_FORMATS = (
    (".onnx", _onnx, "an ONNX model", "ONNX exports of this library run as they are (ssd predict / ssd val / ssd "
     "benchmark --weights FILE.onnx) and are not converted back: give the PyTorch checkpoint (.pt) the export was "
     "made from"),
    (".safetensors", _safetensors, "a safetensors file", "read it with safetensors.torch.load_file, save the state "
     "dict with torch.save and give that .pth"),
    (".h5", lambda head: head.startswith(b"\x89HDF\r\n\x1a\n"), "an HDF5 file (Keras / TensorFlow weights)",
     "only PyTorch weights (.pt / .pth) can be read"),
    (".npy", lambda head: head.startswith(b"\x93NUMPY"), "a NumPy array file", "only PyTorch weights (.pt / .pth) "
     "can be read"),
    (".gguf", lambda head: head.startswith(b"GGUF"), "a GGUF file (llama.cpp)", "only PyTorch weights (.pt / .pth) "
     "can be read"),
    (".gz", lambda head: head.startswith(b"\x1f\x8b"), "a gzip-compressed file", "decompress it first "
     "(gunzip FILE) and give the file inside"),
)


def foreign_format(head: bytes, suffix: str = "") -> str | None:
    """What a file that is not PyTorch's is, and what to do with it, when its first bytes ``head`` (or its
    ``suffix``) show a known format (ONNX, safetensors, HDF5, NumPy, GGUF, gzip): ``"an ONNX model: ONNX exports of this
    library run as they are ..."``; ``None`` otherwise."""
    for known_suffix, matches, what, use in _FOREIGN_FORMATS:
        if suffix.lower() == known_suffix or matches(head):
            return f"{what}: {use}"
    return None


def _whole_pickle(head: bytes) -> bool:
    """Whether ``head`` starts with a complete pickle (up to its STOP opcode): the text ``cat\\ndog`` reads as a
    GLOBAL opcode to the pickle machine, but never ends like one."""
    try:
        for _ in pickletools.genops(io.BytesIO(head)):
            pass
    except Exception:  # any malformed or unfinished opcode stream
        return False
    return True

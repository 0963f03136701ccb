"""Fine-tuning a trained detector to other classes: which pretrained class each new class starts from, the class
predictor rows that carry over, and freezing the backbone.

A class predictor (the last convolution of ``heads[i].cls``) has ``A * (K+1)`` output channels, box-major: channel
``a * (K+1) + c`` is class output ``c`` (0 = background) of box ``a``. Carrying class ``c_old`` over to ``c_new``
copies the rows ``a * (K_old+1) + c_old`` to ``a * (K_new+1) + c_new`` for every box ``a`` of every level.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from torch import Tensor, nn

from ssd.nn import unwrap_model

__all__ = ["SYNONYMS", "match_classes", "class_predictors", "remap_class_rows", "set_backbone_trainable"]

SYNONYMS: dict[str, str] = {
    "motorbike": "motorcycle",
    "tvmonitor": "tv",
    "tv monitor": "tv",
    "aeroplane": "airplane",
    "sofa": "couch",
    "diningtable": "dining table",
    "pottedplant": "potted plant",
}
"""Names of the same class in Pascal VOC and COCO (VOC name -> COCO name), matched in both directions."""


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def _canonical(name: str) -> str:
    """Lower case, ``_`` / ``-`` / repeated spaces as one space, VOC synonyms as their COCO name."""
    text = re.sub(r"[\s_\-]+", " ", name.strip().lower())
    return SYNONYMS.get(text, text)


def match_classes(pretrained: Sequence[str], wanted: Sequence[str]) -> list[int | None]:
    """For each class output of the new model, the pretrained output it starts from.

    Returns:
        ``columns`` of length ``len(wanted) + 1``: ``columns[0] = 0`` (the background row is always kept) and
        ``columns[k + 1]`` is ``j + 1`` when ``wanted[k]`` names the pretrained class ``pretrained[j]``
        (case-insensitive, ``_`` / ``-`` as spaces, :data:`SYNONYMS`), else ``None`` (initialised afresh).
    """
    index = {}
    for j, name in enumerate(pretrained):
        index.setdefault(_canonical(name), j)
    return [0] + [None if (j := index.get(_canonical(name))) is None else j + 1 for name in wanted]


def class_predictors(model: nn.Module) -> list[tuple[str, int]]:
    """``(prefix, boxes)`` per level: the state-dict prefix of the last convolution of ``heads[i].cls`` (e.g.
    ``heads.0.cls`` or ``heads.0.cls.1``) and its boxes per location ``A``."""
    model = unwrap_model(model)
    found = []
    for i, head in enumerate(model.heads):
        convs = [(name, m) for name, m in head.cls.named_modules() if isinstance(m, nn.Conv2d)]
        name, conv = convs[-1]
        prefix = f"heads.{i}.cls" + (f".{name}" if name else "")
        found.append((prefix, conv.out_channels // head.num_outputs))
    return found


def remap_class_rows(state: Mapping[str, Tensor], model: nn.Module, columns: Sequence[int | None]
                     ) -> dict[str, Tensor]:
    """``state`` (weights of the same architecture with other class outputs) made to fit ``model``.

    Every tensor is kept as it is except the class predictors' weights and biases: their output ``c`` of box ``a``
    is the row of output ``columns[c]`` of ``state`` (same box), or ``model``'s own initial row where
    ``columns[c]`` is ``None``. ``len(columns)`` is ``model``'s ``K + 1``.
    """
    own = unwrap_model(model).state_dict()
    out = dict(state)
    for prefix, boxes in class_predictors(model):
        for key in (f"{prefix}.weight", f"{prefix}.bias"):
            if key not in state or key not in own:
                continue  # reported by the caller's key check
            old, new = state[key], own[key].clone()
            old_outputs = old.shape[0] // boxes
            if old.shape[0] % boxes or any(c is not None and c >= old_outputs for c in columns):
                continue  # a shape mismatch, reported by the caller's shape check
            old_rows = old.reshape(boxes, old_outputs, *old.shape[1:])
            new_rows = new.reshape(boxes, len(columns), *new.shape[1:])
            for c, source in enumerate(columns):
                if source is not None:
                    new_rows[:, c] = old_rows[:, source]
            out[key] = new_rows.reshape(new.shape)
    return out


def set_backbone_trainable(model: nn.Module, trainable: bool) -> int:
    """Freeze (``False``) or unfreeze (``True``) the base network of the backbone.

    The base network is the backbone without its extra layers and the conv4_3 scale: VGG16 up to conv7
    (``backbone.features`` and ``backbone.fc``, ssd.pytorch's ``vgg``), the MobileNetV3 / ``ssd_tiny`` stages, the
    ``ssd_tiny_fpn`` body (its fusion neck, like the extra layers, keeps training). Frozen
    parameters get ``requires_grad=False`` and the BatchNorm layers among them stop updating their running
    statistics (eval mode); unfreezing gives them back the model's mode. Call it after ``model.train()`` (which
    would put those BatchNorm layers back in training mode).

    Returns:
        The number of parameter tensors of the base network.
    """
    model = unwrap_model(model)
    count = 0
    for name, part in model.backbone.named_children():
        if name in ("extras", "l2norm", "neck"):
            continue
        for parameter in part.parameters():
            parameter.requires_grad_(trainable)
            count += 1
        for module in part.modules():
            if isinstance(module, _BATCH_NORMS):
                module.train(model.training and trainable)
    return count

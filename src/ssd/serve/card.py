"""What ``GET /model`` says about the model behind the server, read from its :class:`ssd.card.ModelCard`."""

from __future__ import annotations

from typing import Any

from ssd.inference.backends import Backend

__all__ = ["model_card"]


def model_card(backend: Backend) -> dict[str, Any]:
    """``name`` (the architecture), ``format`` (the runtime), ``classes``, ``category_ids``, ``input_size``
    (height, width), ``operating_point`` (the stored best-F1 point or ``None``), ``nms`` (the thresholds fixed in a
    graph with NMS inside, or ``None``), ``precision``, ``file`` (its name, ``None`` for an in-memory model) and
    ``checksum`` (the card's ``sha256`` over the network and every field, ``None`` where the artifact has none)."""
    card = backend.card
    height, width = card.image_size
    nms = card.nms
    return {
        "name": card.model_name,
        "format": backend.name,
        "classes": list(card.class_names),
        "category_ids": None if card.category_ids is None else list(card.category_ids),
        "input_size": {"height": height, "width": width},
        "operating_point": None if card.operating_point is None else dict(card.operating_point),
        "nms": None if nms is None else {"conf": nms.score_threshold, "iou": nms.iou_threshold,
                                         "max_det": nms.max_detections},
        "precision": card.precision,
        "file": None if backend.source is None else backend.source.name,
        "checksum": None if card.checksum is None else card.checksum["sha256"],
    }

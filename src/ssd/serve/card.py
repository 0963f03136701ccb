"""The model card of ``GET /model``: what a client needs to know about the model behind the server."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from ssd._utils import as_hw
from ssd.inference.registry import Backend

__all__ = ["model_card"]


def model_card(backend: Backend) -> dict[str, Any]:
    """``name`` (architecture), ``format`` (the runtime), ``classes``, ``category_ids``, ``input_size`` (height,
    width), ``operating_point`` (the stored best-F1 point or ``None``), ``nms`` (detections made inside the graph),
    ``file`` and its ``sha256`` (``None`` for an in-memory model): read from the backend's attributes, here only."""
    source = Path(backend.source) if backend.source is not None else None
    digest = None
    if source is not None and source.is_file():
        with open(source, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
    height, width = as_hw(backend.image_size)
    return {
        "name": backend.model_name,
        "format": backend.name,
        "classes": list(backend.class_names),
        "category_ids": backend.category_ids,
        "input_size": {"height": height, "width": width},
        "operating_point": backend.operating_point,
        "nms": bool(getattr(backend, "nms", False)),
        "file": None if source is None else source.name,
        "sha256": digest,
    }

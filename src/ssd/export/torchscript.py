"""Export an SSD's network to TorchScript: ``images [B, 3, S, S]`` -> ``(loc, logits, priors)`` as the ONNX graph
without NMS (see :mod:`ssd.export.onnx`), any batch size; post-processing stays in the library.

The metadata is the ONNX export's (same keys and JSON values, ``precision`` ``fp32``), stored as the extra file
``ssd.json`` with ``module_sha256``, the checksum of the traced code and weights
(:func:`ssd.inference.backends_torchscript.module_digest`), verified by
:class:`~ssd.inference.backends_torchscript.TorchScriptBackend` at load.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ssd._utils import as_hw
from ssd.export.onnx import as_model, onnx_metadata
from ssd.files import write_bytes
from ssd.inference.backends_torchscript import METADATA_FILE, module_digest

__all__ = ["export_torchscript", "RawOutputs", "network_metadata"]


class RawOutputs(nn.Module):
    """``images [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1], priors [P, 4])``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor):
        loc, logits = self.model(images)
        return loc, logits, self.model.priors.clone()


def export_torchscript(weights_or_model, out_path: str | Path) -> Path:
    """Trace a checkpoint path or an ``SSD`` (see the module docstring) to ``out_path`` (written atomically)."""
    out_path = Path(out_path)
    model, category_ids, point = as_model(weights_or_model, out_path)
    with torch.no_grad():
        traced = torch.jit.trace(RawOutputs(model), torch.zeros(1, 3, *as_hw(model.config.image_size)))
    buffer = io.BytesIO()
    metadata = network_metadata(model, category_ids, point, "module_sha256", module_digest(traced))
    torch.jit.save(traced, buffer, _extra_files={METADATA_FILE: metadata})
    return write_bytes(out_path, buffer.getvalue())


def network_metadata(model: nn.Module, category_ids: list[int] | None, operating_point: dict | None,
                     digest_key: str, digest: str) -> str:
    """The JSON text of ``ssd.json`` for a serialized PyTorch network: the ONNX export's metadata with the network's
    own checksum under ``digest_key`` in place of ``graph_sha256``."""
    metadata = onnx_metadata(model, category_ids, digest="", thresholds=None, operating_point=operating_point)
    del metadata["graph_sha256"]
    metadata[digest_key] = digest
    return json.dumps(metadata)

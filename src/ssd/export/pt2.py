"""Export an SSD's network with ``torch.export``: ``images [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1],
priors [P, 4])`` as the ONNX graph without NMS (see :mod:`ssd.export.onnx`), any batch size, post-processing in the
library.

The model card, as strings (the ONNX export's metadata), is the archive's extra file ``ssd.json``, sealed with the
program (:func:`ssd.inference.backends.pt2.program_digest`) and verified by
:class:`~ssd.inference.backends.pt2.ExportedProgramBackend` at load.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ssd.export.onnx import as_model, onnx_metadata
from ssd.files import write_bytes
from ssd.inference.backends.pt2 import METADATA_FILE, program_digest
from ssd.sizes import as_hw

__all__ = ["export_pt2", "RawOutputs"]


class RawOutputs(nn.Module):
    """``images [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1], priors [P, 4])``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, images: Tensor):
        loc, logits = self.model(images)
        return loc, logits, self.model.priors.clone()


def export_pt2(weights_or_model, out_path: str | Path) -> Path:
    """Export a checkpoint path or an ``SSD`` (see the module docstring) to ``out_path`` (written atomically)."""
    out_path = Path(out_path)
    model = as_model(weights_or_model, out_path)
    example = torch.zeros(2, 3, *as_hw(model.config.image_size))  # 2, not 1: torch.export specializes size 1
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.export.export(RawOutputs(model), (example,), dynamic_shapes={"images": {0: batch}})
    metadata = onnx_metadata(model.card.sealed(program_digest(program)))
    buffer = io.BytesIO()
    torch.export.save(program, buffer, extra_files={METADATA_FILE: json.dumps(metadata)})
    return write_bytes(out_path, buffer.getvalue())

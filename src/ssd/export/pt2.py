"""Export an SSD's network with ``torch.export``: ``images [B, 3, S, S]`` -> ``(loc, logits, priors)`` as the
TorchScript export (see :mod:`ssd.export.torchscript`), any batch size, post-processing in the library.

The metadata is the ONNX export's (``precision`` ``fp32``), stored as the archive's extra file ``ssd.json`` with
``program_sha256`` (:func:`ssd.inference.backends_pt2.program_digest`), verified by
:class:`~ssd.inference.backends_pt2.ExportedProgramBackend` at load.
"""

from __future__ import annotations

import io
from pathlib import Path

import torch

from ssd._utils import as_hw
from ssd.export.onnx import as_model
from ssd.export.torchscript import RawOutputs, network_metadata
from ssd.files import write_bytes
from ssd.inference.backends_pt2 import program_digest
from ssd.inference.backends_torchscript import METADATA_FILE

__all__ = ["export_pt2"]


def export_pt2(weights_or_model, out_path: str | Path) -> Path:
    """Export a checkpoint path or an ``SSD`` (see the module docstring) to ``out_path`` (written atomically)."""
    out_path = Path(out_path)
    model, category_ids, point = as_model(weights_or_model, out_path)
    example = torch.zeros(2, 3, *as_hw(model.config.image_size))  # 2, not 1: torch.export specializes size 1
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.export.export(RawOutputs(model), (example,), dynamic_shapes={"images": {0: batch}})
    buffer = io.BytesIO()
    metadata = network_metadata(model, category_ids, point, "program_sha256", program_digest(program))
    torch.export.save(program, buffer, extra_files={METADATA_FILE: metadata})
    return write_bytes(out_path, buffer.getvalue())

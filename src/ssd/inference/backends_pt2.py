"""The ``torch.export`` backend: a ``.pt2`` file written by :func:`ssd.export.pt2.export_pt2`.

``torch.export`` is PyTorch's successor to TorchScript (``torch.jit.trace`` is deprecated since PyTorch 2.10): an
``ExportedProgram`` of ATen operators, run here by PyTorch itself, any batch size.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ssd.inference.backends import OnnxModelError
from ssd.inference.backends_torchscript import METADATA_FILE, TorchScriptBackend, network_digest

__all__ = ["ExportedProgramBackend", "program_digest", "open_pt2"]


def program_digest(program: torch.export.ExportedProgram) -> str:
    """:func:`~ssd.inference.backends_torchscript.network_digest` of an exported program's graph code and of every
    parameter, buffer and tensor constant."""
    constants = {k: v for k, v in program.constants.items() if isinstance(v, Tensor)}
    return network_digest(program.graph_module.code, {**program.state_dict, **constants})


class ExportedProgramBackend(TorchScriptBackend):
    """An exported SSD network (``torch.export``) on ``device``, checked at load as :class:`TorchScriptBackend`
    (``program_sha256``). ``batch [B, 3, S, S]`` -> ``(loc, logits)`` as the eager model."""

    name = "pt2"
    digest_key = "program_sha256"

    def _read(self) -> tuple[Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], str, str]:
        extra = {METADATA_FILE: ""}
        try:
            program = torch.export.load(self.path, extra_files=extra)
        except Exception as e:  # a damaged archive fails in zipfile, the unpickler or the graph schema
            raise OnnxModelError(f"cannot load torch.export model {self.path}: {e}") from e
        return program.module().to(self.device), extra[METADATA_FILE], program_digest(program)


def open_pt2(path: Path, device: torch.device, half: bool) -> ExportedProgramBackend:
    """A ``.pt2`` file of ``ssd export --format pt2`` (float32: ``half`` is refused)."""
    if half:
        raise ValueError(f"half precision applies to PyTorch checkpoints, not to the torch.export model {path}")
    return ExportedProgramBackend(path, device)

"""The ``torch.export`` backend: a ``.pt2`` file written by :func:`ssd.export.pt2.export_pt2`.

``torch.export`` is PyTorch's successor to TorchScript (``torch.jit`` is deprecated since PyTorch 2.10, and this
library no longer reads or writes TorchScript): an ``ExportedProgram`` of ATen operators, run here by PyTorch
itself, any batch size.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from torch import Tensor

from ssd._utils import as_hw, compact_size
from ssd.inference.backends import OnnxModelError, read_metadata

__all__ = ["METADATA_FILE", "ExportedProgramBackend", "network_digest", "program_digest", "open_pt2"]

METADATA_FILE = "ssd.json"


def network_digest(code: str, tensors: dict[str, Tensor]) -> str:
    """SHA-256 of a serialized network's ``code`` and of its named ``tensors`` (name, dtype, shape, bytes), as hex."""
    digest = hashlib.sha256(code.encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def program_digest(program: torch.export.ExportedProgram) -> str:
    """:func:`network_digest` of an exported program's graph code and of every parameter, buffer and tensor
    constant."""
    constants = {k: v for k, v in program.constants.items() if isinstance(v, Tensor)}
    return network_digest(program.graph_module.code, {**program.state_dict, **constants})


class ExportedProgramBackend:
    """An exported SSD network (``torch.export``) on ``device``; its metadata (the ONNX export's keys) is validated
    and its checksum (``program_sha256``) verified at load. ``batch [B, 3, S, S]`` -> ``(loc, logits)`` as the eager
    model."""

    name = "pt2"
    nms = False
    digest_key = "program_sha256"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        self.path = self.source = Path(path)
        self.device = torch.device(device)
        extra = {METADATA_FILE: ""}
        try:
            program = torch.export.load(self.path, extra_files=extra)
        except Exception as e:  # a damaged archive fails in zipfile, the unpickler or the graph schema
            raise OnnxModelError(f"cannot load torch.export model {self.path}: {e}") from e
        try:
            raw = json.loads(extra[METADATA_FILE] or "{}")
        except json.JSONDecodeError as e:
            raise OnnxModelError(f"{self.path}: its {METADATA_FILE} is not JSON ({e}); export it again") from e
        meta = read_metadata(self.path, raw if isinstance(raw, dict) else {})
        if raw.get(self.digest_key) != program_digest(program):
            raise OnnxModelError(f"{self.path}: the code or weights do not match the checksum stored at export "
                                 f"({self.digest_key}, missing or different): the file was modified after `ssd "
                                 "export`; export it again")
        self.module = program.module().to(self.device)
        self.model_name, self.class_names = meta["model_name"], meta["class_names"]
        self.category_ids = meta["category_ids"]
        self.operating_point = meta["operating_point"]
        self.image_size = compact_size(meta["image_size"])
        self.mean, self.std, self.variances = tuple(meta["mean"]), tuple(meta["std"]), tuple(meta["variances"])
        self._priors: Tensor | None = None

    @property
    def priors(self) -> Tensor:
        """``[P, 4]``, the program's ``priors`` output (computed once on a blank batch if no batch ran yet)."""
        if self._priors is None:
            self(torch.zeros(1, 3, *as_hw(self.image_size)))
        return self._priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])``."""
        with torch.no_grad():
            loc, logits, self._priors = self.module(batch.to(self.device))
        return loc, logits


def open_pt2(path: Path, device: torch.device, half: bool) -> ExportedProgramBackend:
    """A ``.pt2`` file of ``ssd export --format pt2`` (float32: ``half`` is refused)."""
    if half:
        raise ValueError(f"half precision applies to PyTorch checkpoints, not to the torch.export model {path}")
    return ExportedProgramBackend(path, device)

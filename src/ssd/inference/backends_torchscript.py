"""The TorchScript backend: a ``.torchscript`` file written by :func:`ssd.export.torchscript.export_torchscript`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from ssd._utils import as_hw, compact_size
from ssd.inference.backends import OnnxModelError, read_metadata

__all__ = ["METADATA_FILE", "TorchScriptBackend", "module_digest", "network_digest", "open_torchscript"]

METADATA_FILE = "ssd.json"


def network_digest(code: str, tensors: dict[str, Tensor]) -> str:
    """SHA-256 of a serialized network's ``code`` and of its named ``tensors`` (name, dtype, shape, bytes), as hex."""
    digest = hashlib.sha256(code.encode())
    for name, tensor in sorted(tensors.items()):
        digest.update(f"{name}:{tensor.dtype}:{list(tensor.shape)}".encode())
        digest.update(tensor.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def module_digest(module: torch.jit.ScriptModule) -> str:
    """:func:`network_digest` of a scripted module's code, parameters and buffers."""
    return network_digest(module.code, {**dict(module.named_parameters()), **dict(module.named_buffers())})


class TorchScriptBackend:
    """A traced SSD network on ``device``; its metadata (the ONNX export's keys) is validated and its checksum
    (``module_sha256``) verified at load. ``batch [B, 3, S, S]`` -> ``(loc, logits)`` as the eager model.

    Subclasses read another serialized PyTorch network with the same metadata: they set ``name`` and
    ``digest_key`` and override :meth:`_read` (:class:`ssd.inference.backends_pt2.ExportedProgramBackend`)."""

    name = "torchscript"
    nms = False
    digest_key = "module_sha256"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        self.path = self.source = Path(path)
        self.device = torch.device(device)
        self.module, text, digest = self._read()
        try:
            raw = json.loads(text or "{}")
        except json.JSONDecodeError as e:
            raise OnnxModelError(f"{self.path}: its {METADATA_FILE} is not JSON ({e}); export it again") from e
        meta = read_metadata(self.path, raw if isinstance(raw, dict) else {})
        if raw.get(self.digest_key) != digest:
            raise OnnxModelError(f"{self.path}: the code or weights do not match the checksum stored at export "
                                 f"({self.digest_key}, missing or different): the file was modified after `ssd "
                                 "export`; export it again")
        self.model_name, self.class_names = meta["model_name"], meta["class_names"]
        self.category_ids = meta["category_ids"]
        self.operating_point = meta["operating_point"]
        self.image_size = compact_size(meta["image_size"])
        self.mean, self.std, self.variances = tuple(meta["mean"]), tuple(meta["std"]), tuple(meta["variances"])
        self._priors: Tensor | None = None


    def _read(self) -> tuple[Callable[[Tensor], tuple[Tensor, Tensor, Tensor]], str, str]:
        """``(the network, its metadata JSON text, the digest of its code and weights)``."""
        extra = {METADATA_FILE: ""}
        try:
            module = torch.jit.load(str(self.path), map_location=self.device, _extra_files=extra).eval()
        except (RuntimeError, ValueError) as e:  # torch.jit raises RuntimeError for a file it cannot read
            raise OnnxModelError(f"cannot load TorchScript model {self.path}: {e}") from e
        return module, extra[METADATA_FILE], module_digest(module)

    @property
    def priors(self) -> Tensor:
        """``[P, 4]``, the module's ``priors`` output (computed once on a blank batch if no batch ran yet)."""
        if self._priors is None:
            self(torch.zeros(1, 3, *as_hw(self.image_size)))
        return self._priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])``."""
        with torch.no_grad():
            loc, logits, self._priors = self.module(batch.to(self.device))
        return loc, logits


def open_torchscript(path: Path, device: torch.device, half: bool) -> TorchScriptBackend:
    """A ``.torchscript`` file of ``ssd export`` (float32: ``half`` is refused)."""
    if half:
        raise ValueError(f"half precision applies to PyTorch checkpoints, not to the TorchScript model {path}")
    return TorchScriptBackend(path, device)

"""The ``torch.export`` backend: a ``.pt2`` file written by :func:`ssd.export.pt2.export_pt2`.

``torch.export`` is PyTorch's successor to TorchScript (``torch.jit`` is deprecated since PyTorch 2.10, and this
library no longer reads or writes TorchScript): an ``ExportedProgram`` of ATen operators, run here by PyTorch
itself, any batch size.

``torch.export.load`` unpickles what an archive marks as pickled (weights, constants, custom objects) and falls
back to a full unpickler for sample inputs the safe one refuses, so an archive is opened only after
:func:`check_archive` found none of that: no file runs code.
"""

from __future__ import annotations

import functools
import io
import json
import math
import re
import zipfile
from pathlib import Path

import torch
from torch import Tensor

import ssd.limits as limits
from ssd.card import ModelCard, network_digest, strings_from_json
from ssd.errors import ConfigError, OnnxModelError

__all__ = ["METADATA_FILE", "ExportedProgramBackend", "program_digest", "program_bytes", "check_archive", "open_pt2"]

METADATA_FILE = "ssd.json"

_MEMBERS = re.compile(r"archive_format|archive_version|byteorder|\.data/version|\.data/serialization_id"
                      r"|models/\w+\.json|data/(weights|constants)/\w+_(weights|constants)_config\.json"
                      r"|data/weights/weight_\d+|data/constants/tensor_\d+|data/sample_inputs/\w+\.pt"
                      r"|extra/[\w.]+")
"""The members of an archive :func:`ssd.export.pt2.export_pt2` writes (under the archive's root folder): raw tensor
bytes, JSON, sample inputs (a ``torch.save`` of tensors) and extra files. Anything else (pickled constants, custom
objects, compiled kernels) is refused."""


def program_digest(program: torch.export.ExportedProgram) -> str:
    """:func:`ssd.card.network_digest` of an exported program's graph code and of every parameter, buffer and tensor
    constant: the network digest of a ``.pt2`` artifact's card."""
    constants = {k: v for k, v in program.constants.items() if isinstance(v, Tensor)}
    return network_digest(program.graph_module.code, {**program.state_dict, **constants})


def _at_batch_one(size) -> int:
    """A dimension of a traced shape, its symbols (the dynamic batch) set to 1."""
    if isinstance(size, int):
        return size
    expr = size.node.expr
    return int(expr.subs(dict.fromkeys(expr.free_symbols, 1)))


def program_bytes(program: torch.export.ExportedProgram) -> int:
    """The bytes of every tensor a program's graph makes or holds, at batch 1, summed (an upper bound of its memory:
    as if none were freed), from the shapes traced with it: no tensor is allocated."""
    total = 0
    for node in program.graph.nodes:
        values = node.meta.get("val")
        for value in values if isinstance(values, (list, tuple)) else [values]:
            if isinstance(value, Tensor):
                total += math.prod(map(_at_batch_one, value.shape)) * value.element_size()
    return total


def check_archive(path: Path) -> None:
    """Refuse (:class:`~ssd.errors.OnnxModelError`, naming the member) a ``.pt2`` archive that
    would make ``torch.export.load`` unpickle anything: a member that is not raw tensor bytes, JSON or an extra
    file, a weight or constant its configuration marks as pickled, or sample inputs that are not plain tensors (read
    here with ``torch.load(weights_only=True)``, which runs no code). A member read here larger than
    :data:`ssd.limits.MAX_ARCHIVE_MEMBER_BYTES`, or members larger than :data:`ssd.limits.MAX_GRAPH_BYTES` in all,
    are refused by the sizes the zip directory states, before reading them (reading stops at the stated size)."""
    member_name = None
    try:
        with zipfile.ZipFile(path) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            total = sum(m.file_size for m in members)
            if total > limits.MAX_GRAPH_BYTES:
                raise OnnxModelError(f"{path} is refused: its members hold {total / 2**30:.1f} GiB unpacked, more than "
                                     f"a torch.export archive of ssd may (limits.MAX_GRAPH_BYTES, "
                                     f"{limits.MAX_GRAPH_BYTES / 2**30:g} GiB)")
            for member in members:
                name, member_name = member.filename.partition("/")[2], member.filename  # under the root folder
                if not _MEMBERS.fullmatch(name):
                    raise OnnxModelError(f"{path} is refused: its member {member.filename} is not part of a "
                                         "torch.export archive of ssd (loading it could run code); export the model "
                                         "again with `ssd export --format pt2`")
                read = name.endswith(".json") or name.startswith("data/sample_inputs/")
                if read and member.file_size > limits.MAX_ARCHIVE_MEMBER_BYTES:
                    raise OnnxModelError(f"{path} is refused: its member {member.filename} unpacks to "
                                         f"{member.file_size / 2**20:.0f} MiB, more than the "
                                         f"{limits.MAX_ARCHIVE_MEMBER_BYTES / 2**20:g} MiB such a member of ssd's "
                                         "archives may take (limits.MAX_ARCHIVE_MEMBER_BYTES); it was not read")
                if name.endswith(("_weights_config.json", "_constants_config.json")):
                    _check_payloads(path, member.filename, json.loads(archive.read(member)))
                elif name.startswith("data/sample_inputs/"):
                    torch.load(io.BytesIO(archive.read(member)), weights_only=True)
    except OnnxModelError:
        raise
    except Exception as e:  # zipfile, JSON or the safe unpickler: its message would advise loading unsafely
        where = f"its member {member_name} cannot be read as plain data ({type(e).__name__})" if member_name else (
            f"it is not a zip archive ({type(e).__name__})")
        raise OnnxModelError(f"{path} is refused: {where}; a torch.export archive of ssd holds only raw tensors, "
                             "JSON and plain tensors, and loads without running code") from None


def _check_payloads(path: Path, member: str, config: dict) -> None:
    """Every entry of a weights or constants configuration is raw tensor bytes, not a pickle."""
    for name, entry in config.get("config", {}).items():
        if entry.get("use_pickle") is not False or not str(entry.get("path_name", "")).startswith(("weight_",
                                                                                                  "tensor_")):
            raise OnnxModelError(f"{path} is refused: {member} marks {name} as pickled (loading it would run code); "
                                 "export the model again with `ssd export --format pt2`")


class ExportedProgramBackend:
    """An exported SSD network (``torch.export``) on ``device``; its model card (``ssd.json``) is validated and
    checked against its checksum (the program's code and tensors, and every field) at load. ``batch [B, 3, S, S]``
    -> ``(loc, logits)`` as the eager model."""

    name = "pt2"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        self.path = self.source = Path(path)
        self.device = torch.device(device)
        extra = {METADATA_FILE: ""}
        check_archive(self.path)
        try:
            program = torch.export.load(self.path, extra_files=extra)
        except Exception as e:  # a damaged archive fails in zipfile, the unpickler or the graph schema
            raise OnnxModelError(f"cannot load torch.export model {self.path}: {e}") from e
        raw = strings_from_json(extra[METADATA_FILE] or "{}", f"{self.path}: its {METADATA_FILE}", OnnxModelError)
        digest = functools.cache(lambda: program_digest(program))  # the card's checksum or the one of before it
        self.card = ModelCard.from_file_strings(raw, digest, {"program_sha256": digest}, str(self.path),
                                                OnnxModelError)
        limits.check_graph_bytes(program_bytes(program), str(self.path), OnnxModelError)  # before it runs
        self.module = program.module().to(self.device)
        self._priors: Tensor | None = None

    @property
    def priors(self) -> Tensor:
        """``[P, 4]``, the program's ``priors`` output (computed once on a blank batch if no batch ran yet)."""
        if self._priors is None:
            self(torch.zeros(1, 3, *self.card.image_size))
        return self._priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])``."""
        with torch.no_grad():
            loc, logits, self._priors = self.module(batch.to(self.device))
        return loc, logits


def open_pt2(path: Path, device: torch.device, half: bool) -> ExportedProgramBackend:
    """A ``.pt2`` file of ``ssd export --format pt2`` (float32: ``half`` is refused)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to the torch.export model {path}")
    return ExportedProgramBackend(path, device)

"""The OpenVINO backend: an IR folder written by :func:`ssd.export.openvino.export_openvino`.

``precision``: ``"f32"`` (default; OpenVINO's own default on a CPU with AMX is bf16, which moves scores by about
2e-3 and changes which boxes survive NMS) or ``"bf16"``. INT8 IR runs its quantized layers in INT8 either way.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

import ssd.limits as limits
from ssd.card import strings_from_json
from ssd.errors import ConfigError, OnnxModelError
from ssd.inference.backends.onnx import OnnxBackend
from ssd.optional import require

if TYPE_CHECKING:
    import torch

__all__ = ["IR_FILES", "METADATA_FILE", "OPENVINO_PRECISIONS", "OpenVinoBackend", "file_digest", "sidecar_card",
           "ir_bytes", "ir_digest", "require_openvino", "open_openvino", "open_openvino_bf16"]

IR_FILES = ("model.xml", "model.bin")
METADATA_FILE = "metadata.json"
OPENVINO_PRECISIONS = ("f32", "bf16")


def require_openvino(nncf: bool = False):
    """The ``openvino`` module (and NNCF, with ``nncf``), or :class:`ssd.errors.MissingDependencyError` naming the
    extra to install."""
    if nncf:
        require("nncf", "openvino", "OpenVINO INT8 export")
    return require("openvino", "openvino", "OpenVINO export and inference")


@functools.cache
def openvino_core():
    """The process's one ``openvino.Core``, kept for the process's lifetime: OpenVINO's own advice (one Core per
    process), and a Core destroyed while others' threads live makes a later ``fork`` (a subprocess, data-loader
    workers) crash the process."""
    return require_openvino().Core()


def sidecar_card(folder: Path, fmt: str) -> dict[str, str]:
    """The model card's strings in ``folder``'s ``metadata.json``, the sidecar of a folder export of format ``fmt``
    (OpenVINO, NCNN); :class:`~ssd.errors.OnnxModelError` when there is none."""
    sidecar = folder / METADATA_FILE
    if not sidecar.is_file():
        raise OnnxModelError(f"{folder} is not an `ssd export --format {fmt}` folder (no {METADATA_FILE}); export it "
                             f"with `ssd export --weights CKPT --format {fmt}`")
    return strings_from_json(sidecar.read_bytes(), str(sidecar), OnnxModelError)


def file_digest(path: Path) -> str:
    """SHA-256 of a file's bytes, as hex."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def ir_digest(folder: Path) -> str:
    """SHA-256 of an IR folder's ``model.xml`` and ``model.bin`` (their :func:`file_digest` in turn): the network
    digest of an OpenVINO artifact's card."""
    return hashlib.sha256(":".join(file_digest(folder / name) for name in IR_FILES).encode()).hexdigest()


def ir_bytes(model) -> int:
    """The bytes of every output of every operation of an ``openvino.Model`` (constants included; not the results,
    which are their inputs) at batch 1, summed (an upper bound of its memory), from the shapes the IR states: a
    dynamic dimension counts 1."""
    return sum(math.prod(d.get_length() if d.is_static else 1 for d in out.get_partial_shape())
               * out.get_element_type().size
               for op in model.get_ordered_ops() if op.get_type_name() != "Result"
               for out in op.outputs() if out.get_partial_shape().rank.is_static)


def _ports(ports) -> list[SimpleNamespace]:
    """OpenVINO ports as ONNX Runtime describes its inputs/outputs: ``name``, ``shape`` (a string where dynamic),
    ``type`` (``tensor(uint8)`` for the pixels of a ``--uint8-input`` graph)."""
    return [SimpleNamespace(name=p.get_any_name(), shape=[d.get_length() if d.is_static else "dynamic"
                                                          for d in p.get_partial_shape()],
                            type=f"tensor({p.get_element_type().to_dtype()})") for p in ports]


class _OpenVinoSession:
    """A compiled OpenVINO model behind the ONNX Runtime session methods :class:`OnnxBackend` calls."""

    def __init__(self, compiled):
        self.compiled = compiled

    def get_inputs(self) -> list[SimpleNamespace]:
        return _ports(self.compiled.inputs)

    def get_outputs(self) -> list[SimpleNamespace]:
        return _ports(self.compiled.outputs)

    def run(self, _names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        results = self.compiled(feeds["images"])
        return [results[output] for output in self.compiled.outputs]


class OpenVinoBackend(OnnxBackend):
    """An ``ssd export --format openvino`` folder (or its ``model.xml``) on OpenVINO's CPU plugin, with the metadata
    card rules, graph checks and outputs of :class:`OnnxBackend`; the IR files and the card (``metadata.json``) must
    match the card's checksum."""

    name = "openvino"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", precision: str = "f32"):
        if precision not in OPENVINO_PRECISIONS:
            raise ConfigError(f"OpenVINO precision must be one of {', '.join(OPENVINO_PRECISIONS)}, got {precision!r}")
        path = Path(path)
        self.precision = precision
        super().__init__(path.parent if path.suffix.lower() == ".xml" else path, device)

    def _card_strings(self) -> dict[str, str]:
        """The card of ``metadata.json``, checked (with the IR files) before OpenVINO reads or compiles anything."""
        return sidecar_card(self.path, "openvino")

    def _open_session(self, device: str | torch.device) -> _OpenVinoSession:
        if str(device) != "cpu":
            raise ConfigError(f"the OpenVINO backend runs on the CPU, got device={str(device)!r}")
        core = openvino_core()
        try:
            model = core.read_model(str(self.path / IR_FILES[0]))
        except RuntimeError as e:  # OpenVINO raises RuntimeError subclasses for files it cannot read
            raise OnnxModelError(f"cannot load OpenVINO model {self.path}: {e}") from e
        limits.check_graph_bytes(ir_bytes(model), str(self.path), OnnxModelError)  # before compiling
        try:
            compiled = core.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": self.precision})
        except RuntimeError as e:
            raise OnnxModelError(f"cannot load OpenVINO model {self.path}: {e}") from e
        return _OpenVinoSession(compiled)

    def _check_files(self) -> None:
        """Refuse a folder that lacks an IR file, by name."""
        for name in IR_FILES:
            if not (self.path / name).is_file():
                raise OnnxModelError(f"{self.path}: {name} is missing; export the model again")

    def _legacy_checksums(self) -> dict[str, Callable[[], str]]:
        """:func:`file_digest` of each IR file (a missing one is refused by name), as files written before the model
        card store them."""
        self._check_files()
        return {key: functools.partial(file_digest, self.path / name)
                for key, name in zip(("xml_sha256", "bin_sha256"), IR_FILES)}

    def network_digest(self) -> str:
        """:func:`ir_digest` of the folder (a missing file is refused by name; each file is read once)."""
        self._check_files()
        return ir_digest(self.path)


def open_openvino(path: Path, device: torch.device, half: bool, precision: str = "f32") -> OpenVinoBackend:
    """An ``ssd export --format openvino`` folder or its ``model.xml`` (``f32`` precision: ``half`` is refused)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to the OpenVINO model {path}")
    return OpenVinoBackend(path, device, precision)


def open_openvino_bf16(path: Path, device: torch.device, half: bool) -> OpenVinoBackend:
    """:func:`open_openvino` with the ``bf16`` precision hint (the ``openvino-bf16`` runtime)."""
    return open_openvino(path, device, half, "bf16")

"""The NCNN backend: a folder written by :func:`ssd.export.ncnn.export_ncnn` (``model.ncnn.param``,
``model.ncnn.bin``, ``priors.npy`` and the card, ``metadata.json``), run by the ``ncnn`` Python package.

NCNN runs one image at a time (the exported batch is 1; :class:`~ssd.inference.backends.onnx.OnnxBackend` splits a
batch) with FP16 storage, its default: weights and activations kept in half precision, arithmetic in float32.
The graph returns the head outputs; the default boxes, constant, are ``priors.npy``. The three files and the card
must match the card's checksum, checked before NCNN reads the graph.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from ssd.errors import ConfigError, OnnxModelError
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.backends.openvino import METADATA_FILE, file_digest, sidecar_card
from ssd.optional import require

if TYPE_CHECKING:
    import torch

__all__ = ["NCNN_FILES", "METADATA_FILE", "FILE_DIGESTS", "NcnnBackend", "ncnn_digest", "open_ncnn"]

NCNN_FILES = ("model.ncnn.param", "model.ncnn.bin", "priors.npy")
FILE_DIGESTS = "_sha256"
"""The suffix of the metadata keys (``model.ncnn.bin_sha256``, ...) storing each file's digest, which name the file
that was edited."""
BLOBS = {"images": "in0", "loc": "out0", "logits": "out1"}
"""Our names -> the blob names pnnx gives the graph's input and outputs."""


def ncnn_digest(folder: Path) -> str:
    """SHA-256 of the :data:`NCNN_FILES` of ``folder`` (their digests in turn): the network digest of its card."""
    return hashlib.sha256(":".join(file_digest(folder / name) for name in NCNN_FILES).encode()).hexdigest()


class _NcnnSession:
    """An ``ncnn.Net`` behind the ONNX Runtime session methods :class:`OnnxBackend` calls (one image per run)."""

    def __init__(self, net, priors: np.ndarray, image_size: tuple[int, int]):
        self.net, self.priors, self.image_size = net, priors, image_size

    def get_inputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name="images", shape=[1, 3, *self.image_size])]

    def get_outputs(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name, shape=["dynamic"]) for name in ("loc", "logits", "priors")]

    def run(self, _names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        ncnn = require("ncnn", "ncnn", "running an NCNN model")
        with self.net.create_extractor() as extractor:
            extractor.input(BLOBS["images"], ncnn.Mat(np.ascontiguousarray(feeds["images"][0])))
            outputs = []
            for name in ("loc", "logits"):
                code, mat = extractor.extract(BLOBS[name])
                if code != 0:
                    raise OnnxModelError(f"NCNN could not compute the graph's {name} (error {code})")
                outputs.append(np.array(mat)[None])
        return [*outputs, self.priors]


class NcnnBackend(OnnxBackend):
    """An ``ssd export --format ncnn`` folder (or its ``model.ncnn.param``) on NCNN's CPU path, with the card rules,
    checksum and output checks of :class:`OnnxBackend`."""

    name = "ncnn"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        path = Path(path)
        super().__init__(path.parent if path.suffix.lower() == ".param" else path, device)

    def _card_strings(self) -> dict[str, str]:
        self._stored = sidecar_card(self.path, "ncnn")
        return self._stored

    def _open_session(self, device: str | torch.device) -> _NcnnSession:
        if str(device) != "cpu":
            raise ConfigError(f"the NCNN backend runs on the CPU here, got device={str(device)!r}")
        ncnn = require("ncnn", "ncnn", "running an NCNN model")
        net = ncnn.Net()
        net.opt.use_fp16_storage = True  # NCNN's default, said here: the precision this export was checked at
        if net.load_param(str(self.path / NCNN_FILES[0])) != 0 or net.load_model(str(self.path / NCNN_FILES[1])) != 0:
            raise OnnxModelError(f"cannot load NCNN model {self.path}: NCNN refused its param or bin file")
        priors = np.load(self.path / NCNN_FILES[2], allow_pickle=False)
        if priors.dtype != np.float32 or priors.ndim != 2 or priors.shape[1] != 4:
            raise OnnxModelError(f"{self.path}: {NCNN_FILES[2]} holds {priors.dtype} {list(priors.shape)}, not the "
                                 "[P, 4] float32 default boxes")
        return _NcnnSession(net, priors, self.card.image_size)

    def _check_files(self) -> None:
        for name in NCNN_FILES:
            if not (self.path / name).is_file():
                raise OnnxModelError(f"{self.path}: {name} is missing; export the model again")

    def _legacy_checksums(self) -> dict[str, Callable[[], str]]:
        return {}  # no NCNN export predates the model card

    def network_digest(self) -> str:
        """:func:`ncnn_digest` of the folder; a missing file, or one whose digest differs from the one
        :data:`FILE_DIGESTS` stores at export, is refused by name (the card's checksum covers them all)."""
        self._check_files()
        for name in NCNN_FILES:
            stored = self._stored.get(f"{name}{FILE_DIGESTS}")
            if stored is not None and stored != file_digest(self.path / name):
                raise OnnxModelError(f"{self.path / name} was modified after `ssd export` (it is not the file whose "
                                     "digest the export stored): export the model again")
        return ncnn_digest(self.path)


def open_ncnn(path: Path, device: str | torch.device, half: bool) -> NcnnBackend:
    """An ``ssd export --format ncnn`` folder or its ``model.ncnn.param`` (``half`` is refused: FP16 storage is
    NCNN's own)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to the NCNN model {path} (it stores "
                         "FP16 already)")
    return NcnnBackend(path, device)

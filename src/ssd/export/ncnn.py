"""Export to NCNN: ``model.ncnn.param`` + ``model.ncnn.bin`` converted by ``pnnx`` from the ``ssd export`` ONNX
graph (raw outputs, batch 1), FP16 storage as NCNN's default, ``priors.npy`` (the default boxes, a constant pnnx
folds away) and ``metadata.json``, the model card sealed over the three files
(:func:`ssd.inference.backends.ncnn.ncnn_digest`).

pnnx runs as a subprocess in a temporary folder: a converter that crashes or runs out of memory leaves nothing
behind, and what it prints is reduced to one line. The NCNN files are then run by the ``ncnn`` package and compared
with the ONNX graph (itself checked against PyTorch) before anything is moved into the output folder.
INT8: NCNN quantizes with its ``ncnn2table`` and ``ncnn2int8`` command-line tools, which the ``ncnn`` Python package
does not ship: not offered here (docs/deploy.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ssd.errors import ConfigError, ExportCheckError
from ssd.export.onnx import onnx_metadata
from ssd.files import write_text
from ssd.inference.backends.ncnn import FILE_DIGESTS, METADATA_FILE, NCNN_FILES, NcnnBackend, ncnn_digest
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.backends.openvino import file_digest
from ssd.optional import require

__all__ = ["export_ncnn", "NCNN_BOX_TOL", "NCNN_SCORE_TOL"]

NCNN_BOX_TOL = 1e-2
"""Largest box difference (of the image size) the check allows NCNN's FP16 storage against the FP32 graph."""
NCNN_SCORE_TOL = 1e-2
"""Largest class score difference the check allows (FP16 storage rounds activations to 11 significant bits)."""


def export_ncnn(onnx_path: str | Path, out_dir: str | Path, calibration: Sequence[Path] | None = None) -> Path:
    """Convert an ``ssd export`` ONNX file (raw outputs; batch 1 is what NCNN runs) to an NCNN folder ``out_dir``
    (see the module docstring), checked against the ONNX graph. Returns ``out_dir``.

    Raises:
        ValueError: ``calibration`` given (NCNN INT8 is not reachable from Python).
        ExportCheckError: pnnx failed (its last line), or NCNN's outputs differ beyond the tolerances; nothing is
            written then.
    """
    if calibration is not None:
        raise ConfigError("--int8 does not apply to NCNN exports: NCNN quantizes with its ncnn2table and ncnn2int8 "
                         "tools, which the ncnn Python package does not ship (see docs/deploy.md)")
    pnnx = require("pnnx", "ncnn", "NCNN export")
    require("ncnn", "ncnn", "NCNN export")
    reference = OnnxBackend(onnx_path)  # checked, carried over
    card = reference.card
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".ssd-ncnn-", dir=out_dir.parent) as work:
        work = Path(work)
        graph = work / "model.onnx"
        graph.write_bytes(Path(onnx_path).read_bytes())
        shape = f"[1,3,{card.image_size[0]},{card.image_size[1]}]"
        quiet = dict.fromkeys(("pnnxparam", "pnnxbin", "pnnxpy", "pnnxonnx", "ncnnpy"), os.devnull)
        # names relative to its folder: pnnx derives names from the path up to its first dot
        done = subprocess.run([pnnx.EXEC_PATH, graph.name, f"inputshape={shape}", "fp16=1",
                               f"ncnnparam={NCNN_FILES[0]}", f"ncnnbin={NCNN_FILES[1]}",
                               *(f"{key}={value}" for key, value in quiet.items())],
                              cwd=work, capture_output=True, text=True)
        if done.returncode != 0 or not (work / NCNN_FILES[0]).is_file():
            last = (done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}").splitlines()[-1]
            raise ExportCheckError(f"pnnx could not convert {onnx_path} to NCNN ({last[:200]}); nothing was written")
        np.save(work / NCNN_FILES[2], reference.priors.numpy().astype(np.float32), allow_pickle=False)
        digests = {f"{name}{FILE_DIGESTS}": file_digest(work / name) for name in NCNN_FILES}  # name an edited file
        metadata = {**onnx_metadata(card.sealed(ncnn_digest(work))), **digests}
        write_text(work / METADATA_FILE, json.dumps(metadata, indent=1))
        _check(reference, work, onnx_path)
        out_dir.mkdir(exist_ok=True)
        (out_dir / METADATA_FILE).unlink(missing_ok=True)  # the folder is incomplete until the metadata is in
        for name in NCNN_FILES:
            os.replace(work / name, out_dir / name)
        os.replace(work / METADATA_FILE, out_dir / METADATA_FILE)
    return out_dir


def _check(reference: OnnxBackend, folder: Path, onnx_path: str | Path) -> None:
    """NCNN against the ONNX graph through the same pipeline (:func:`ssd.export.parity.check_backend`)."""
    from ssd.export.parity import check_backend

    try:
        check_backend(reference, NcnnBackend(folder), "NCNN", box_tol=NCNN_BOX_TOL, score_tol=NCNN_SCORE_TOL)
    except ExportCheckError as e:
        raise ExportCheckError(f"{str(e).replace(str(folder), str(onnx_path))}; nothing was written") from None

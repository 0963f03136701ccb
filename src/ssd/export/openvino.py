"""Export to OpenVINO IR: ``model.xml`` + ``model.bin`` converted from the ``ssd export`` ONNX graph (FP32 weights),
or quantized to INT8 by NNCF post-training quantization on the calibration images of :mod:`ssd.export.quantize`.

The artifact is a folder: ``model.xml``, ``model.bin`` and ``metadata.json``, the ONNX file's model card as strings
(``precision`` ``int8`` after NNCF) sealed with the two IR files (:func:`ssd.inference.backends.openvino.ir_digest`),
verified by :class:`ssd.inference.backends.openvino.OpenVinoBackend` at load. Inputs and outputs keep the ONNX
graph's names and shapes (raw outputs, or detections with ``--nms``).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ssd.export.onnx import onnx_metadata
from ssd.export.quantize import calibration_input
from ssd.files import write_text
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.backends.openvino import IR_FILES, METADATA_FILE, ir_digest, require_openvino

__all__ = ["export_openvino"]


def export_openvino(onnx_path: str | Path, out_dir: str | Path, calibration: Sequence[Path] | None = None) -> Path:
    """Convert an ``ssd export`` ONNX file to an OpenVINO IR folder ``out_dir`` (see the module docstring); with
    ``calibration`` (image paths) quantize it to INT8 with NNCF. Returns ``out_dir``.

    The IR files are written next to ``out_dir`` first and moved in, ``metadata.json`` last, so a folder with a
    ``metadata.json`` always holds a complete export."""
    ov = require_openvino()
    card = OnnxBackend(onnx_path).card  # checked, carried over
    model = ov.convert_model(str(onnx_path))
    if calibration is not None:
        import nncf

        dataset = nncf.Dataset(list(calibration), lambda path: calibration_input(path, card.image_size, card.mean,
                                                                                  card.std))
        model = nncf.quantize(model, dataset, subset_size=len(calibration))
        card = card.replace(precision="int8")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / METADATA_FILE).unlink(missing_ok=True)  # the folder is incomplete until the new metadata is in
    with tempfile.TemporaryDirectory(prefix=".ssd-openvino-", dir=out_dir.parent) as work:
        ov.save_model(model, str(Path(work) / IR_FILES[0]), compress_to_fp16=False)
        for name in IR_FILES:
            os.replace(Path(work) / name, out_dir / name)
    write_text(out_dir / METADATA_FILE, json.dumps(onnx_metadata(card.sealed(ir_digest(out_dir))), indent=1))
    return out_dir

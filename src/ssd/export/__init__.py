"""Export: ONNX (FP32, INT8), OpenVINO and torch.export artifacts, the parity check against PyTorch, and
``ssd benchmark`` over every format.

:func:`run_export` is the one entry of ``ssd export`` for every artifact format (the kinds of
:data:`ssd.artifacts.ARTIFACTS` with an exporter), its options checked by :class:`ssd.schemas.ExportConfig` before
any work is done (:func:`export`: the same from keyword arguments); it imports each format's exporter (and its
runtime: ONNX, OpenVINO) only when called, so ``import ssd.export`` loads none of them.

| format       | artifact                                        | loaded by                |
|--------------|-------------------------------------------------|--------------------------|
| ``onnx``     | ``.onnx`` (FP32, or INT8 with ``int8=True``)    | ONNX Runtime, OpenCV DNN |
| ``openvino`` | a folder: ``model.xml`` + ``.bin`` + metadata   | OpenVINO                 |
| ``pt2``      | ``.pt2`` (``torch.export`` program + metadata)  | PyTorch                  |
| ``ncnn``     | a folder: ``model.ncnn.param`` + ``.bin`` + ... | NCNN (FP16 storage)      |
| ``tflite``   | ``.tflite`` (FP32, FP16 weights, INT8), uint8   | LiteRT, MediaPipe        |
|              | image in, MediaPipe metadata, card inside       |                          |
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from ssd.artifacts import ARTIFACTS, EXPORT_FORMATS, resolve
from ssd.errors import ConfigError, OutputError
from ssd.files import check_output
from ssd.log import LOGGER
from ssd.schemas import ExportConfig
from ssd.text import few

__all__ = ["FORMATS", "default_output", "check_export_folder", "export", "run_export"]

FORMATS = {name: (ARTIFACTS[name].output_suffix, ARTIFACTS[name].folder) for name in EXPORT_FORMATS}
"""Format -> (the end of the artifact's name, whether it is a folder)."""


def default_output(weights: Path, fmt: str, int8: bool = False, fp16: bool = False) -> Path:
    """``best.pt`` -> ``best.onnx``, ``best.int8.onnx``, ``best_openvino/``, ``best_int8_openvino/``,
    ``best.fp16.tflite``, ..."""
    suffix, folder = FORMATS[fmt]
    if folder:
        return weights.with_name(weights.stem + ("_int8" if int8 else "") + suffix)
    return weights.with_suffix((".int8" if int8 else ".fp16" if fp16 else "") + suffix)


def _check_options(fmt: str, out_path: Path, *, int8: bool, nms: bool, dynamic_batch: bool,
                   uint8_input: bool = False, fp16: bool = False) -> None:
    kind = ARTIFACTS[fmt]
    if uint8_input and (fmt not in ("onnx", "openvino") or int8):
        raise ConfigError("--uint8-input applies to FP32 ONNX and OpenVINO exports (--format onnx or openvino, "
                          "without --int8)")
    flags = (("--nms", nms, "nms"), ("--dynamic-batch", dynamic_batch, "nms"), ("--int8", int8, "int8"))
    given = [(flag, needs) for flag, on, needs in flags if on and not getattr(kind, needs)]
    if given:  # the formats that take every option given, from the one table
        takers = [ARTIFACTS[name].shown for name in EXPORT_FORMATS
                  if all(getattr(ARTIFACTS[name], needs) for _, needs in given)]
        takers_text = " and ".join([", ".join(takers[:-1]), takers[-1]] if len(takers) > 1 else takers)
        verb = "applies" if len(given) == 1 else "apply"
        what = {"tflite": "a TFLite file is the edge pipeline (batch 1, uint8 image in, decoding and NMS by MediaPipe "
                          "or the library)",
                "pt2": "a torch.export program is the network alone (any batch size, post-processing in the library)",
                }.get(fmt, f"an {fmt.upper()} export is the network alone (batch 1, post-processing in the library)")
        raise ConfigError(f"{' and '.join(flag for flag, _ in given)} {verb} to {takers_text} exports: {what}; "
                          "drop them or use --format onnx")
    if fp16 and (fmt != "tflite" or int8):
        raise ConfigError("--fp16 applies to TFLite exports without --int8 (float16 weights): drop it, or use "
                          "--format tflite without --int8")
    if fmt == "tflite":
        from ssd.export.tflite import require_tflite_export

        require_tflite_export()
    if fmt == "openvino":
        from ssd.inference.backends.openvino import require_openvino

        require_openvino(nncf=int8)
    suffix, folder = FORMATS[fmt]
    if not folder and out_path.suffix.lower() != suffix:
        raise ConfigError(f"the output {out_path} of the {fmt} export must end in {suffix} (--output)")


def check_export_folder(folder: Path, exist_ok: bool) -> None:
    """Refuse (:class:`ssd.errors.OutputError`) an existing folder as the output of a folder export, unless
    ``exist_ok`` and it holds an OpenVINO export of this library and nothing else (the user's files are never
    replaced)."""
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    from ssd.inference.backends.ncnn import NCNN_FILES
    from ssd.inference.backends.openvino import IR_FILES, METADATA_FILE

    names = {entry.name for entry in folder.iterdir()}
    kind = next((kind for kind, files in (("OpenVINO", IR_FILES), ("NCNN", NCNN_FILES))
                 if names <= {*files, METADATA_FILE} and _is_card(folder / METADATA_FILE)), None)
    if kind is None:
        raise OutputError(f"--output {folder} is an existing folder that is not an OpenVINO export of ssd (it holds "
                          f"{few(sorted(names))}): choose a new folder")
    if not exist_ok:
        raise OutputError(f"--output {folder} already holds an {kind} export: pass --exist-ok to replace it, or "
                          "choose a new folder")


def _is_card(path: Path) -> bool:
    """Whether ``path`` is the ``metadata.json`` of an export of this library (a model card as strings)."""
    from ssd.card import ModelCard, strings_from_json

    try:
        ModelCard.from_strings(strings_from_json(path.read_bytes(), str(path)), str(path))
    except (OSError, ValueError, TypeError, AttributeError):
        return False
    return True


def export(weights: str | Path, fmt: str = ExportConfig.fmt, out_path: str | Path | None = None, *,
           int8: bool = ExportConfig.int8, data: str | Path | None = ExportConfig.data,
           calib_images: int | None = ExportConfig.calib_images, fp16: bool = ExportConfig.fp16,
           opset: int = ExportConfig.opset,
           nms: bool = ExportConfig.nms, dynamic_batch: bool = ExportConfig.dynamic_batch,
           score_threshold: float = ExportConfig.score_threshold, iou_threshold: float = ExportConfig.iou_threshold,
           max_detections: int = ExportConfig.max_detections, check: bool = ExportConfig.check,
           exist_ok: bool = ExportConfig.exist_ok, sample_images: Sequence | None = None,
           uint8_input: bool = ExportConfig.uint8_input) -> Path:
    """Export a checkpoint or run directory (its best checkpoint) to ``fmt`` and return the artifact's path:
    ``ssd export`` as a function, whose defaults are those of :class:`ssd.schemas.ExportConfig`, which checks every
    option as on the command line before :func:`run_export` does the work.

    ``out_path``: the artifact (default: :func:`default_output`, next to the weights). ``int8``: quantize, calibrated
    on ``calib_images`` images of ``data``'s training split (default: 300, or all of them when it has fewer).
    ``fp16``: float16 weights (TFLite). ``opset``, ``nms``, ``dynamic_batch``, the thresholds (of ``nms``),
    ``check`` (against PyTorch with the format's runtime) and ``sample_images``: see
    :func:`ssd.export.onnx.export_onnx`. ``exist_ok``: replace an OpenVINO export of this library in an existing
    ``out_path`` folder.
    """
    output = None if out_path is None else Path(out_path)
    config = ExportConfig(weights=weights, fmt=fmt, output=output, int8=int8, data=data, calib_images=calib_images,
                          fp16=fp16, opset=opset, nms=nms, dynamic_batch=dynamic_batch, score_threshold=score_threshold,
                          iou_threshold=iou_threshold, max_detections=max_detections, check=check,
                          exist_ok=exist_ok, uint8_input=uint8_input)
    return run_export(config, sample_images)


def run_export(config: ExportConfig, sample_images: Sequence | None = None) -> Path:
    """The export ``config`` describes (``ssd export``), its options checked by the schema; returns the artifact.

    The output defaults to :func:`default_output`; it is never one of the inputs, and an existing folder (OpenVINO)
    is replaced only with ``exist_ok`` and when it holds an OpenVINO export of this library. ``int8`` quantizes on
    ``calib_images`` images of ``data``'s training split (default: 300, or all of them when it has fewer;
    :mod:`ssd.export.quantize`, OpenVINO: NNCF). ``opset``, ``nms``, ``dynamic_batch``, the thresholds, ``check``
    and ``sample_images``: see :func:`ssd.export.onnx.export_onnx`. The options that depend on the format are
    checked, and the calibration images counted, before anything is written. After an INT8 export, a line names the
    faster INT8 format of this CPU when it is another (:mod:`ssd.export.int8_runtime`).
    """
    from ssd.export.int8_runtime import int8_advice

    path = _export(config, sample_images)
    if config.int8 and (advice := int8_advice(config.fmt)) is not None:
        LOGGER.info(advice)
    return path


def _export(config: ExportConfig, sample_images: Sequence | None) -> Path:
    from ssd.export.onnx import write_onnx
    from ssd.export.quantize import calibration_paths
    from ssd.weights.resolve import resolve_weights

    fmt, int8 = config.fmt, config.int8
    if fmt == "torchscript":
        raise ConfigError("TorchScript export is retired (torch.jit is deprecated by PyTorch): use --format pt2 "
                          "(torch.export), the same network any batch size, loaded by PyTorch")
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r} (choose one of {', '.join(FORMATS)})")
    weights = resolve_weights(config.weights)
    out_path = config.output or default_output(weights, fmt, int8, config.fp16)
    check_output(out_path, inputs=[weights, config.data], kind="dir" if FORMATS[fmt][1] else "file",
                 what="--output")
    if FORMATS[fmt][1]:
        check_export_folder(out_path, config.exist_ok)
    _check_options(fmt, out_path, int8=int8, nms=config.nms, dynamic_batch=config.dynamic_batch,
                   uint8_input=config.uint8_input, fp16=config.fp16)
    if config.calib_images is not None and not int8:
        raise ConfigError("--calib-images applies to INT8 exports: add --int8 --data DATA")
    calibration = calibration_paths(config.data, config.calib_images) if int8 else None
    if fmt == "pt2":
        return resolve(ARTIFACTS[fmt].exporter)(weights, out_path)
    if fmt == "tflite":
        return resolve(ARTIFACTS[fmt].exporter)(weights, out_path, calibration, fp16=config.fp16, check=config.check,
                                                sample_images=sample_images)
    onnx_args = dict(config.values("weights", "fmt", "output", "int8", "data", "calib_images", "exist_ok", "fp16"),
                     sample_images=sample_images)
    if fmt == "onnx" and not int8:
        return write_onnx(weights, out_path, **onnx_args)
    with tempfile.TemporaryDirectory(prefix="ssd-export-") as work:
        fp32 = write_onnx(weights, Path(work) / "model.onnx", **onnx_args)
        if ARTIFACTS[fmt].folder:  # OpenVINO, NCNN: converted from the FP32 graph
            return resolve(ARTIFACTS[fmt].exporter)(fp32, out_path, calibration)
        from ssd.export.quantize import quantize_onnx

        return quantize_onnx(fp32, out_path, calibration)

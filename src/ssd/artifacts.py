"""The one table of artifact kinds: what a checkpoint or an export is on disk, who writes it, who opens it.

A row (:class:`ArtifactKind`) says the suffixes a kind's files end in, whether it is a folder (and the file inside
that names it), the function that writes it and the runtimes that open it (``"module:function"`` strings, imported
only when used, so that this module imports nothing), whether ``ssd export`` can put NMS in its graph and quantize it
to INT8, and its ``ssd benchmark`` rows. Everything that lists formats derives from :data:`ARTIFACTS`: the runtime
registry (:data:`ssd.inference.backends.BACKENDS`), ``ssd export``'s formats (:data:`EXPORT_FORMATS`) and their
output names, the benchmark's rows and the command-line choices.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["ArtifactKind", "BenchmarkVariant", "ARTIFACTS", "EXPORT_FORMATS", "BENCHMARK_ROWS",
           "resolve"]


@dataclass(frozen=True)
class BenchmarkVariant:
    """One ``ssd benchmark`` row: ``runtime`` (a key of an :class:`ArtifactKind`'s ``runtimes``) on the kind's
    artifact, exported in INT8 with ``int8``, with float16 weights with ``fp16`` (TFLite), run under bfloat16
    autocast with ``bfloat16`` (PyTorch)."""

    name: str
    runtime: str
    int8: bool = False
    bfloat16: bool = False
    fp16: bool = False


@dataclass(frozen=True)
class ArtifactKind:
    """A kind of model file.

    Attributes:
        name: the kind (``ssd export --format`` for an exported one).
        suffixes: the file suffixes it opens by (lower case); the first is what ``ssd export`` writes, or, for a
            folder, the end of the folder's default name.
        runtimes: runtime name -> ``"module:function"`` opener ``(path, device, half) -> Backend``; the first is
            the one its files open with, the others are asked for by name (``ssd benchmark``'s rows).
        exporter: ``"module:function"`` that writes it, ``None`` for what training writes (``.pt``).
        folder_file: for a folder artifact, the file that names it (a folder holding it is this kind).
        nms, int8: ``ssd export`` can put NMS in its graph (and a fixed or dynamic batch), quantize it to INT8.
        benchmark: its ``ssd benchmark`` rows, in order.
        title: its name in messages (``OpenVINO``); default the name in capitals.
    """

    name: str
    suffixes: tuple[str, ...]
    runtimes: dict[str, str]
    exporter: str | None = None
    folder_file: str | None = None
    nms: bool = False
    int8: bool = False
    benchmark: tuple[BenchmarkVariant, ...] = field(default=())
    title: str = ""

    @property
    def shown(self) -> str:
        return self.title or self.name.upper()

    @property
    def folder(self) -> bool:
        return self.folder_file is not None

    @property
    def output_suffix(self) -> str:
        """The end of the name ``ssd export`` gives it: ``.onnx``, or ``_openvino`` for a folder."""
        return f"_{self.name}" if self.folder else self.suffixes[0]


ARTIFACTS: dict[str, ArtifactKind] = {kind.name: kind for kind in (
    ArtifactKind("pt", (".pt", ".pth"), {"torch": "ssd.inference.backends.pytorch:open_torch"},
                 benchmark=(BenchmarkVariant("pytorch", "torch"),
                            BenchmarkVariant("pytorch-bf16", "torch", bfloat16=True))),
    ArtifactKind("pt2", (".pt2",), {"pt2": "ssd.inference.backends.pt2:open_pt2"},
                 exporter="ssd.export.pt2:export_pt2", benchmark=(BenchmarkVariant("pt2", "pt2"),)),
    ArtifactKind("onnx", (".onnx",), {"onnx": "ssd.inference.backends.onnx:open_onnx",
                                      "opencv": "ssd.inference.backends.opencv:open_opencv"},
                 exporter="ssd.export.onnx:export_onnx", nms=True, int8=True,
                 benchmark=(BenchmarkVariant("onnx", "onnx"), BenchmarkVariant("onnx-int8", "onnx", int8=True),
                            BenchmarkVariant("opencv", "opencv"))),
    ArtifactKind("openvino", (".xml",), {"openvino": "ssd.inference.backends.openvino:open_openvino",
                                         "openvino-bf16": "ssd.inference.backends.openvino:open_openvino_bf16"},
                 exporter="ssd.export.openvino:export_openvino", folder_file="model.xml", nms=True, int8=True,
                 benchmark=(BenchmarkVariant("openvino", "openvino"),
                            BenchmarkVariant("openvino-bf16", "openvino-bf16"),
                            BenchmarkVariant("openvino-int8", "openvino", int8=True)), title="OpenVINO"),
    ArtifactKind("ncnn", (".param",), {"ncnn": "ssd.inference.backends.ncnn:open_ncnn"},
                 exporter="ssd.export.ncnn:export_ncnn", folder_file="model.ncnn.param",
                 benchmark=(BenchmarkVariant("ncnn", "ncnn"),)),
    ArtifactKind("tflite", (".tflite",), {"tflite": "ssd.inference.backends.tflite:open_tflite"},
                 exporter="ssd.export.tflite:export_tflite", int8=True,
                 benchmark=(BenchmarkVariant("tflite", "tflite"), BenchmarkVariant("tflite-fp16", "tflite", fp16=True),
                            BenchmarkVariant("tflite-int8", "tflite", int8=True)), title="TFLite"),
    # retired: its files are refused by name, with what to export instead
    ArtifactKind("torchscript", (".torchscript",), {"torchscript": "ssd.inference.backends:refuse_torchscript"}),
)}
"""Kind name -> :class:`ArtifactKind`; the default kind of a file whose suffix no kind claims is ``pt``
(checkpoints and foreign detectors come with many suffixes, told apart by content)."""

EXPORT_FORMATS: tuple[str, ...] = tuple(name for name, kind in ARTIFACTS.items() if kind.exporter)
"""What ``ssd export --format`` writes: the kinds with an exporter."""

BENCHMARK_ROWS: dict[str, tuple[ArtifactKind, BenchmarkVariant]] = {
    row.name: (kind, row) for kind in ARTIFACTS.values() for row in kind.benchmark}
"""``ssd benchmark --formats`` row name -> its artifact kind and row."""


def resolve(target: str) -> Callable[..., Any]:
    """The function a ``"module:function"`` string names (its module imported now)."""
    module, _, function = target.partition(":")
    return getattr(importlib.import_module(module), function)

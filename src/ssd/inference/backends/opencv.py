"""The OpenCV DNN backend: an ``ssd export`` ONNX graph without NMS run by ``cv2.dnn``, the library's
post-processing after it. OpenCV cannot run the in-graph NMS of an ``--nms`` export (its layer takes only float
inputs, the graph feeds it integer indices): such a file is refused with what to export instead."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np

from ssd.errors import ConfigError, OnnxModelError
from ssd.inference.backends.onnx import OnnxBackend

if TYPE_CHECKING:
    import torch

__all__ = ["OpenCvBackend", "open_opencv"]


class _OpenCvSession:
    """A ``cv2.dnn.Net`` behind the ONNX Runtime session methods :class:`OnnxBackend` calls."""

    def __init__(self, net, proto):
        self.net, self.proto = net, proto
        self.names = [o.name for o in proto.graph.output]

    @staticmethod
    def _describe(values) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=v.name, shape=[d.dim_value if d.HasField("dim_value") else d.dim_param
                                                    for d in v.type.tensor_type.shape.dim]) for v in values]

    def get_inputs(self) -> list[SimpleNamespace]:
        initializers = {t.name for t in self.proto.graph.initializer}
        return self._describe([v for v in self.proto.graph.input if v.name not in initializers])

    def get_outputs(self) -> list[SimpleNamespace]:
        return self._describe(self.proto.graph.output)

    def run(self, _names, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        import cv2

        self.net.setInput(feeds["images"], "images")
        try:
            return [np.asarray(v) for v in self.net.forward(self.names)]
        except cv2.error as e:  # not a RuntimeError: callers that report a failed runtime would not catch it
            raise OnnxModelError(f"OpenCV DNN cannot run this graph: {str(e).strip()}") from e


class OpenCvBackend(OnnxBackend):
    """An ``ssd export`` ONNX file (FP32, no NMS) on OpenCV DNN's CPU backend, with the metadata rules, checksum and
    graph checks of :class:`OnnxBackend`."""

    name = "opencv"

    def _open_session(self, device: str | torch.device) -> _OpenCvSession:
        import cv2
        import onnx

        if str(device) != "cpu":
            raise ConfigError(f"the OpenCV DNN backend runs on the CPU, got device={str(device)!r}")
        try:
            proto = onnx.load(str(self.path))
        except Exception as e:  # onnx raises DecodeError and others for files it cannot parse
            raise OnnxModelError(f"cannot load ONNX model {self.path}: {e}") from e
        if {p.key: p.value for p in proto.metadata_props}.get("nms") == json.dumps(True):
            raise ConfigError(f"OpenCV DNN cannot run the in-graph NMS of {self.path} (exported with --nms): export "
                              "the plain graph for OpenCV (`ssd export --weights CKPT --format onnx`, without --nms); "
                              "the library then runs the post-processing")
        try:
            net = cv2.dnn.readNetFromONNX(str(self.path))
        except cv2.error as e:
            raise OnnxModelError(f"OpenCV DNN cannot read {self.path}: {e}") from e
        return _OpenCvSession(net, proto)


def open_opencv(path: Path, device: torch.device, half: bool) -> OpenCvBackend:
    """An ``ssd export`` ONNX file on OpenCV DNN (float32: ``half`` is refused)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to OpenCV DNN ({path})")
    return OpenCvBackend(path, device)

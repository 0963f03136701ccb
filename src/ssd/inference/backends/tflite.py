"""The LiteRT (TensorFlow Lite) backend: a ``.tflite`` file written by :func:`ssd.export.tflite.export_tflite`, run
with ``ai-edge-litert``'s interpreter (XNNPACK on the CPU).

The file is the pipeline of an edge deployment (see :mod:`ssd.export.tflite`): ``image [1, S, S, 3]`` uint8 RGB at
the network size in, normalization inside the graph; out ``location [1, P, 4]`` (the box offsets, ``(y, x, h, w)``
order) and ``scores [1, P, K]`` (the object classes' softmax probabilities), with the MediaPipe object-detector
metadata. Appended to the flatbuffer is a zip of associated files (TFLite metadata's convention): ``labels.txt``
``priors.bin`` (the default boxes, float32) and ``ssd.json``, the model card as strings, sealed with
:func:`tflite_digest` (the flatbuffer and every other associated file) and checked here before the interpreter is
made.

:class:`TfliteBackend` keeps the :class:`~ssd.inference.backends.Backend` contract: it takes the normalized batch of
:func:`ssd.preprocess.preprocess`, turns it back into the uint8 pixels it came from (exact: the resize rounds to
uint8 before normalizing), and returns ``loc`` in ``(x, y, w, h)`` order and ``logits`` whose softmax is the
graph's probabilities (``log p``, the background ``log(1 - sum p)``). Without PyTorch (the runtime install),
:func:`ssd.arrays.detect_arrays` feeds it the pixels and post-processes :meth:`TfliteBackend.head_arrays` in
numpy; torch is imported only by the tensor methods.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import ssd.limits as limits
from ssd.card import ModelCard, strings_from_json
from ssd.errors import ConfigError, OnnxModelError
from ssd.optional import has_torch, require

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["METADATA_FILE", "LABELS_FILE", "PRIORS_FILE", "LOCATION_ORDER", "TfliteBackend", "tflite_digest",
           "split_tflite", "require_litert", "open_tflite"]

METADATA_FILE = "ssd.json"
LABELS_FILE = "labels.txt"
PRIORS_FILE = "priors.bin"
LOCATION_ORDER = [1, 0, 3, 2]
"""The graph's ``location`` columns from ``loc``'s ``(x, y, w, h)``: ``(y, x, h, w)``, MediaPipe's default order
(and back: the permutation is its own inverse)."""

_BACKGROUND_FLOOR = 1e-12  # log's argument when quantized probabilities sum to 1 or more


def require_litert():
    """``ai_edge_litert.interpreter``, or :class:`ssd.errors.MissingDependencyError` naming the ``tflite`` extra."""
    return require("ai_edge_litert.interpreter", "tflite", "running a TFLite model")


def split_tflite(data: bytes, source: str) -> tuple[bytes, dict[str, bytes]]:
    """A ``.tflite`` file's bytes -> ``(flatbuffer, {associated file name: bytes})``: the zip TFLite metadata appends
    after the flatbuffer. Refused (:class:`~ssd.errors.OnnxModelError` naming ``source``) when there is none, as in a
    file that ``ssd export`` did not write."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = archive.infolist()
            start = min((m.header_offset for m in members), default=len(data))
            files = {m.filename: archive.read(m) for m in members}
    except (zipfile.BadZipFile, OSError, ValueError):
        files, start = {}, len(data)
    if METADATA_FILE not in files:
        raise OnnxModelError(f"{source} has no model card ({METADATA_FILE} among its associated files): it was not "
                             "written by `ssd export` or the card was removed; export it with `ssd export --weights "
                             "CKPT --format tflite`")
    return data[:start], files


def tflite_digest(flatbuffer: bytes, files: dict[str, bytes]) -> str:
    """SHA-256 of the flatbuffer (graph, weights, MediaPipe metadata) and of every associated file but the card
    (name and bytes, by name), as hex: the network digest of a TFLite artifact's card."""
    digest = hashlib.sha256(flatbuffer)
    for name in sorted(files):
        if name != METADATA_FILE:
            digest.update(f"\0{name}\0{len(files[name])}\0".encode())
            digest.update(files[name])
    return digest.hexdigest()


class TfliteBackend:
    """A ``.tflite`` file of ``ssd export --format tflite`` (see the module docstring), its card checked against the
    checksum before the interpreter reads the graph, its tensors' memory bounded before it allocates them. Runs one
    image at a time (the graph's batch is 1), on ``num_threads`` threads (default: PyTorch's, which ONNX Runtime's
    default also matches: the physical cores; without PyTorch, the machine's CPUs)."""

    name = "tflite"
    uint8_input = True  # :func:`ssd.arrays.detect_arrays` feeds the pixels

    def __init__(self, path: str | Path, device: str | torch.device = "cpu", num_threads: int | None = None):
        self.path = self.source = Path(path)
        if str(device) != "cpu":
            raise ConfigError(f"the TFLite backend runs on the CPU, got device={str(device)!r}")
        litert = require_litert()
        try:
            data = self.path.read_bytes()
        except OSError as e:
            raise OnnxModelError(f"cannot read TFLite model {self.path}: {e.strerror or e}") from e
        flatbuffer, files = split_tflite(data, str(self.path))
        raw = strings_from_json(files[METADATA_FILE], f"{self.path}: its {METADATA_FILE}", OnnxModelError)
        self.card = ModelCard.from_file_strings(raw, lambda: tflite_digest(flatbuffer, files), {}, str(self.path),
                                                OnnxModelError)
        try:
            self.interpreter = litert.Interpreter(model_content=flatbuffer, num_threads=num_threads or _threads())
            limits.check_graph_bytes(sum(int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize
                                         for d in self.interpreter.get_tensor_details()), str(self.path),
                                     OnnxModelError)
            self.interpreter.allocate_tensors()
        except OnnxModelError:
            raise
        except (RuntimeError, ValueError) as e:  # the interpreter's errors for a graph it cannot build
            raise OnnxModelError(f"cannot load TFLite model {self.path}: {e}") from e
        self._priors = np.frombuffer(files.get(PRIORS_FILE, b""), dtype="<f4").astype(np.float32).reshape(-1, 4)
        self._input = self._check_graph()
        self._outputs = [d["index"] for d in self.interpreter.get_output_details()]
        self._dequantize = [_dequantizer(d) for d in self.interpreter.get_output_details()]
        self._mean = np.array(self.card.mean, dtype=np.float32).reshape(1, 3, 1, 1)
        self._std = np.array(self.card.std, dtype=np.float32).reshape(1, 3, 1, 1)

    def _check_graph(self) -> dict:
        """The input's details, checked against the card: one ``[1, H, W, 3]`` uint8 image at its size, two
        outputs ``[1, P, 4]`` and ``[1, P, K]`` for the ``P`` default boxes of ``priors.bin``."""
        inputs, outputs = self.interpreter.get_input_details(), self.interpreter.get_output_details()
        shape = [[int(side) for side in d["shape"]] for d in outputs]
        want = [1, *self.card.image_size, 3]
        if len(inputs) != 1 or list(inputs[0]["shape"]) != want or inputs[0]["dtype"] != np.uint8:
            raise OnnxModelError(f"{self.path}: the graph takes {[list(d['shape']) for d in inputs]}, not one uint8 "
                                 f"image {want} as its model card says; the card was edited or belongs to another "
                                 "model")
        count, classes = len(self._priors), self.card.num_classes
        if shape != [[1, count, 4], [1, count, classes]]:
            raise OnnxModelError(f"{self.path}: the graph's outputs are {shape}, not location [1, P, 4] and scores "
                                 f"[1, P, {classes}] for the {classes} classes its model card names and the "
                                 f"P = {count} default boxes of its {PRIORS_FILE}")
        return inputs[0]

    @property
    def device(self) -> torch.device:
        """Where the input batch is made: the CPU."""
        import torch

        return torch.device("cpu")

    @property
    def priors(self) -> Tensor:
        """``[P, 4]`` cxcywh normalized, the file's ``priors.bin``."""
        import torch

        return torch.from_numpy(self._priors)

    def pixels(self, batch: Tensor) -> np.ndarray:
        """``batch [B, 3, S, S]`` normalized -> ``[B, S, S, 3]`` uint8: the pixels :func:`ssd.preprocess.preprocess`
        normalized (its resize rounds to uint8 first, so rounding recovers them exactly). In numpy: PyTorch's
        threads would wait here on the cores the interpreter's threads have just used."""
        values = np.rint((batch.detach().float().cpu().numpy() * self._std + self._mean) * 255).clip(0, 255)
        return np.ascontiguousarray(values.astype(np.uint8).transpose(0, 2, 3, 1))

    def run(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``pixels [B, S, S, 3]`` (the graph's input type) -> the graph's ``(location [B, P, 4], scores [B, P, K])``
        as float32, one image per invocation."""
        results: list[list[np.ndarray]] = []
        for image in pixels:
            self.interpreter.set_tensor(self._input["index"], image[None])
            self.interpreter.invoke()
            results.append([f(self.interpreter.get_tensor(i)) for i, f in zip(self._outputs, self._dequantize)])
        location, scores = (np.concatenate(parts) for parts in zip(*results))
        return location, scores

    def head_arrays(self, pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``pixels [B, S, S, 3]`` uint8 -> ``(loc [B, P, 4]`` in ``(x, y, w, h)`` order, ``scores [B, P, K]`` the
        graph's probabilities, ``priors [P, 4])``: what :func:`ssd.arrays.postprocess_arrays` takes."""
        location, scores = self.run(pixels)
        return np.ascontiguousarray(location[..., LOCATION_ORDER]), scores, self._priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` normalized -> ``(loc [B, P, 4], logits [B, P, K+1])`` (see the module
        docstring; in numpy, as :meth:`pixels`)."""
        import torch

        loc, scores, _ = self.head_arrays(self.pixels(batch))
        background = np.maximum(1 - scores.sum(-1, keepdims=True), _BACKGROUND_FLOOR)
        with np.errstate(divide="ignore"):  # a quantized probability of 0: log 0 = -inf, softmax 0
            logits = np.log(np.concatenate((background, np.maximum(scores, 0)), axis=-1))
        return torch.from_numpy(loc), torch.from_numpy(logits)


def _threads() -> int:
    """The interpreter's default thread count: PyTorch's where it is installed, else the machine's CPUs."""
    if has_torch():
        import torch

        return torch.get_num_threads()
    return os.cpu_count() or 1


def _dequantizer(details: dict):
    """A function from an output tensor to float32: its quantization's ``(q - zero_point) * scale`` for an integer
    output, else the tensor as float32."""
    scale, zero_point = details["quantization"]
    if details["dtype"] in (np.int8, np.uint8) and scale:
        return lambda q: (q.astype(np.float32) - zero_point) * np.float32(scale)
    return lambda t: t.astype(np.float32, copy=True)


def open_tflite(path: Path, device: torch.device, half: bool) -> TfliteBackend:
    """A ``.tflite`` file of ``ssd export --format tflite`` (its own precision: ``half`` is refused)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to the TFLite model {path}")
    return TfliteBackend(path, device)

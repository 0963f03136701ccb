"""The ONNX Runtime backend: a graph written by ``ssd export`` (:mod:`ssd.export.onnx`), its card checked.

It maps a preprocessed batch ``[B, 3, H, W]`` (float32, normalized) to ``(loc [B, P, 4], logits [B, P, K+1])``; a
graph exported with NMS inside (``card.nms`` set) returns detections instead (:meth:`OnnxBackend.nms_detections`).
:class:`OnnxBackend` is also the base of the OpenCV DNN and OpenVINO backends, which run the same checks behind
their own session. Its core runs on numpy arrays (:meth:`OnnxBackend.run_arrays`, :meth:`OnnxBackend.nms_arrays`,
:meth:`OnnxBackend.head_arrays`): without PyTorch (the runtime install), :mod:`ssd.arrays` runs any graph through
them, and torch is imported only by the tensor methods.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

import ssd.limits as limits
from ssd.arrays import object_scores
from ssd.card import ModelCard
from ssd.errors import ConfigError, InputError, OnnxModelError
from ssd.inference.backends.onnx_file import graph_sha256, read_onnx_file
from ssd.optional import require

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["OnnxBackend", "cuda_index", "graph_digest", "open_onnx"]

RAW_OUTPUTS = ["loc", "logits", "priors"]
NMS_OUTPUTS = ["detections", "num_detections"]


def cuda_index(device: str | torch.device) -> int | None:
    """The CUDA device index ``device`` names (``"cuda"`` is 0), ``None`` for another device; torch not needed."""
    name = str(device)
    return int(name.partition(":")[2] or 0) if name.split(":")[0] == "cuda" else None


def open_onnx(path: Path, device: str | torch.device, half: bool) -> OnnxBackend:
    """A model written by ``ssd export`` (float32: ``half`` is refused)."""
    if half:
        raise ConfigError(f"half precision applies to PyTorch checkpoints, not to the ONNX model {path}")
    return OnnxBackend(path, device)


@functools.cache
def _shared_arena(ort) -> None:
    """Register, once per process, the CPU arena every session uses, limited to
    :data:`ssd.limits.MAX_ONNX_RUNTIME_BYTES` (read when the first session is made)."""
    memory = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    ort.create_and_register_allocator(memory, ort.OrtArenaCfg({"max_mem": limits.MAX_ONNX_RUNTIME_BYTES}))


def graph_digest(proto) -> str:
    """SHA-256 of an ONNX model's graph (nodes and weights; not the metadata that stores it), as hex: the network
    digest of an ONNX artifact's card."""
    return hashlib.sha256(proto.graph.SerializeToString(deterministic=True)).hexdigest()


class OnnxBackend:
    """A model written by ``ssd export`` (see :mod:`ssd.export.onnx`), run with ONNX Runtime.

    Its model card (the metadata) is validated at load (every field present and well formed, class count and input
    size agreeing with the graph) and checked against its checksum, which must be present: the graph and every
    field. Tensors go in and come out on the CPU (``device``); the session runs on CUDA when ``device`` is a CUDA
    device and ONNX Runtime has the CUDA provider.
    """

    name = "onnx"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        self.path = self.source = Path(path)
        # the card and its checksum first: an edited graph is refused before the runtime parses or compiles it
        self.card = ModelCard.from_file_strings(self._card_strings(), self.network_digest, self._legacy_checksums(),
                                                str(self.path), OnnxModelError)
        self.session = self._open_session(device)
        self.fixed_batch = self._check_graph()
        self._priors: Tensor | None = None

    def _card_strings(self) -> dict[str, str]:
        """The card as the file stores it (:meth:`ssd.card.ModelCard.to_strings`): the ONNX metadata; read with the
        graph's bytes (:func:`~ssd.inference.backends.onnx_file.read_onnx_file`), which the checksum covers."""
        self._graph, metadata = read_onnx_file(self.path)
        return metadata

    @property
    def device(self) -> torch.device:
        """Where the input batch is made: the CPU (tensors cross to the runtime as numpy arrays)."""
        import torch

        return torch.device("cpu")

    def _open_session(self, device: str | torch.device):
        """The runtime's session (other runtimes' backends return an object with the same methods)."""
        ort = require("onnxruntime", "export", "running an ONNX model")

        providers = ["CPUExecutionProvider"]
        if cuda_index(device) is not None and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": cuda_index(device)}))
        options = ort.SessionOptions()
        # Its threads would busy-wait after each run on the cores where PyTorch then post-processes and
        # pre-processes the next batch (measured: 4x the time per image on 2 cores, benchmarks/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        _shared_arena(ort)  # every session's CPU tensors come from one arena of bounded size
        options.add_session_config_entry("session.use_env_allocators", "1")
        try:
            return ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable files
            raise OnnxModelError(f"cannot load ONNX model {self.path}: {e}") from e

    def network_digest(self) -> str:
        """The digest of the network the card's checksum covers: :func:`graph_digest` of the file's graph (its bytes
        as read, no ``onnx`` package needed)."""
        return graph_sha256(self._graph)

    def _legacy_checksums(self) -> dict[str, Callable[[], str]]:
        """The network checksums a file written before the model card stores (key -> its digest): the graph's."""
        return {"graph_sha256": self.network_digest}

    def _check_graph(self) -> int | None:
        """Check the graph's input and outputs against the metadata; returns the fixed batch size (or ``None``)."""
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shape = inputs[0].shape
        self.uint8_input = getattr(inputs[0], "type", None) == "tensor(uint8)"  # [B, S, S, 3] (--uint8-input)
        sides = shape[1:3] if self.uint8_input else shape[2:]
        if len(inputs) != 1 or len(shape) != 4 or shape[3 if self.uint8_input else 1] != 3:
            raise OnnxModelError(f"{self.path}: the graph takes {[(i.name, i.shape) for i in inputs]}, not one "
                                 f"image batch [B, 3, S, S] (or uint8 [B, S, S, 3]); it was not written by "
                                 "`ssd export`")
        if any(isinstance(side, int) and side != want for side, want in zip(sides, self.card.image_size)):
            raise OnnxModelError(f"{self.path}: the metadata says image_size={list(self.card.image_size)} but the "
                                 f"graph's input is {shape}; the metadata was edited or belongs to another model")
        names = [o.name for o in outputs]
        nms = self.card.nms is not None
        if names != (NMS_OUTPUTS if nms else RAW_OUTPUTS):
            raise OnnxModelError(f"{self.path}: the metadata says nms={json.dumps(nms)} but the graph's outputs "
                                 f"are {names}; the metadata was edited or belongs to another model")
        if not nms:
            self._check_classes(outputs[1].shape[-1])
        return shape[0] if isinstance(shape[0], int) else None

    def _check_classes(self, outputs: int | str) -> None:
        names = self.card.class_names
        if isinstance(outputs, int) and outputs != len(names) + 1:
            raise OnnxModelError(f"{self.path}: the graph scores {outputs - 1} classes (+ background) but the "
                                 f"metadata names {len(names)}: {list(names)}")

    def run(self, batch: Tensor) -> list[Tensor]:
        """The graph's outputs for a preprocessed batch, as tensors (see :meth:`run_arrays`)."""
        import torch

        return [torch.from_numpy(v) for v in self.run_arrays(batch.detach().float().cpu().numpy())]

    def run_arrays(self, array: np.ndarray) -> list[np.ndarray]:
        """The graph's outputs for an input batch (split to the exported batch size if it is fixed): ``[B, 3, S, S]``
        float32 normalized, or for a ``--uint8-input`` graph ``[B, S, S, 3]`` uint8 (a normalized batch is turned
        back into the pixels it was made from)."""
        if self.uint8_input and array.dtype != np.uint8:
            pixels = (array * np.float32(self.card.std)[:, None, None] + np.float32(self.card.mean)[:, None, None])
            array = np.ascontiguousarray(np.clip(np.rint(pixels * 255), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1))
        if self.fixed_batch is None or self.fixed_batch == len(array):
            return self._run(array)
        if self.fixed_batch != 1:
            raise InputError(f"{self.path} takes batches of exactly {self.fixed_batch} images, got {len(array)}")
        parts = [self._run(array[i:i + 1]) for i in range(len(array))]
        names = [o.name for o in self.session.get_outputs()]
        return [p[0] if name == "priors" else np.concatenate(p) for name, p in zip(names, zip(*parts))]

    def _run(self, array: np.ndarray) -> list[np.ndarray]:
        try:
            return self.session.run(None, {"images": array})
        except Exception as e:  # ONNX Runtime's own exception types
            if "Available memory of" not in str(e):  # the arena refusing an allocation, else not ours to explain
                raise
            raise OnnxModelError(f"{self.path}: running the graph needs more memory than ONNX Runtime may take "
                                 f"(limits.MAX_ONNX_RUNTIME_BYTES, {limits.MAX_ONNX_RUNTIME_BYTES / 2**30:g} GiB); "
                                 "a graph of `ssd export` needs far less at this batch size") from None

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])`` (graphs without NMS)."""
        if self.card.nms is not None:
            raise ConfigError(f"{self.path} has NMS inside: it returns detections (use nms_detections)")
        loc, logits, self._priors = self.run(batch)
        self._check_classes(logits.shape[-1])
        return loc, logits

    def head_arrays(self, array: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A graph without NMS on an input batch (see :meth:`run_arrays`) -> ``(loc [B, P, 4], scores [B, P, K]``
        the object classes' softmax probabilities, ``priors [P, 4])``: what :func:`ssd.arrays.postprocess_arrays`
        takes."""
        loc, logits, priors = self.run_arrays(array)
        self._check_classes(logits.shape[-1])
        return loc, object_scores(logits), priors

    @property
    def priors(self) -> Tensor:
        """``[P, 4]``, the graph's ``priors`` output (computed once on a blank batch if no batch ran yet)."""
        if self._priors is None:
            import torch

            self(torch.zeros(self.fixed_batch or 1, 3, *self.card.image_size))
        return self._priors

    def nms_detections(self, batch: Tensor, *, score_threshold: float, iou_threshold: float,
                       max_detections: int) -> list[dict[str, Tensor]]:
        """:meth:`nms_arrays` of a tensor batch, as tensors."""
        import torch

        detections = self.nms_arrays(batch.detach().float().cpu().numpy(), score_threshold=score_threshold,
                                     iou_threshold=iou_threshold, max_detections=max_detections)
        return [{key: torch.from_numpy(value) for key, value in d.items()} for d in detections]

    def nms_arrays(self, array: np.ndarray, *, score_threshold: float, iou_threshold: float,
                   max_detections: int) -> list[dict[str, np.ndarray]]:
        """Detections of a graph with NMS inside: per image ``boxes [N, 4]`` xyxy normalized, ``scores``, ``labels``
        (int64).

        The graph's thresholds were fixed at export: ``score_threshold`` may only be higher, ``max_detections`` only
        lower, ``iou_threshold`` must be equal."""
        fixed = self.card.nms
        if (iou_threshold != fixed.iou_threshold or score_threshold < fixed.score_threshold
                or max_detections > fixed.max_detections):
            raise ConfigError(
                f"{self.path} was exported with NMS at score_threshold={fixed.score_threshold}, iou_threshold="
                f"{fixed.iou_threshold}, max_detections={fixed.max_detections}; got score_threshold={score_threshold}, "
                f"iou_threshold={iou_threshold}, max_detections={max_detections} (the score threshold may only be "
                "higher, max_detections only lower, the IoU threshold must be equal; export again for other values "
                "or without --nms)")
        rows, counts = self.run_arrays(array)
        keep = (np.arange(rows.shape[1]) < counts[:, None]) & (rows[..., 4] > score_threshold)  # sorted by score
        labels = rows[..., 5][keep]
        names = self.card.class_names
        if bool((labels >= len(names)).any()):
            raise OnnxModelError(f"{self.path}: the graph detects label {int(labels.max())} but the metadata names "
                                 f"only {len(names)} classes: {list(names)}")
        return [{"boxes": r[k, :4][:max_detections], "scores": r[k, 4][:max_detections],
                 "labels": r[k, 5][:max_detections].astype(np.int64)} for r, k in zip(rows, keep)]

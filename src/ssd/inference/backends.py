"""The built-in inference backends (:class:`ssd.inference.registry.Backend`): PyTorch and ONNX Runtime.

A backend maps a preprocessed batch ``[B, 3, S, S]`` (float32, normalized) to ``(loc [B, P, 4], logits [B, P, K+1])``
and knows what the rest of the pipeline needs: ``priors [P, 4]``, ``variances``, ``mean``, ``std``, ``image_size``,
``class_names``, ``category_ids`` (the dataset's COCO category id of each label, or ``None``), ``operating_point``
(the stored best-F1 confidence and its P/R/F1, or ``None``), ``device`` (where its input batch is made). An ONNX
graph exported with NMS inside (``nms = True``) returns detections instead: :meth:`OnnxBackend.nms_detections`.
:func:`ssd.inference.pipeline.detect_batch` runs either kind; :func:`ssd.inference.registry.open_backend` opens
them (:func:`open_torch`, :func:`open_onnx`).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ssd._utils import as_hw, compact_size, require, unwrap_model
from ssd.detect import model_input
from ssd.device import prepare_model
from ssd.weights.checkpoint import CheckpointError, check_operating_point

__all__ = ["TorchBackend", "OnnxBackend", "OnnxModelError", "graph_digest", "check_category_ids", "read_metadata",
           "open_torch", "open_onnx"]

RAW_OUTPUTS = ["loc", "logits", "priors"]
NMS_OUTPUTS = ["detections", "num_detections"]


class OnnxModelError(CheckpointError):
    """An ONNX file that ``ssd`` cannot run: unreadable, not exported by ``ssd export``, modified or inconsistent."""


def check_category_ids(ids: Any, num_classes: int, source: str, error: type[Exception] = CheckpointError
                       ) -> list[int] | None:
    """``ids`` (a sequence of ``K`` integers: label ``k`` -> the dataset's category id) as a list, or ``None``;
    raises ``error`` naming ``source`` otherwise."""
    if ids is None:
        return None
    values = ids.tolist() if isinstance(ids, Tensor) else ids
    if (not isinstance(values, Sequence) or isinstance(values, str) or len(values) != num_classes
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in values)):
        raise error(f"{source}: category_ids must be {num_classes} integers (one per class), got {ids!r}")
    return list(values)


class TorchBackend:
    """A PyTorch :class:`ssd.models.SSD` (unwrapped from DDP / ``torch.compile``), put in eval mode on ``device``.

    ``device``: default the model's own; ``half``: float16 autocast (CUDA only). The model and each batch are moved
    to ``device`` and made channels-last when the model's configuration recommends it. ``source``: the checkpoint
    it came from; ``operating_point``: its stored best-F1 point (checked), or ``None``.
    """

    name = "torch"
    nms = False

    def __init__(self, model: nn.Module, device: str | torch.device | None = None, half: bool = False,
                 category_ids: Sequence[int] | None = None, source: Path | None = None,
                 operating_point: dict[str, Any] | None = None):
        model = unwrap_model(model)
        self.source = source
        self.device = torch.device(device) if device is not None else model.priors.device
        if half and self.device.type != "cuda":
            raise ValueError(f"half precision needs a CUDA device, got device={str(self.device)!r}")
        self.model, self.channels_last = prepare_model(model, self.device, None)
        self.model.eval()
        self.half = half
        config = model.config
        self.model_name = config.name
        self.class_names = list(model.class_names)
        self.image_size, self.variances = config.image_size, config.variances
        self.mean, self.std = config.mean, config.std
        self.category_ids = check_category_ids(category_ids, config.num_classes, "category_ids")
        self.operating_point = check_operating_point(operating_point, "operating_point")

    @property
    def priors(self) -> Tensor:
        """``[P, 4]`` cxcywh normalized, on ``device``."""
        return self.model.priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])`` (float16 logits with ``half``)."""
        batch = model_input(batch.to(self.device), self.channels_last)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=self.half):
            return self.model(batch)


def open_torch(path: Path, device: torch.device, half: bool) -> TorchBackend:
    """A checkpoint of this library, or a foreign detector :func:`ssd.weights.load.read_weights` imports; its
    ``category_ids`` and ``operating_point`` (when training stored them) become the backend's."""
    from ssd.weights.load import model_from_checkpoint, read_weights

    ckpt = read_weights(path)
    try:
        model = model_from_checkpoint(ckpt)
    except CheckpointError as e:  # it names "the checkpoint": say which file
        raise CheckpointError(f"{path}: {e}") from None
    category_ids = check_category_ids(ckpt.get("category_ids"), model.num_classes, str(path))
    point = check_operating_point(ckpt.get("operating_point"), str(path))
    return TorchBackend(model, device, half, category_ids=category_ids, source=path, operating_point=point)


def open_onnx(path: Path, device: torch.device, half: bool) -> OnnxBackend:
    """A model written by ``ssd export`` (float32: ``half`` is refused)."""
    if half:
        raise ValueError(f"half precision applies to PyTorch checkpoints, not to the ONNX model {path}")
    return OnnxBackend(path, device)


def graph_digest(proto) -> str:
    """SHA-256 of an ONNX model's graph (nodes and weights; not the metadata that stores it), as hex."""
    return hashlib.sha256(proto.graph.SerializeToString(deterministic=True)).hexdigest()


def _numbers(count: int, positive: bool = False):
    return lambda v: (isinstance(v, list) and len(v) == count and all(
        isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and (x > 0 or not positive)
        for x in v))


def _unit(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# metadata key -> (test of the JSON value, the rule in words)
_RULES = {
    "class_names": (lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(n, str) for n in v),
                    "a non-empty JSON list of strings"),
    "image_size": (lambda v: _positive_int(v) or (isinstance(v, list) and len(v) == 2 and all(map(_positive_int, v))),
                   "a positive integer S or a list [H, W]"),
    "mean": (_numbers(3), "a JSON list of 3 finite numbers"),
    "std": (_numbers(3, positive=True), "a JSON list of 3 positive numbers"),
    "variances": (_numbers(2, positive=True), "a JSON list of 2 positive numbers"),
    "nms": (lambda v: isinstance(v, bool), "true or false"),
    "score_threshold": (_unit, "a number in [0, 1]"),
    "iou_threshold": (_unit, "a number in [0, 1]"),
    "max_det": (_positive_int, "a positive integer"),
    "category_ids": (lambda v: isinstance(v, list), "a JSON list of integers"),
    "precision": (lambda v: v in ("fp32", "int8"), '"fp32" or "int8"'),
    "operating_point": (lambda v: isinstance(v, dict), "a JSON object"),
}
_REQUIRED = ("class_names", "image_size", "mean", "std", "variances", "nms")
_REQUIRED_NMS = ("score_threshold", "iou_threshold", "max_det")


def read_metadata(path: Path, raw: dict[str, str]) -> dict[str, Any]:
    """The validated metadata of an exported model; :class:`OnnxModelError` names the key and what is wrong."""
    if "class_names" not in raw and "image_size" not in raw:
        raise OnnxModelError(f"{path} was not written by `ssd export` (no class_names or image_size metadata); "
                             f"export it with `ssd export --weights CKPT --format onnx`")
    meta = {}
    for key, text in raw.items():
        if key not in _RULES:
            continue
        try:
            meta[key] = json.loads(text)
        except json.JSONDecodeError:
            meta[key] = None  # reported below as not matching its rule
        test, rule = _RULES[key]
        if not test(meta[key]):
            raise OnnxModelError(f"{path}: metadata {key}={text!r} is not {rule}; export the model again")
    missing = [k for k in _REQUIRED + (_REQUIRED_NMS if meta.get("nms") else ()) if k not in meta]
    if missing:
        raise OnnxModelError(f"{path}: the metadata lacks {', '.join(missing)} (has {', '.join(raw) or 'nothing'}); "
                             f"it was edited or written by another tool; export the model again with `ssd export`")
    meta["category_ids"] = check_category_ids(meta.get("category_ids"), len(meta["class_names"]), str(path),
                                              OnnxModelError)
    meta["operating_point"] = check_operating_point(meta.get("operating_point"), f"{path}: metadata", OnnxModelError)
    meta["model_name"] = raw.get("model_name")  # plain text, not JSON; None where absent
    return meta


def _verify_digest(path: Path, expected: str | None) -> None:
    """A missing checksum is refused like a wrong one: deleting the key must not let an edited graph through."""
    onnx = require("onnx", "export", "checking an ONNX model")

    if expected is None:
        raise OnnxModelError(f"{path}: the metadata has no graph_sha256 (the checksum `ssd export` stores): it was "
                             "removed or the file was written by another tool; export the model again")
    if graph_digest(onnx.load(str(path))) != expected:
        raise OnnxModelError(f"{path}: the graph does not match the checksum stored at export (graph_sha256): the "
                             f"file was modified or corrupted after `ssd export`; export it again")


class OnnxBackend:
    """A model written by ``ssd export`` (see :mod:`ssd.export.onnx`), run with ONNX Runtime.

    Its metadata is validated at load (every key present and well formed, class count and input size agreeing with
    the graph, the graph checksum, which must be present). Tensors go in and come out on the CPU (``device``); the
    session runs on CUDA when ``device`` is a CUDA device and ONNX Runtime has the CUDA provider.
    """

    name = "onnx"

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        self.path = self.source = Path(path)
        self.device = torch.device("cpu")
        self.session = self._open_session(device)
        raw = self.session.get_modelmeta().custom_metadata_map
        meta = read_metadata(self.path, raw)
        self._verify_checksum(raw)
        self.model_name, self.class_names = meta["model_name"], meta["class_names"]
        self.category_ids = meta["category_ids"]
        self.operating_point = meta["operating_point"]
        self.image_size = compact_size(meta["image_size"])
        self.mean, self.std, self.variances = tuple(meta["mean"]), tuple(meta["std"]), tuple(meta["variances"])
        self.nms = meta["nms"]
        if self.nms:
            self.score_threshold, self.iou_threshold, self.max_det = (
                float(meta["score_threshold"]), float(meta["iou_threshold"]), meta["max_det"])
        self.fixed_batch = self._check_graph()
        self._priors: Tensor | None = None

    def _open_session(self, device: str | torch.device):
        """The runtime's session (other runtimes' backends return an object with the same methods)."""
        ort = require("onnxruntime", "export", "running an ONNX model")

        providers = ["CPUExecutionProvider"]
        if torch.device(device).type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": torch.device(device).index or 0}))
        options = ort.SessionOptions()
        # Its threads would busy-wait after each run on the cores where PyTorch then post-processes and
        # pre-processes the next batch (measured: 4x the time per image on 2 cores, benchmarks/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            return ort.InferenceSession(str(self.path), options, providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable files
            raise OnnxModelError(f"cannot load ONNX model {self.path}: {e}") from e

    def _verify_checksum(self, metadata: dict[str, str]) -> None:
        _verify_digest(self.path, metadata.get("graph_sha256"))

    def _check_graph(self) -> int | None:
        """Check the graph's input and outputs against the metadata; returns the fixed batch size (or ``None``)."""
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shape = inputs[0].shape
        if len(inputs) != 1 or len(shape) != 4 or shape[1] != 3:
            raise OnnxModelError(f"{self.path}: the graph takes {[(i.name, i.shape) for i in inputs]}, not one "
                                 f"image batch [B, 3, S, S]; it was not written by `ssd export`")
        if any(isinstance(side, int) and side != want for side, want in zip(shape[2:], as_hw(self.image_size))):
            raise OnnxModelError(f"{self.path}: the metadata says image_size={self.image_size} but the graph's input "
                                 f"is {shape}; the metadata was edited or belongs to another model")
        names = [o.name for o in outputs]
        if names != (NMS_OUTPUTS if self.nms else RAW_OUTPUTS):
            raise OnnxModelError(f"{self.path}: the metadata says nms={json.dumps(self.nms)} but the graph's outputs "
                                 f"are {names}; the metadata was edited or belongs to another model")
        if not self.nms:
            self._check_classes(outputs[1].shape[-1])
        return shape[0] if isinstance(shape[0], int) else None

    def _check_classes(self, outputs: int | str) -> None:
        if isinstance(outputs, int) and outputs != len(self.class_names) + 1:
            raise OnnxModelError(f"{self.path}: the graph scores {outputs - 1} classes (+ background) but the "
                                 f"metadata names {len(self.class_names)}: {self.class_names}")

    def run(self, batch: Tensor) -> list[Tensor]:
        """The graph's outputs for a preprocessed batch (split to the exported batch size if it is fixed)."""
        array = batch.detach().float().cpu().numpy()
        if self.fixed_batch is None or self.fixed_batch == len(array):
            outputs = self.session.run(None, {"images": array})
        elif self.fixed_batch == 1:
            parts = [self.session.run(None, {"images": array[i:i + 1]}) for i in range(len(array))]
            names = [o.name for o in self.session.get_outputs()]
            outputs = [p[0] if name == "priors" else np.concatenate(p) for name, p in zip(names, zip(*parts))]
        else:
            raise ValueError(f"{self.path} takes batches of exactly {self.fixed_batch} images, got {len(array)}")
        return [torch.from_numpy(v) for v in outputs]

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])`` (graphs without NMS)."""
        if self.nms:
            raise ValueError(f"{self.path} has NMS inside: it returns detections (use nms_detections)")
        loc, logits, self._priors = self.run(batch)
        self._check_classes(logits.shape[-1])
        return loc, logits

    @property
    def priors(self) -> Tensor:
        """``[P, 4]``, the graph's ``priors`` output (computed once on a blank batch if no batch ran yet)."""
        if self._priors is None:
            self(torch.zeros(self.fixed_batch or 1, 3, *as_hw(self.image_size)))
        return self._priors

    def nms_detections(self, batch: Tensor, *, score_threshold: float, iou_threshold: float,
                       max_detections: int) -> list[dict[str, Tensor]]:
        """Detections of a graph with NMS inside: per image ``boxes [N, 4]`` xyxy normalized, ``scores``, ``labels``.

        The graph's thresholds were fixed at export: ``score_threshold`` may only be higher, ``max_detections`` only
        lower, ``iou_threshold`` must be equal."""
        if (iou_threshold != self.iou_threshold or score_threshold < self.score_threshold
                or max_detections > self.max_det):
            raise ValueError(
                f"{self.path} was exported with NMS at score_threshold={self.score_threshold}, iou_threshold="
                f"{self.iou_threshold}, max_detections={self.max_det}; got score_threshold={score_threshold}, "
                f"iou_threshold={iou_threshold}, max_detections={max_detections} (the score threshold may only be "
                "higher, max_detections only lower, the IoU threshold must be equal; export again for other values "
                "or without --nms)")
        rows, counts = self.run(batch)
        keep = (torch.arange(rows.shape[1]) < counts[:, None]) & (rows[..., 4] > score_threshold)  # sorted by score
        labels = rows[..., 5][keep]
        if bool((labels >= len(self.class_names)).any()):
            raise OnnxModelError(f"{self.path}: the graph detects label {int(labels.max())} but the metadata names "
                                 f"only {len(self.class_names)} classes: {self.class_names}")
        return [{"boxes": r[k, :4][:max_detections], "scores": r[k, 4][:max_detections],
                 "labels": r[k, 5][:max_detections].long()} for r, k in zip(rows, keep)]

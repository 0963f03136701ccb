"""Export an SSD to ONNX (network, optionally decoding + NMS in the graph) and check it with ONNX Runtime.

The ONNX graph takes ``images [B, 3, S, S]`` float32: what :meth:`SSD.preprocess` returns (plain resize to
``S = image_size``, then ``(x / 255 - mean) / std``). ``B`` is 1 unless exported with ``dynamic_batch=True``.

Outputs without NMS (``nms=False``), the raw head outputs and the default boxes, so that
:func:`ssd.postprocess.postprocess_detections` (softmax, decoding, per-class candidates, NMS, top-k) runs on them
exactly as in PyTorch:

- ``loc [B, P, 4]``: offsets from the priors (decode with ``ssd.boxes.decode`` and the ``variances`` metadata),
- ``logits [B, P, K+1]``: class logits, index 0 is background,
- ``priors [P, 4]``: default boxes, cxcywh normalized.

Outputs with NMS (``nms=True``): softmax, decoding, score filtering (``score > score_threshold``), per-class
candidates (``candidates_per_class`` best per image and class), class-aware NMS (ONNX ``NonMaxSuppression``, one
NMS batch entry per image and class) and the ``max_det`` best per image, so a deployment needs nothing else:

- ``detections [B, max_det, 6]``: rows ``(x1, y1, x2, y2, score, label)``, boxes xyxy normalized to ``[0, 1]`` of the
  input (multiply by the original width/height), sorted by decreasing score; padding rows are all zeros except
  ``label = -1``;
- ``num_detections [B]`` int64: the number of real rows per image.

Metadata (``metadata_props``): the model's :class:`ssd.card.ModelCard` as strings (:meth:`~ssd.card.ModelCard.
to_strings`: ``model_name``, ``class_names``, ``category_ids`` when the checkpoint has the dataset's ids,
``image_size``, ``mean``, ``std``, ``variances``, ``operating_point`` when training stored the best-F1 confidence,
``nms`` and with NMS ``score_threshold``, ``iou_threshold``, ``max_det``, ``precision`` (``fp32``, or ``int8`` for
:mod:`ssd.export.quantize`'s files) and ``checksum``: the graph (:func:`ssd.inference.backends.onnx.graph_digest`) and
every field), ``ssd_version`` and, with NMS, ``candidates_per_class``.
:class:`ssd.inference.backends.onnx.OnnxBackend` validates all of them against the graph and the checksum.

The in-graph post-processing (:class:`_ExportGraph`) is written with ONNX-exportable ops, apart from
:func:`ssd.postprocess.postprocess_detections`, with the same rule and the same ``CANDIDATES_PER_CLASS``; tests
prove its output equal to ``postprocess_detections`` on the same head outputs.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision.ops import batched_nms

from ssd.boxes import decode
from ssd.card import ModelCard
from ssd.errors import ConfigError, ExportCheckError
from ssd.export.parity import check_onnx
from ssd.files import check_output, write_bytes
from ssd.inference.backends.onnx import graph_digest
from ssd.models.load import model_from_checkpoint
from ssd.nn import unwrap_model
from ssd.optional import require
from ssd.postprocess import CANDIDATES_PER_CLASS
from ssd.schemas import ExportConfig
from ssd.settings import PREDICT, Thresholds, check_onnx_options, check_thresholds
from ssd.sizes import as_hw

__all__ = ["export_onnx", "write_onnx", "check_onnx", "as_model", "onnx_metadata"]


# --- ONNX NonMaxSuppression as a PyTorch op: eager (torchvision) for tracing, NonMaxSuppression in the graph ---
@torch.library.custom_op("ssd::onnx_nms", mutates_args=())
def onnx_nms(boxes: Tensor, scores: Tensor, iou_threshold: float, score_threshold: float) -> Tensor:
    """ONNX ``NonMaxSuppression`` semantics: ``boxes [N, C, 4]`` xyxy, ``scores [N, 1, C]`` -> ``[S, 3]`` int64 rows
    ``(n, 0, c)`` of the kept boxes (``score > score_threshold``, greedy NMS per ``n``, suppress
    ``IoU > iou_threshold``)."""
    n, c = (scores[:, 0] > score_threshold).nonzero(as_tuple=True)
    keep = batched_nms(boxes[n, c], scores[n, 0, c], n, iou_threshold)
    return torch.stack((n[keep], torch.zeros_like(keep), c[keep]), dim=1)


@onnx_nms.register_fake
def _(boxes, scores, iou_threshold, score_threshold):
    return boxes.new_empty((torch.library.get_ctx().new_dynamic_size(), 3), dtype=torch.int64)


def _onnx_nms_graph(boxes, scores, iou_threshold: float, score_threshold: float):
    """The ONNX translation of :func:`onnx_nms` (onnxscript, used by ``torch.onnx.export``)."""
    op = require("onnxscript", "export", "ONNX export").opset18

    every_box = op.Shape(boxes, start=1, end=2)  # max_output_boxes_per_class: no limit
    return op.NonMaxSuppression(
        boxes, scores, every_box, op.Constant(value_float=iou_threshold), op.Constant(value_float=score_threshold)
    )


class _ExportGraph(nn.Module):
    """The exported computation: ``images [B, 3, S, S]`` -> raw outputs, or detections (see the module docstring).

    With NMS this is a second post-processing next to :func:`ssd.postprocess.postprocess_detections`, on purpose:
    a graph cannot hold that function's data-dependent steps (pre-filtering the priors that can pass, widening
    the NMS set until ``max_detections`` survive, packed sort keys), so fixed-shape ONNX ops compute the same rule
    (its ``CANDIDATES_PER_CLASS``, strict score threshold, per-class NMS); tests check both agree."""

    def __init__(self, model: nn.Module, nms: bool, score_threshold: float, iou_threshold: float,
                 max_detections: int, uint8_input: bool = False):
        super().__init__()
        self.model, self.nms, self.uint8_input = model, nms, uint8_input
        card = model.card
        mean, std = (torch.tensor(values).view(1, 3, 1, 1) for values in (card.mean, card.std))
        self.register_buffer("scale", 1 / (255 * std), persistent=False)
        self.register_buffer("shift", mean / std, persistent=False)
        self.score_threshold, self.iou_threshold, self.max_detections = score_threshold, iou_threshold, max_detections
        self.variances = model.config.variances

    def forward(self, images: Tensor):
        if self.uint8_input:  # [B, S, S, 3] uint8 -> what preprocess makes: (x / 255 - mean) / std, channels first
            images = images.permute(0, 3, 1, 2).float() * self.scale - self.shift
        loc, logits = self.model(images)
        priors = self.model.priors
        if not self.nms:
            return loc, logits, priors.clone()
        batch, num_classes = logits.shape[0], logits.shape[2] - 1
        per_class = min(CANDIDATES_PER_CLASS, priors.shape[0])
        scores = logits.softmax(dim=-1)[..., 1:].transpose(1, 2)  # [B, K, P]
        cand_scores, cand_prior = scores.topk(per_class, dim=-1)  # [B, K, C]
        boxes = decode(loc, priors, self.variances).clamp(0.0, 1.0)  # [B, P, 4]
        cand_boxes = boxes.gather(1, cand_prior.reshape(batch, -1, 1).expand(-1, -1, 4))  # [B, K*C, 4]
        kept = torch.ops.ssd.onnx_nms(
            cand_boxes.reshape(batch * num_classes, per_class, 4),
            cand_scores.reshape(batch * num_classes, 1, per_class),
            self.iou_threshold,
            self.score_threshold,
        )
        slot = kept[:, 0] * per_class + kept[:, 2]  # index into the flat [B*K*C] candidates
        flat_scores = cand_scores.reshape(-1)
        survivors = torch.full_like(flat_scores, -1.0).index_put((slot,), flat_scores[slot])
        top_scores, top_slot = survivors.view(batch, -1).topk(min(self.max_detections, num_classes * per_class), dim=1)
        valid = top_scores > self.score_threshold  # [B, D]
        top_boxes = cand_boxes.gather(1, top_slot.unsqueeze(-1).expand(-1, -1, 4)) * valid.unsqueeze(-1)
        labels = torch.where(valid, top_slot // per_class, -1).to(top_boxes.dtype)
        detections = torch.cat((top_boxes, (top_scores * valid).unsqueeze(-1), labels.unsqueeze(-1)), dim=-1)
        return detections, valid.sum(dim=1)


def as_model(weights_or_model, out_path: Path) -> nn.Module:
    """A CPU copy in eval mode of the model (unwrapped from DDP), or the model of a checkpoint path (a foreign
    detector imported), its card the checkpoint's. Refuses an ``out_path`` that is the checkpoint itself."""
    if isinstance(weights_or_model, nn.Module):
        return copy.deepcopy(unwrap_model(weights_or_model)).cpu().eval()
    weights = Path(weights_or_model)
    check_output(out_path, inputs=[weights], what="--output")
    return model_from_checkpoint(weights).eval()


def export_onnx(
    weights_or_model,
    out_path: str | Path,
    opset: int = ExportConfig.opset,
    dynamic_batch: bool = False,
    nms: bool = False,
    check: bool = True,
    sample_images: Sequence | None = None,
    score_threshold: float = PREDICT.score_threshold,
    iou_threshold: float = PREDICT.iou_threshold,
    max_detections: int = PREDICT.max_detections,
    uint8_input: bool = False,
) -> Path:
    """Export a checkpoint path or an ``SSD`` to ONNX at ``out_path`` and return the path.

    Args:
        weights_or_model: a checkpoint (``.pt``) or an ``SSD`` module (a CPU copy in eval mode is exported).
        out_path: the ``.onnx`` file to write atomically (parent folders are created).
        opset: ONNX opset version: 18 or newer is written natively by ``torch.onnx.export``; for a lower one the
            graph is converted down, and a ``ValueError`` says so when that conversion fails.
        dynamic_batch: accept any batch size (else batch 1).
        nms: put softmax, decoding, score filtering and NMS in the graph (see the module docstring for outputs).
        check: run ONNX Runtime on ``sample_images`` and compare with PyTorch (:func:`check_onnx`), on a
            temporary copy: ``out_path`` is written only once the check passed.
        sample_images: images for the check (paths or ``[3, H, W]`` tensors); default: two seeded random images.
        score_threshold: baked into the graph with ``nms=True``, used by the check.
        iou_threshold: the same.
        max_detections: the same.
        uint8_input: the graph takes ``images [B, S, S, 3]`` uint8 RGB at the network size (NHWC) and normalizes
            them itself: the caller only resizes.

    Raises:
        ConfigError: a threshold, ``max_detections`` or the opset out of bounds (:func:`ssd.settings.check_thresholds`,
            :func:`~ssd.settings.check_onnx_options`), before any work is done.
        ExportCheckError: ONNX Runtime and PyTorch disagree beyond the tolerances.
    """
    check_thresholds(score_threshold, iou_threshold, max_detections)
    check_onnx_options(opset)
    return write_onnx(weights_or_model, out_path, opset=opset, dynamic_batch=dynamic_batch, nms=nms, check=check,
                      sample_images=sample_images, score_threshold=score_threshold, iou_threshold=iou_threshold,
                      max_detections=max_detections, uint8_input=uint8_input)


def write_onnx(weights_or_model, out_path: str | Path, *, opset: int, dynamic_batch: bool, nms: bool, check: bool,
               sample_images: Sequence | None, score_threshold: float, iou_threshold: float,
               max_detections: int, uint8_input: bool = False) -> Path:
    """:func:`export_onnx` for a caller whose options are already checked (:func:`ssd.export.run_export`: by
    :class:`ssd.schemas.ExportConfig`)."""
    onnx = require("onnx", "export", "ONNX export")
    require("onnxscript", "export", "ONNX export")  # torch.onnx.export writes the graph with it

    out_path = Path(out_path)
    model = as_model(weights_or_model, out_path)
    size = model.config.image_size
    graph = _ExportGraph(model, nms, score_threshold, iou_threshold, max_detections, uint8_input).eval()
    example = (torch.zeros(2 if dynamic_batch else 1, *as_hw(size), 3, dtype=torch.uint8) if uint8_input
               else torch.zeros(2 if dynamic_batch else 1, 3, *as_hw(size)))
    output_names = ["detections", "num_detections"] if nms else ["loc", "logits", "priors"]
    dynamic_shapes = {"images": {0: torch.export.Dim("batch", min=1)}} if dynamic_batch else None
    with torch.no_grad():
        program = torch.onnx.export(
            graph, (example,), input_names=["images"], output_names=output_names, opset_version=opset,
            dynamic_shapes=dynamic_shapes, custom_translation_table={torch.ops.ssd.onnx_nms.default: _onnx_nms_graph},
            dynamo=True, verbose=False,
        )
    proto = program.model_proto
    written = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    if written != opset:
        raise ConfigError(f"cannot export {model.config.name} at opset {opset}: the conversion "
                          f"from opset {written} failed (use opset {written} or newer)")
    thresholds = Thresholds(float(score_threshold), float(iou_threshold), max_detections) if nms else None
    onnx.helper.set_model_props(proto, onnx_metadata(model.card.replace(nms=thresholds).sealed(graph_digest(proto))))
    data = proto.SerializeToString()
    if check:  # on a temporary copy: a file that fails its check (or a killed check) never reaches out_path
        with tempfile.TemporaryDirectory(prefix="ssd-check-") as work:
            candidate = Path(work) / out_path.name
            candidate.write_bytes(data)
            try:
                check_onnx(model, candidate, sample_images)
            except ExportCheckError as e:
                raise ExportCheckError(f"{str(e).replace(str(candidate), str(out_path))}; nothing was written"
                                       ) from None
    return write_bytes(out_path, data)


def onnx_metadata(card: ModelCard) -> dict[str, str]:
    """The metadata of an export (see the module docstring): the sealed ``card`` as strings, and with NMS the
    candidate count its graph keeps per class."""
    metadata = card.to_strings()
    if card.nms is not None:
        metadata["candidates_per_class"] = str(CANDIDATES_PER_CLASS)
    return metadata

"""The export check: an exported model (ONNX, or any backend: TFLite) against the PyTorch model it came from, both
run through the same inference pipeline (:class:`ssd.inference.detector.Detector`), on raw outputs and on
detections."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn
from torchvision.ops import box_iou

from ssd.boxes import decode
from ssd.errors import ExportCheckError
from ssd.inference.backends.onnx import OnnxBackend
from ssd.inference.backends.pytorch import TorchBackend
from ssd.inference.detector import Detector, to_image
from ssd.settings import PREDICT, Thresholds

__all__ = ["check_onnx", "check_backend"]


def check_onnx(
    model: nn.Module,
    onnx_path: str | Path,
    sample_images: Sequence | None = None,
    box_tol: float = 1e-3,
    score_tol: float = 1e-4,
) -> None:
    """Compare ONNX Runtime with PyTorch on ``sample_images`` (default: two seeded random images of different sizes).

    Raw outputs (graphs without NMS): every prior's decoded box within ``box_tol`` (normalized, i.e. of the image size)
    and class scores within ``score_tol``. Detections (the thresholds stored with NMS, else
    :data:`ssd.settings.PREDICT`), both through :func:`ssd.detect.detect_batch`: for each image the same
    detections, labels equal, boxes within ``box_tol`` of the image size, scores within ``score_tol``;
    a detection present on one side only is accepted only when a tolerance explains it (its score is within
    ``score_tol`` of the threshold, or an overlapping same-class detection has a score within ``score_tol``: an NMS
    tie, or the other side holds ``max_detections`` and its lowest score is within ``score_tol``: a tie at the cut).

    Raises:
        ExportCheckError: naming the image, the detection and the difference.
    """
    check_backend(model, OnnxBackend(onnx_path), "ONNX Runtime", sample_images, box_tol, score_tol)


def check_backend(model, backend, runtime: str, sample_images: Sequence | None = None,
                  box_tol: float = 1e-3, score_tol: float = 1e-4) -> None:
    """:func:`check_onnx` for an opened ``backend`` of any runtime (named ``runtime`` in the messages); ``model`` is
    an ``nn.Module``, or a backend (another export, already checked against PyTorch)."""
    if sample_images is None:
        generator = torch.Generator().manual_seed(0)
        sample_images = [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator)
                         for h, w in ((240, 320), (300, 200))]
    ours = Detector(backend)
    reference = Detector(TorchBackend(model) if isinstance(model, nn.Module) else model)
    images = [to_image(item, index) for index, item in enumerate(sample_images)]
    fixed = ours.card.nms
    if fixed is None:
        _check_raw(reference, ours, images, box_tol, score_tol, runtime)
    thresholds = fixed or PREDICT
    options = thresholds.as_kwargs()
    expected, got = reference.predict(images, **options), ours.predict(images, **options)
    for index, (a, b) in enumerate(zip(expected, got)):
        scale = torch.tensor([a.width, a.height, a.width, a.height], dtype=torch.float32)
        for name, side, other in ((runtime, a, b), ("PyTorch", b, a)):
            problem = _unmatched(side, other, scale, thresholds, box_tol, score_tol)
            if problem:
                raise ExportCheckError(f"{backend.source}: image {index}: {problem} has no counterpart in {name}'s "
                                       f"output (tolerances: boxes {box_tol} of the image size, scores {score_tol})")


def _check_raw(reference, ours, images, box_tol: float, score_tol: float, runtime: str) -> None:
    batch, _ = ours.preprocess(images)
    loc, logits = (t.float().cpu() for t in reference.backend(batch))
    got_loc, got_logits = ours.backend(batch)
    priors, variances = ours.backend.priors, ours.card.variances
    box_diff = (decode(got_loc, priors, variances) - decode(loc, priors, variances)).abs().max().item()
    score_diff = (got_logits.softmax(-1) - logits.softmax(-1)).abs().max().item()
    if not box_diff <= box_tol or not score_diff <= score_tol:  # `not <=` also catches NaN
        raise ExportCheckError(
            f"{runtime}'s raw outputs differ from PyTorch's: largest box difference {box_diff:.3g} of the image "
            f"size (allowed {box_tol}), largest score difference {score_diff:.3g} (allowed {score_tol})"
        )


def _unmatched(result, other, scale: Tensor, thresholds: Thresholds, box_tol: float, score_tol: float
               ) -> str | None:
    """The first detection of ``result`` without a counterpart in ``other`` (same label, box and score within the
    tolerances) that no tolerance explains; ``None`` when all match."""
    if len(result.scores) == 0:
        return None
    same_label = result.labels[:, None] == other.labels[None, :]  # [N, M]
    box_close = ((result.boxes[:, None] - other.boxes[None, :]).abs() <= box_tol * scale).all(-1)
    score_diff = (result.scores[:, None] - other.scores[None, :]).abs()
    matched = (same_label & box_close & (score_diff <= score_tol)).any(1)
    near_threshold = result.scores <= thresholds.score_threshold + score_tol
    tie = (same_label & (score_diff <= score_tol) & (box_iou(result.boxes, other.boxes) > thresholds.iou_threshold)
           ).any(1)
    # the other side kept max_detections and cut this one at a score equal within the tolerance
    at_cut = (result.scores <= other.scores.min() + score_tol if len(other.scores) >= thresholds.max_detections
              else torch.zeros_like(matched))
    bad = ~(matched | near_threshold | tie | at_cut)
    if not bad.any():
        return None
    i = int(bad.nonzero()[0])
    box = [round(v, 2) for v in result.boxes[i].tolist()]
    return f"detection {i} (label {int(result.labels[i])}, score {float(result.scores[i]):.6f}, box {box})"

"""The timing of ``ssd benchmark``: every runtime timed in turn, call by call, so that whatever else loads the
machine hits every row alike (as ``benchmarks/`` do), after a warm-up of each.

At batch 1 each call is split into the three stages of the one pipeline of
:meth:`ssd.inference.detector.Detector.detect`: :meth:`~ssd.inference.detector.Detector.preprocess`, then
:func:`ssd.detect.detect_batch`, whose network call (the backend's ``__call__``, or ``nms_detections`` for graphs
with their own NMS) is timed on its own: the rest of ``detect_batch`` is post-processing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ssd.detect import detect_batch
from ssd.inference.backends import Backend
from ssd.inference.detector import Detector
from ssd.settings import PREDICT

__all__ = ["Timing", "time_backends"]

TIMING_ERRORS = (ValueError, OSError, RuntimeError)


@dataclass(frozen=True)
class Timing:
    """Milliseconds per image at batch 1 (``p50_ms``, ``p90_ms`` of the whole pipeline; ``pre_ms``, ``network_ms``,
    ``post_ms`` the medians of its stages) and ``images_per_s`` at the largest batch size."""

    p50_ms: float
    p90_ms: float
    images_per_s: float
    pre_ms: float
    network_ms: float
    post_ms: float


class _TimedNetwork:
    """``backend`` as :func:`ssd.detect.detect_batch` reads it, adding up the seconds its network calls take."""

    def __init__(self, backend: Backend):
        self.backend, self.seconds = backend, 0.0

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def _timed(self, call, *args, **kwargs):
        start = time.perf_counter()
        outputs = call(*args, **kwargs)
        _synchronize(self.backend.device)
        self.seconds += time.perf_counter() - start
        return outputs

    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._timed(self.backend, batch)

    def nms_detections(self, batch: torch.Tensor, **options) -> list[dict[str, torch.Tensor]]:
        return self._timed(self.backend.nms_detections, batch, **options)


def _synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _stages(detector: Detector, image: torch.Tensor) -> tuple[float, float, float]:
    """Seconds of ``(pre, network, post)`` of one ``image [3, H, W]`` through the pipeline."""
    network = _TimedNetwork(detector.backend)
    start = time.perf_counter()
    batch, sizes = detector.preprocess([image])
    _synchronize(network.device)
    preprocessed = time.perf_counter()
    detect_batch(network, batch, sizes, **PREDICT.as_kwargs())
    _synchronize(network.device)
    done = time.perf_counter()
    return preprocessed - start, network.seconds, done - preprocessed - network.seconds


def _batch_seconds(detector: Detector, batch: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    detector.detect(batch, **PREDICT.as_kwargs())
    return time.perf_counter() - start


def time_backends(backends: Mapping[str, Backend], images: list[torch.Tensor], batch_size: int, runs: int,
                  warmup: int) -> dict[str, Timing | Exception]:
    """Time each of ``backends`` (row name -> backend) on ``images`` (``[3, H, W]`` uint8, used in turn):
    ``warmup`` then ``runs`` images at batch 1, then ``max(2, runs // batch_size)`` batches of ``batch_size``
    (after one warm-up batch), every round calling each backend once. A backend that raises is dropped from the
    rounds; its entry is the error."""
    detectors = {name: Detector(backend) for name, backend in backends.items()}
    errors: dict[str, Exception] = {}
    stages: dict[str, list[tuple[float, float, float]]] = {name: [] for name in detectors}
    spans: dict[str, list[float]] = {name: [] for name in detectors}
    batch = (images * math.ceil(batch_size / len(images)))[:batch_size]

    def each(call, *args) -> None:
        for name, detector in detectors.items():
            if name not in errors:
                try:
                    call(name, detector, *args)
                except TIMING_ERRORS as e:
                    errors[name] = e

    def record(name: str, detector: Detector, image: torch.Tensor) -> None:
        stages[name].append(_stages(detector, image))

    def record_batch(name: str, detector: Detector) -> None:
        spans[name].append(_batch_seconds(detector, batch))

    for i in range(warmup):
        each(lambda name, detector, image: _stages(detector, image), images[i % len(images)])
    for i in range(runs):
        each(record, images[i % len(images)])
    if batch_size > 1:
        each(lambda name, detector: _batch_seconds(detector, batch))
        for _ in range(max(2, runs // batch_size)):
            each(record_batch)
    return {name: errors.get(name) or _timing(stages[name], spans[name], batch_size) for name in detectors}


def _timing(stages: list[tuple[float, float, float]], spans: list[float], batch_size: int) -> Timing:
    seconds = np.asarray(stages)  # [runs, 3]
    p50, p90 = np.percentile(seconds.sum(axis=1), [50, 90]) * 1000
    pre, network, post = np.median(seconds, axis=0) * 1000
    images_per_s = batch_size / float(np.median(spans)) if spans else 1000 / p50
    return Timing(*(round(float(v), 2) for v in (p50, p90, images_per_s, pre, network, post)))

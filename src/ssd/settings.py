"""One table of defaults, read by the CLI and the Python API alike, and the error for a bad option value.

Thresholds use one vocabulary everywhere: ``score_threshold`` (keep scores strictly above; ``--conf``),
``iou_threshold`` (per-class NMS; ``--iou``) and ``max_detections`` (per image; ``--max-det``).

- ``PREDICT``: what a user sees (``ssd predict``, ``ssd.load(...).predict()``, ``Detector``, exported NMS graphs, the
  drawn validation figures of a run). A model that stores its own operating point (the confidence that maximised F1
  in its final validation) uses that confidence instead; an explicit value always wins.
- ``EVALUATE``: what is scored (``ssd val``, ``ssd.evaluate``, training's validation): a low confidence and many
  detections per image, as mAP needs the whole precision-recall curve.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ConfigError", "Thresholds", "PREDICT", "EVALUATE", "THRESHOLD_OPTIONS"]


class ConfigError(ValueError):
    """An unknown option or an invalid value (the message names the option, the value and the rule)."""


@dataclass(frozen=True)
class Thresholds:
    """Post-processing settings: ``score_threshold`` in [0, 1), ``iou_threshold`` in [0, 1], ``max_detections`` >= 1."""

    score_threshold: float
    iou_threshold: float
    max_detections: int

    def as_kwargs(self) -> dict[str, float | int]:
        return {"score_threshold": self.score_threshold, "iou_threshold": self.iou_threshold,
                "max_detections": self.max_detections}


PREDICT = Thresholds(score_threshold=0.25, iou_threshold=0.45, max_detections=100)
EVALUATE = Thresholds(score_threshold=0.01, iou_threshold=0.45, max_detections=200)

THRESHOLD_OPTIONS = {"score_threshold": "--conf", "iou_threshold": "--iou", "max_detections": "--max-det"}
"""How the CLI spells each threshold, on every subcommand that takes it."""

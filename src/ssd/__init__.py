"""SSD (Single Shot MultiBox Detector) object detection that just works on your own data.

Label convention: a dataset with K object classes has labels 0..K-1 and ``num_classes = K``.
The background class is added internally (classifier heads have K+1 outputs).

The public names below are imported on first use (PEP 562), so ``import ssd`` and ``ssd --help`` do not pay for
torch, the models or the engine until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ssd._version import __version__

# public name -> the module that defines it, by layer
_EXPORTS: dict[str, str] = {
    # core
    "VARIANCES": "ssd.boxes",
    "decode": "ssd.boxes",
    "encode": "ssd.boxes",
    "MultiBoxLoss": "ssd.loss",
    "match": "ssd.matching",
    "postprocess_detections": "ssd.postprocess",
    "PRIOR_CONFIGS": "ssd.priors",
    "PriorConfig": "ssd.priors",
    "default_boxes": "ssd.priors",
    "validate_targets": "ssd.checks",
    # models and checkpoints
    "ModelCard": "ssd.card",
    "CheckpointError": "ssd.errors",
    "load_checkpoint": "ssd.weights.checkpoint",
    "save_checkpoint": "ssd.weights.checkpoint",
    "SSD": "ssd.models",
    "ModelConfig": "ssd.models.config",
    "build_model": "ssd.models",
    "import_model": "ssd.models.importers",
    "list_models": "ssd.models",
    "model_from_checkpoint": "ssd.models.load",
    # data
    "DataError": "ssd.errors",
    "check_dataset": "ssd.data.check",
    "generate_synthetic": "ssd.data.synthetic",
    "load_dataset": "ssd.data.load",
    # training, evaluation, export and inference
    "TrainConfig": "ssd.training.config",
    "train": "ssd.training.trainer",
    "evaluate": "ssd.evaluation.evaluator",
    "evaluate_split": "ssd.evaluation.evaluator",
    "evaluate_coco": "ssd.evaluation.coco",
    "evaluate_voc": "ssd.evaluation.metrics",
    "voc_ap": "ssd.evaluation.metrics",
    "export_onnx": "ssd.export.onnx",
    "run_benchmark": "ssd.export.benchmark",
    "Detector": "ssd.inference.detector",
    "load": "ssd.inference.detector",
    "Result": "ssd.inference.results",
    "open_backend": "ssd.inference.backends",
    "register_backend": "ssd.inference.backends",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ssd' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from ssd.boxes import VARIANCES, decode, encode
    from ssd.card import ModelCard
    from ssd.checks import validate_targets
    from ssd.data.check import check_dataset
    from ssd.data.load import load_dataset
    from ssd.data.synthetic import generate_synthetic
    from ssd.errors import CheckpointError, DataError
    from ssd.evaluation.coco import evaluate_coco
    from ssd.evaluation.evaluator import evaluate, evaluate_split
    from ssd.evaluation.metrics import evaluate_voc, voc_ap
    from ssd.export.benchmark import run_benchmark
    from ssd.export.onnx import export_onnx
    from ssd.inference.backends import open_backend, register_backend
    from ssd.inference.detector import Detector, load
    from ssd.inference.results import Result
    from ssd.loss import MultiBoxLoss
    from ssd.matching import match
    from ssd.models import SSD, build_model, list_models
    from ssd.models.config import ModelConfig
    from ssd.models.importers import import_model
    from ssd.models.load import model_from_checkpoint
    from ssd.postprocess import postprocess_detections
    from ssd.priors import PRIOR_CONFIGS, PriorConfig, default_boxes
    from ssd.training.config import TrainConfig
    from ssd.training.trainer import train
    from ssd.weights.checkpoint import load_checkpoint, save_checkpoint

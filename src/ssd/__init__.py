"""SSD (Single Shot MultiBox Detector) object detection that just works on your own data.

Label convention: a dataset with K object classes has labels 0..K-1 and ``num_classes = K``.
The background class is added internally (classifier heads have K+1 outputs).
"""

from ssd._version import __version__

# Public API: each area adds its re-exports in its own block below.
# --- core ---
from ssd.boxes import decode, encode
from ssd.loss import MultiBoxLoss
from ssd.matching import match
from ssd.postprocess import postprocess
from ssd.priors import PRIOR_CONFIGS, default_boxes
from ssd.validation import validate_targets
# --- models ---
from ssd.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from ssd.models import SSD, build_model, import_model, list_models, model_from_checkpoint
# --- data ---
from ssd.data import check, generate_synthetic, load_dataset
# --- engine ---
from ssd.config import TrainConfig
from ssd.engine.trainer import evaluate, train
from ssd.engine.evaluator import evaluate_model
from ssd.engine.metrics import evaluate_coco, evaluate_voc, voc_ap
from ssd.engine.export import export_onnx
from ssd.engine.predictor import Detector, load

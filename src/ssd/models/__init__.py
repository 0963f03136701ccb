"""SSD architectures: the :class:`SSD` module and the named configurations (see :func:`list_models`)."""

from ssd.models.backbone_weights import BackboneWeightsError
from ssd.models.build import MODEL_CONFIGS, build_model, list_models, model_from_checkpoint, read_weights
from ssd.models.ssd import SSD
from ssd.weights.finetune import set_backbone_trainable
from ssd.weights.importers import WeightsImportError, import_model

__all__ = ["SSD", "MODEL_CONFIGS", "build_model", "list_models", "model_from_checkpoint", "BackboneWeightsError",
           "import_model", "WeightsImportError", "set_backbone_trainable", "read_weights"]

"""SSD architectures: the :class:`SSD` module and the named configurations (see :func:`list_models`)."""

from ssd.models.build import MODEL_CONFIGS, build_model, list_models, model_from_checkpoint, read_weights
from ssd.models.finetune import set_backbone_trainable
from ssd.models.importers import WeightsImportError, import_model
from ssd.models.ssd import SSD
from ssd.models.weights import BackboneWeightsError

__all__ = ["SSD", "MODEL_CONFIGS", "build_model", "list_models", "model_from_checkpoint", "BackboneWeightsError",
           "import_model", "WeightsImportError", "set_backbone_trainable", "read_weights"]

"""SSD architectures: the :class:`SSD` module and the named configurations (see :func:`list_models`), and models
from weights files: rebuilt from checkpoints (:mod:`~ssd.models.load`), imported from other detectors
(:mod:`~ssd.models.importers`) or fine-tuned to other classes (:mod:`~ssd.models.finetune`)."""

from ssd.models.build import MODEL_CONFIGS, build_model, list_models
from ssd.models.ssd import SSD

__all__ = ["SSD", "MODEL_CONFIGS", "build_model", "list_models"]

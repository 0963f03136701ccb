"""Default boxes (priors): their configuration and presets, generation, coverage of a dataset's boxes and fitting."""

from ssd.priors.config import PRIOR_CONFIGS, PriorConfig, default_boxes

__all__ = ["PRIOR_CONFIGS", "PriorConfig", "default_boxes"]

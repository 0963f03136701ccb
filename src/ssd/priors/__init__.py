"""Default boxes (priors): :class:`PriorConfig` and its presets, generation, coverage of a dataset's boxes
(:mod:`ssd.priors.coverage`), fitting (:mod:`ssd.priors.fit`) and the priors file (:mod:`ssd.priors.io`)."""

from ssd.priors.config import PRIOR_CONFIGS, PriorConfig, default_boxes

__all__ = ["PRIOR_CONFIGS", "PriorConfig", "default_boxes"]

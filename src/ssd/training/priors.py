"""The default boxes a run asks for (``TrainConfig.priors``: ``None``, ``"auto"`` or a priors file), resolved into
one :class:`ssd.priors.PriorConfig` (or ``None``: the model's own) before the model is built."""

from __future__ import annotations

from torch import Tensor

from ssd.data.coverage import fit_for_model
from ssd.data.records import DatasetSpec
from ssd.errors import PriorConfigError
from ssd.log import LOGGER
from ssd.models import MODEL_CONFIGS
from ssd.models.build import default_priors
from ssd.priors import PriorConfig
from ssd.priors.io import load_priors
from ssd.sizes import input_size, size_text

__all__ = ["resolve_priors"]


def resolve_priors(spec_or_boxes: DatasetSpec | Tensor | None, model_name: str,
                   image_size: int | tuple[int, int] | str | None,
                   value: str | None, *, seed: int = 0) -> PriorConfig | None:
    """The default boxes of ``value``: ``None`` (the model's own: returns ``None``), ``"auto"`` (fitted to the
    training split of ``spec_or_boxes``; ``None`` when the fit gains too little to change them) or the path of a
    priors file (checked against ``model_name``; fitted at another input size, scaled to ``image_size`` by
    :meth:`ssd.priors.PriorConfig.scaled_to` onto the network's feature maps and steps at that size).
    Pass the result to ``build_model(..., priors=...)`` / ``model_from_checkpoint(..., priors=...)``."""
    if value is None:
        return None
    size = input_size(MODEL_CONFIGS[model_name].image_size if image_size is None else image_size)
    if value == "auto":
        if spec_or_boxes is None:
            raise PriorConfigError("priors=auto fits the default boxes to the training data, but no data was given")
        result = fit_for_model(spec_or_boxes, model_name, size, seed=seed)
        b, a = result.before["covered"], result.after["covered"]
        LOGGER.info(f"priors auto: default boxes of {model_name} at {size_text(size)} px "
            + (f"fitted to {result.before['boxes']} training boxes: coverage {b:.1%} -> {a:.1%}" if result.changed
               else f"kept: coverage {b:.1%} (a fit reaches {a:.1%}, too little to change them)"))
        return result.priors if result.changed else None
    priors, model, file_size = load_priors(value)
    if model is not None and model != model_name:
        raise PriorConfigError(f"{value} holds default boxes for {model}, not {model_name}: fit them for this model "
                               f"with `ssd check DATA --model {model_name} --fit-priors`")
    if file_size is None or file_size == size:
        return priors
    target = default_priors(model_name, size)
    if len(priors.min_sizes) != len(target.feature_maps):
        raise PriorConfigError(f"{value} has {len(priors.min_sizes)} levels but {model_name} has "
                               f"{len(target.feature_maps)}")
    scaled = priors.scaled_to(file_size, size, target.feature_maps, target.steps)
    LOGGER.info(f"priors: {value} was fitted at {size_text(file_size)} px; box sizes scaled by "
        f"{scaled.min_sizes[0] / priors.min_sizes[0]:g} for {size_text(size)} px")
    return scaled

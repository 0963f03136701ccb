"""The typed description of a built model: :class:`ModelConfig` (saved in checkpoints as a plain dict)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ssd.boxes import VARIANCES
from ssd.errors import ModelConfigError
from ssd.priors import PriorConfig
from ssd.sizes import input_size

__all__ = ["ModelConfig"]


@dataclass(frozen=True)
class ModelConfig:
    """Everything that rebuilds an :class:`ssd.models.SSD` (with its class names and weights).

    Attributes:
        name: architecture name (a key of :data:`ssd.models.MODEL_CONFIGS`).
        num_classes: K, object classes (the heads have K+1 outputs, index 0 is background).
        image_size: the network input in pixels: an int (square side) or a ``(height, width)`` tuple (a square
            pair is stored as the int; ``ssd.sizes.as_hw`` gives ``(height, width)`` of either form).
        priors: the default boxes at ``image_size``.
        mean, std: per-channel normalization of images scaled to ``[0, 1]`` (RGB).
        variances: offset variances of the box encoding.
        channels_last: recommended memory format for training and inference.
        options: architecture options (e.g. ``reduced_tail``); read-only by convention.
    """

    name: str
    num_classes: int
    image_size: int | tuple[int, int]
    priors: PriorConfig
    mean: tuple[float, ...]
    std: tuple[float, ...]
    variances: tuple[float, float] = VARIANCES
    channels_last: bool = True
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", input_size(self.image_size))
        for name in ("mean", "std", "variances"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        object.__setattr__(self, "options", dict(self.options))

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with ``changes`` applied."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, numbers and strings (what checkpoints and ONNX metadata store)."""
        return {
            "name": self.name,
            "num_classes": self.num_classes,
            "image_size": list(self.image_size) if isinstance(self.image_size, tuple) else self.image_size,
            "priors": self.priors.to_dict(),
            "mean": list(self.mean),
            "std": list(self.std),
            "variances": list(self.variances),
            "channels_last": self.channels_last,
            "options": dict(self.options),
        }

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "the configuration") -> ModelConfig:
        """Read :meth:`to_dict`'s output back; a missing or malformed setting raises :class:`ModelConfigError`
        naming ``source``, the settings missing and what the file can still be used for."""
        if not isinstance(values, Mapping):
            raise ModelConfigError(f"{source}: the model configuration is a {type(values).__name__}, not a mapping")
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        missing = [name for name in required if name not in values]
        if missing:
            raise ModelConfigError(
                f"{source}: the model configuration lacks {', '.join(missing)} (it has {', '.join(values) or 'nothing'}"
                "); it was not written by this version of ssd or was edited. Rebuild the model with "
                "ssd.build_model(name, ...) and load its weights with model.load_state_dict(...) if they still fit")
        known = {f.name for f in dataclasses.fields(cls)}
        try:
            return cls(**{k: v for k, v in values.items() if k in known and k != "priors"},
                       priors=PriorConfig.from_dict(values["priors"]))
        except (TypeError, ValueError) as exc:
            raise ModelConfigError(f"{source}: malformed model configuration ({exc})") from None

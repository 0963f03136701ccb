"""The PyTorch backend: an :class:`ssd.models.SSD` (a checkpoint, or a module in memory) run eagerly."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from ssd.detect import model_input
from ssd.device import prepare_model
from ssd.errors import ConfigError
from ssd.nn import unwrap_model

__all__ = ["TorchBackend", "open_torch"]


class TorchBackend:
    """A PyTorch :class:`ssd.models.SSD` (unwrapped from DDP / ``torch.compile``), put in eval mode on ``device``.

    ``device``: default the model's own; ``half``: float16 autocast (CUDA only). The model and each batch are moved
    to ``device`` and made channels-last when the model's configuration recommends it. ``source``: the checkpoint
    it came from; ``card``: the model's (:attr:`ssd.models.SSD.card`).
    """

    name = "torch"

    def __init__(self, model: nn.Module, device: str | torch.device | None = None, half: bool = False,
                 source: Path | None = None):
        model = unwrap_model(model)
        self.source = source
        self.device = torch.device(device) if device is not None else model.priors.device
        if half and self.device.type != "cuda":
            raise ConfigError(f"half precision needs a CUDA device, got device={str(self.device)!r}")
        self.card = model.card
        self.model, self.channels_last = prepare_model(model, self.device, None)
        self.model.eval()
        self.half = half

    @property
    def priors(self) -> Tensor:
        """``[P, 4]`` cxcywh normalized, on ``device``."""
        return self.model.priors

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, S, S]`` -> ``(loc [B, P, 4], logits [B, P, K+1])`` (float16 logits with ``half``)."""
        batch = model_input(batch.to(self.device), self.channels_last)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=self.half):
            return self.model(batch)


def open_torch(path: Path, device: torch.device, half: bool) -> TorchBackend:
    """A checkpoint of this library, or a foreign detector :func:`ssd.models.load.read_weights` imports; its card
    (category ids and operating point included) is checked against the checksum stored with it."""
    from ssd.models.load import model_from_checkpoint

    return TorchBackend(model_from_checkpoint(path), device, half, source=path)  # its errors name the file

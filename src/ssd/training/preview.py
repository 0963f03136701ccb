"""The training loader as a run builds it (:func:`train_loader`, which the trainer calls), and its first batches
for ``ssd data browse --augmented`` (:func:`training_batches`): augmentation, mosaic and crops of a
:class:`TrainConfig`, with the same seed, so the page shows what the first epoch trains on."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

from torch.utils.data import DataLoader

from ssd.data import build_dataloader
from ssd.data.crops import parse_crop_scale
from ssd.data.gate import load_training_data
from ssd.data.load import validation_split
from ssd.data.records import ImageRecord
from ssd.distributed import DistInfo
from ssd.models.build import build_model
from ssd.models.config import ModelConfig
from ssd.training.config import TrainConfig

__all__ = ["train_loader", "training_batches"]


def train_loader(records: Sequence[ImageRecord], class_names: Sequence[str], mc: ModelConfig, config: TrainConfig,
                 info: DistInfo) -> DataLoader:
    """The training ``DataLoader`` of a run: ``config``'s augmentation, mosaic, crops, cache and seed at the model's
    input size and normalization, this process's share under torchrun."""
    return build_dataloader(
        records, class_names, mc.image_size, mc.mean, mc.std, train=True, batch_size=config.batch_size,
        workers=config.workers, seed=config.seed, augment=config.augment, cache_images=config.cache_images,
        crop_scale=parse_crop_scale(config.crop_scale), drop_last=True, rank=info.rank, world_size=info.world_size,
        mosaic=config.mosaic)


def training_batches(config: TrainConfig, data: str | Path, count: int
                     ) -> tuple[list[dict], list[str], tuple[float, ...], tuple[float, ...]]:
    """The first ``count`` batches (:func:`ssd.data.loader.collate` dicts) of ``config``'s training loader over the
    training records of ``data`` as a run takes them (the gate, ``skip_invalid``, ``val_fraction``), in one process
    without an image cache; the class names, and the model's ``mean`` / ``std`` to show the images."""
    spec = load_training_data(data, skip_invalid=config.skip_invalid)
    train = validation_split(spec, config.val_fraction, config.seed)[0] if config.val_fraction else \
        spec.records("train")
    mc = build_model(config.model, class_names=spec.class_names, image_size=config.image_size).config
    loader = train_loader(train, spec.class_names, mc, config.update(workers=0, cache_images=False), DistInfo())
    return list(itertools.islice(loader, count)), spec.class_names, mc.mean, mc.std

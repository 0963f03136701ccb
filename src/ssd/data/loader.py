"""``DetectionDataset``, ``collate`` and ``build_dataloader`` (reproducible, with optional RAM image cache).

Reproducibility: the sampler draws the epoch's order and one seed per item from ``torch.Generator(seed, epoch)``;
each item's augmentation runs under its own seed (``torch.random.fork_rng``), so the same ``seed`` gives the same
batches whatever the number of workers, and a resumed run can ``set_epoch`` to continue the sequence. The sampler
also carries the epoch's mosaic probability in each key (:mod:`ssd.data.mosaic` says why there).

Errors: a :class:`DataError` met while loading an item (e.g. an image that no longer decodes) is raised by the loader
with its own message, also from worker processes (where torch would wrap it in the worker's traceback).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset, Sampler
from torchvision import tv_tensors
from torchvision.transforms.v2 import functional as F

from ssd.data.crops import CachePlan, CropScale, decode_sizes
from ssd.data.disk_cache import DiskImages, disk_images
from ssd.data.image_cache import RamImages, cache_mode, ram_sizes
from ssd.data.images import read_image, read_image_size
from ssd.data.mosaic import Mosaic
from ssd.data.records import ImageRecord
from ssd.data.table import IGNORE, RecordTable
from ssd.data.transforms import build_transform
from ssd.errors import ConfigError, DataError
from ssd.limits import MAX_CROP_CACHE_BYTES
from ssd.sizes import as_hw, size_text

__all__ = ["DetectionDataset", "SeededSampler", "collate", "build_dataloader", "seed_worker", "plain_data_errors"]


class DetectionDataset(Dataset):
    """Images and targets of ``records`` through ``transform``.

    Args:
        records: the split's records (validated: labels in ``0..K-1``): a :class:`~ssd.data.table.RecordTable`
            (the gate's), which workers share as it is, or a list of :class:`ImageRecord`, packed into one.
        class_names: the K names (kept for users of the dataset; labels are already indices).
        transform: ``transform(image, target)`` as built by :func:`ssd.data.transforms.build_transform`; None keeps
            the uint8 image.
        image_size: when given (an int: square; or ``(height, width)``), images are resized to that size right after
            decoding (boxes scaled to match) so augmentation works on small images: fast, and what the final resize
            does anyway.
        keep_difficult: keep difficult / crowd objects (True for evaluation, where they are flagged and ignored;
            False for training, which leaves them out).
        cache_images: ``"ram"`` (or True): decode every image of ``cached`` once, up front, and keep the uint8
            tensors in RAM, within :data:`ssd.limits.MAX_CROP_CACHE_BYTES`: beyond it they are held downscaled by
            one factor (logged; each is resized back by the transform), and refused below
            :data:`~ssd.data.image_cache.MIN_CACHE_DOWNSCALE`. ``"disk"``: the images at the sizes decoded without
            a cache, in one memory-mapped file of the cache folder, built once and reused by later runs, workers
            and ranks (:mod:`ssd.data.image_cache`). ``"off"``, None or False: each image is decoded when read.
        cached: the items the RAM cache keeps (default: all): the items a rank reads, when they are fixed; mosaic
            partners are drawn among them.
        mosaic: the :class:`~ssd.data.mosaic.Mosaic` step applied to keys ``(i, seed, p)`` with ``p > 0`` (before
            ``transform``; the partners are read like the item, from the cache when there is one).
        crop_scale: training crops (:mod:`ssd.data.crops`, with a ``transform`` built with the same ``crop``): with
            ``image_size``, images are decoded at the size :func:`~ssd.data.crops.decode_sizes` gives (up to
            native, so the smallest crop still holds the input's pixels; within
            :data:`ssd.limits.MAX_CROP_CACHE_BYTES` when cached) instead of ``image_size``; :attr:`decode_plan`
            says what was decided (sizes, cache megabytes, downscale).

    Item ``i`` (or ``(i, seed)``, or ``(i, seed, mosaic probability)`` from :class:`SeededSampler`): ``(image
    [3, H, W] float normalized, target)`` with ``target = dict(boxes=BoundingBoxes [N, 4] pixel xyxy of the
    transformed image, labels int64 [N], difficult bool [N], image_id, path str, orig_size int64 [2] (h, w))``, with
    ``crop_scale`` also ``crop_dropped`` (int: boxes the crop dropped).
    """

    def __init__(self, records: Sequence[ImageRecord], class_names: Sequence[str], transform=None, *,
                 image_size: int | tuple[int, int] | None = None, keep_difficult: bool = True,
                 cache_images: bool | str | None = False, mosaic: Mosaic | None = None,
                 crop_scale: CropScale | None = None,
                 cached: Sequence[int] | None = None):
        self.records = RecordTable.from_records(records)  # a reader's table has float64 boxes: float32 here
        self.class_names = list(class_names)
        self.transform = transform
        self.image_size = image_size
        self._hw = None if image_size is None else as_hw(image_size)
        self.keep_difficult = keep_difficult
        self.mosaic = mosaic
        self._cache: RamImages | DiskImages | None = None
        cached = range(len(self.records)) if cached is None else cached
        self._pool = np.asarray(cached, np.int64)  # mosaic partners of the items in it are drawn in it
        self._place = np.full(len(self.records), -1, np.int64)  # item -> its position in the pool (-1: not in it)
        self._place[self._pool] = np.arange(len(self._pool))
        mode = cache_mode(cache_images)
        self.decode_plan: CachePlan | None = None
        self._sizes: Tensor | None = None  # [N, 2] (h, w) to decode each image at, when not image_size
        if crop_scale is not None and self._hw is not None:
            self.decode_plan = decode_sizes(self._native_sizes(), crop_scale, self._hw,
                                            MAX_CROP_CACHE_BYTES if mode == "ram" else None)
            self._sizes = self.decode_plan.sizes
        elif mode == "ram":
            self._sizes = ram_sizes(self._decoded_sizes(), list(cached), self._hw, MAX_CROP_CACHE_BYTES)
        if mode == "ram":
            self._cache = RamImages(cached, self._decode)
        elif mode == "disk":
            tag = (size_text(self._hw) if self._hw else "native") + (f" crops {crop_scale.text}" if crop_scale else "")
            self._cache = disk_images(self.records.paths.tolist(), self._decoded_sizes().numpy(), tag,
                                      self._decode)

    def __len__(self) -> int:
        return len(self.records)

    def _native_sizes(self) -> Tensor:
        """``[N, 2]`` (h, w) of the decoded images (a header read where the records do not say)."""
        table = self.records
        return torch.tensor([(int(h), int(w)) if h > 0 and w > 0 else read_image_size(table.path(i))[::-1]
                             for i, (w, h) in enumerate(table.sizes)], dtype=torch.int64).reshape(-1, 2)

    def _decoded_sizes(self) -> Tensor:
        """``[N, 2]`` (h, w) each image is decoded at."""
        if self._sizes is not None:
            return self._sizes
        return self._native_sizes() if self._hw is None else torch.tensor([self._hw] * len(self)).reshape(-1, 2)

    def _decode(self, index: int) -> Tensor:
        size = self._hw if self._sizes is None else tuple(self._sizes[index].tolist())
        image = read_image(self.records.path(index), min_size=size)
        if size is not None and tuple(image.shape[-2:]) != size:
            image = F.resize(image, list(size), antialias=True)
        return image

    def _sample(self, index: int) -> tuple[Tensor, dict]:
        """Item ``index`` before the transform: ``(image uint8 [3, H, W], target)`` with its kept objects' boxes
        (pixel xyxy of that image, clamped), labels and difficult flags."""
        table = self.records
        image = self._decode(index) if self._cache is None else self._cache.read(index, self._decode)
        width, height = (int(v) for v in table.sizes[index])
        h, w = height if height > 0 else image.shape[-2], width if width > 0 else image.shape[-1]
        rows = table.objects(index)
        ignore = (table.flags[rows] & IGNORE) != 0  # difficult or crowd
        kept = slice(None) if self.keep_difficult else ~ignore
        boxes = torch.tensor(table.boxes[rows][kept]).reshape(-1, 4)
        boxes *= torch.tensor([image.shape[-1] / w, image.shape[-2] / h] * 2)
        target = {
            "boxes": F.clamp_bounding_boxes(tv_tensors.BoundingBoxes(boxes, format="XYXY",
                                                                     canvas_size=tuple(image.shape[-2:]))),
            "labels": torch.tensor(table.labels[rows][kept], dtype=torch.int64),
            "difficult": torch.tensor(ignore[kept], dtype=torch.bool),
            "orig_size": torch.tensor([h, w]),
        }
        return image, target

    def __getitem__(self, key: int | tuple[int, int] | tuple[int, int, float]):
        index, seed, mosaic = (*key, 0.0)[:3] if isinstance(key, tuple) else (key, None, 0.0)
        image, target = self._sample(index)
        if mosaic > 0:
            if self.mosaic is None:
                raise ConfigError(f"item {key}: a mosaic probability {mosaic} was given to a dataset built without "
                                  "the mosaic step (DetectionDataset(mosaic=Mosaic(...)))")
            place = int(self._place[index])
            pool, place = (self._pool, place) if place >= 0 else (range(len(self)), index)
            plan = self.mosaic.plan(place, len(pool), seed, mosaic)
            if plan is not None:
                orig_size = target["orig_size"]  # the item's own image, as without the mosaic
                partners = [self._sample(int(pool[j])) for j in plan.partners]
                image, target = self.mosaic([(image, target), *partners], plan.centre)
                target["orig_size"] = orig_size
        image = tv_tensors.Image(image)
        if self.transform is not None:
            with torch.random.fork_rng(devices=[], enabled=seed is not None):
                if seed is not None:
                    torch.manual_seed(seed)
                image, target = self.transform(image, target)
        target.update(image_id=self.records.image_id(index), path=self.records.paths[index])
        return image, target


class SeededSampler(Sampler):
    """Yields ``(index, item seed, mosaic probability)``; order and seeds come from ``(seed, epoch)``; epoch advances
    on each pass. ``mosaic`` (:meth:`set_mosaic`, set by the trainer at each epoch start) is read when a pass begins.

    ``rank``/``world_size`` shard the epoch's order for distributed training (every rank sees the same permutation):
    by default rank ``r`` takes every ``world_size``-th item of it, so its items change every epoch (as
    ``DistributedSampler``). ``fixed_shard``: rank ``r`` always takes the items ``i`` with ``i % world_size == r``,
    in the epoch's order (a shuffle within its shard), so that it can cache only those (``--cache-images ram``).
    The trade-off: a rank never sees the other ranks' items, so each rank's batches (and, without SyncBatchNorm,
    its BatchNorm statistics) come from its fixed share; the global batch still mixes every share, the item seeds
    are the same as without, and the shards are interleaved (balanced on a dataset sorted by source or class).
    """

    def __init__(self, length: int, shuffle: bool, seed: int = 0, rank: int = 0, world_size: int = 1,
                 fixed_shard: bool = False):
        self.length, self.shuffle, self.seed = length, shuffle, seed
        self.rank, self.world_size, self.fixed_shard = rank, world_size, fixed_shard
        self.epoch = 0
        self.mosaic = 0.0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def set_mosaic(self, probability: float) -> None:
        self.mosaic = probability

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.world_size))

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        self.epoch += 1
        mosaic = self.mosaic
        order = torch.randperm(self.length, generator=g) if self.shuffle else torch.arange(self.length)
        seeds = torch.randint(0, 2**62, (self.length,), generator=g)
        mine = order[order % self.world_size == self.rank] if self.fixed_shard else order[self.rank::self.world_size]
        for i in mine.tolist():
            yield i, int(seeds[i]), mosaic


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn``: seed ``random`` and ``numpy`` from the worker's torch seed (from the loader's generator)."""
    seed = torch.initial_seed() % 2**32
    random.seed(seed)
    np.random.seed(seed)


class _Failed(NamedTuple):
    """A :class:`DataError` message carried from a worker to the main process as a value (see :class:`_Loader`)."""

    message: str


class _Guarded(Dataset):
    """``dataset[key]``, or :class:`_Failed` with the message of the :class:`DataError` it raised."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        try:
            return self.dataset[key]
        except DataError as e:
            return _Failed(str(e))


class _Loader(DataLoader):
    """A ``DataLoader`` over a :class:`_Guarded` dataset that raises a failed item's :class:`DataError` itself."""

    def __iter__(self):
        for batch in super().__iter__():
            if isinstance(batch, _Failed):
                raise DataError(batch.message)
            yield batch


def collate(batch: list[tuple[Tensor, dict]]) -> dict:
    """Stack images and pad targets for the core's ``match`` / ``MultiBoxLoss``.

    Returns ``dict(images [B, 3, H, W], boxes [B, G, 4] xyxy normalized per axis to the network input (zeros in
    padding), labels [B, G] int64 (-1 in padding), difficult [B, G] bool, paths list[str], orig_sizes [B, 2] int64
    (h, w), image_ids list, crop_dropped int)`` with ``G = max(1, most objects in an image)`` (a batch without
    objects has one padding row); ``crop_dropped`` sums the items' boxes dropped by training crops (0 without).
    A batch holding a :class:`_Failed` item is that item (the loader raises it).
    """
    failed = next((item for item in batch if isinstance(item, _Failed)), None)
    if failed is not None:
        return failed
    images = torch.stack([torch.as_tensor(img) for img, _ in batch])
    scale = torch.tensor([images.shape[-1], images.shape[-2]] * 2, dtype=torch.float32)
    boxes = pad_sequence([t["boxes"].as_subclass(Tensor).float() / scale for _, t in batch], batch_first=True)
    labels = pad_sequence([t["labels"] for _, t in batch], batch_first=True, padding_value=-1)
    difficult = pad_sequence([t["difficult"] for _, t in batch], batch_first=True)
    if labels.shape[1] == 0:
        boxes, labels, difficult = boxes.new_zeros(len(batch), 1, 4), labels.new_full((len(batch), 1), -1), \
            difficult.new_zeros(len(batch), 1)
    return {"images": images, "boxes": boxes, "labels": labels, "difficult": difficult,
            "paths": [t["path"] for _, t in batch], "orig_sizes": torch.stack([t["orig_size"] for _, t in batch]),
            "image_ids": [t["image_id"] for _, t in batch],
            "crop_dropped": sum(t.get("crop_dropped", 0) for _, t in batch)}


def build_dataloader(records: Sequence[ImageRecord], class_names: Sequence[str], image_size: int | tuple[int, int],
                     mean: Sequence[float], std: Sequence[float], train: bool, batch_size: int, workers: int = 0,
                     seed: int = 0, *, augment: str = "ssd", keep_difficult: bool | None = None,
                     cache_images: bool | str | None = False, crop_scale: CropScale | None = None,
                     shuffle: bool | None = None,
                     drop_last: bool = False, rank: int = 0, world_size: int = 1, pin_memory: bool = False,
                     mosaic: float = 0.0) -> DataLoader:
    """A ``DataLoader`` of :func:`collate` batches for ``records`` (a :class:`DataError` of an item is raised with
    its own message, with or without workers).

    ``image_size``: an int (square) or ``(height, width)``. ``train`` turns on augmentation (``augment`` level)
    and shuffling, and by default leaves difficult/crowd objects out (``keep_difficult`` overrides). Without
    shuffling (evaluation) each rank reads a fixed share; ``cache_images``: ``ram`` (or True), ``disk`` or off (see
    :class:`DetectionDataset`). ``ram`` keeps only the rank's share: under torchrun a shuffling rank then reads a
    fixed shard in a new order each epoch (:class:`SeededSampler` ``fixed_shard``, which says the trade-off), and
    draws mosaic partners in that share; ``disk`` keeps one file that every rank maps, and the shuffle and the
    partners stay global (as without a cache). The same ``seed`` gives the same batches, with any ``workers``.
    ``crop_scale`` (training): native-resolution crops (:mod:`ssd.data.crops`); the dataset's ``decode_plan``
    is ``loader.dataset.dataset.decode_plan``.
    ``loader.sampler.set_epoch(e)`` jumps to epoch ``e`` (resume). ``mosaic``: the probability of the mosaic step
    (:mod:`ssd.data.mosaic`; a train loader can change it with ``loader.sampler.set_mosaic(p)`` between epochs).
    """
    if mosaic and not train:
        raise ConfigError(f"mosaic={mosaic}: the mosaic step is a training augmentation (train=True)")
    crop_scale = crop_scale if train else None
    transform = build_transform(image_size, mean, std, train=train, augment=augment, crop=crop_scale)
    shuffle = train if shuffle is None else shuffle
    ram = cache_mode(cache_images) == "ram"
    fixed = world_size > 1 and shuffle and ram  # a rank caches only its shard
    # the RAM cache holds the rank's items when they are the same every pass; without it, mosaic partners come
    # from the whole split
    shard = range(rank, len(records), world_size) if ram and (fixed or not shuffle) else None
    dataset = DetectionDataset(records, class_names, transform, image_size=image_size,
                               keep_difficult=(not train) if keep_difficult is None else keep_difficult,
                               cache_images=cache_images, mosaic=Mosaic(image_size, mean) if train else None,
                               crop_scale=crop_scale, cached=shard)
    sampler = SeededSampler(len(dataset), shuffle=shuffle, seed=seed, rank=rank, world_size=world_size,
                            fixed_shard=fixed)
    sampler.set_mosaic(mosaic)
    return _Loader(_Guarded(dataset), batch_size=batch_size, sampler=sampler, num_workers=workers,
                   collate_fn=collate, drop_last=drop_last, pin_memory=pin_memory, worker_init_fn=seed_worker,
                   generator=torch.Generator().manual_seed(seed), persistent_workers=workers > 0)


@contextmanager
def plain_data_errors() -> Iterator[None]:
    """Re-raise a :class:`~ssd.errors.DataError` from a DataLoader worker with its own message: the worker
    wraps it in a message holding its whole traceback ("Caught DataError in DataLoader worker process 0 ...")."""
    try:
        yield
    except DataError as exc:
        text, name = str(exc), type(exc).__qualname__
        starts = [m.end() for m in re.finditer(rf"^\S*\b{re.escape(name)}: ", text, flags=re.MULTILINE)]
        if not text.startswith(f"Caught {type(exc).__name__} in DataLoader worker") or not starts:
            raise
        raise type(exc)(text[starts[-1]:].strip()) from None

"""``--cache-images``: its modes (:func:`cache_mode`) and the RAM cache (:class:`RamImages`, within
:data:`ssd.limits.MAX_CROP_CACHE_BYTES`: :func:`ram_sizes`); the disk cache is :mod:`ssd.data.disk_cache`. Both hold
exactly the arrays :class:`ssd.data.loader.DetectionDataset` would decode, so training batches are bit-identical
with the cache off, in RAM or on disk."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from torch import Tensor

from ssd.data.crops import fit_in_bytes
from ssd.device import usable_cores
from ssd.errors import ConfigError
from ssd.limits import value_text
from ssd.log import LOGGER
from ssd.names import did_you_mean
from ssd.sizes import size_text

__all__ = ["MIN_CACHE_DOWNSCALE", "CACHE_MODES", "Decode", "cache_mode", "ram_sizes", "RamImages"]

MIN_CACHE_DOWNSCALE = 0.25
"""The smallest factor the RAM cache may shrink the images by to stay within its memory bound (refused below)."""
CACHE_MODES = ("ram", "disk")
"""The values of ``cache_images`` that cache (``off``, False or None: no cache; True: ``ram``, as in older configs)."""
Decode = Callable[[int], Tensor]
"""The dataset's decoder: item index -> ``uint8 [3, h, w]`` at the size the cache holds."""


def cache_mode(value: object) -> str | None:
    """``cache_images`` as ``"ram"``, ``"disk"`` or None (off). True is ``ram`` (configs and checkpoints written
    when the option was a switch); False, None and ``"off"`` are off; anything else is a :class:`ConfigError`."""
    if value is None or value is False or value == "off":
        return None
    if value is True:
        return "ram"
    if value in CACHE_MODES:
        return str(value)
    raise ConfigError(f"cache_images={value_text(value)} is invalid: choose ram, disk or off (--cache-images)"
                      f"{did_you_mean(str(value), [*CACHE_MODES, 'off'])}")


def ram_sizes(wanted: Tensor, cached: list[int], hw: tuple[int, int] | None, max_bytes: int) -> Tensor | None:
    """The sizes that keep the RAM cache of the items ``cached`` within ``max_bytes``
    (:data:`ssd.limits.MAX_CROP_CACHE_BYTES`): None when the ``wanted [N, 2]`` sizes (``hw``, the input size, or
    native) fit, else theirs downscaled by one factor (logged), refused below :data:`MIN_CACHE_DOWNSCALE`."""
    sizes, nbytes, downscale = fit_in_bytes(wanted[cached], max_bytes)
    if downscale == 1.0:
        return None
    at = f" at {size_text(hw)}" if hw else ""
    total = 3 * int(wanted[cached].prod(dim=1).sum())
    text = (f"cache_images: {len(cached)} images{at} would take {total / 2**20:,.0f} MB, more than "
            f"ssd.limits.MAX_CROP_CACHE_BYTES ({max_bytes / 2**20:,.0f} MB)")
    if downscale < MIN_CACHE_DOWNSCALE:
        raise ConfigError(f"{text}: it would hold them downscaled by {downscale:.3f}, below "
                          f"{MIN_CACHE_DOWNSCALE}; train without cache_images (--cache-images), with "
                          "--cache-images disk or on fewer images")
    LOGGER.warning(f"{text}: cached downscaled by {downscale:.3f} ({nbytes / 2**20:,.0f} MB), each image "
                   "resized back when used")
    wanted[cached] = sizes.long()  # the others are decoded when read, at their size
    return wanted


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is a failed allocation (Python's ``MemoryError``, torch's allocator's ``RuntimeError``)."""
    return isinstance(error, MemoryError) or (isinstance(error, RuntimeError) and "allocate" in str(error))


class RamImages(dict[int, Tensor]):
    """The images of the items ``cached`` by index, decoded once up front (one thread per usable core).

    Raises :class:`ConfigError` (one line) when the machine runs out of memory while filling it, which can happen
    well below :data:`ssd.limits.MAX_CROP_CACHE_BYTES` on a small machine or beside other processes."""

    def __init__(self, cached: Sequence[int], decode: Decode) -> None:
        super().__init__()
        try:
            with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
                for index, image in zip(cached, pool.map(decode, cached)):
                    self[index] = image
        except (MemoryError, RuntimeError) as e:
            if not _out_of_memory(e):
                raise
            count, held = len(self), sum(t.numel() for t in self.values())
            self.clear()
            raise ConfigError(f"cache_images=ram: out of memory with {count} of {len(cached)} images cached "
                              f"({held / 2**20:,.0f} MB; {type(e).__name__}): train with --cache-images disk or off, "
                              "or free memory") from None

    def read(self, index: int, decode: Decode) -> Tensor:
        """Item ``index``'s image: the cached tensor, or ``decode(index)`` for an item not cached."""
        image = self.get(index)
        return decode(index) if image is None else image

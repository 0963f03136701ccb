"""Image files decoded ahead of inference, in threads: :func:`decode_files`.

Pillow releases the GIL while it decodes, so a few threads decode the next images while the network runs on the
current batch, instead of one image at a time between batches. At most ``ahead`` decoded images wait, so memory is
bounded whatever the number of files, and they come out in the order of the files.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from ssd.data.images import read_image
from ssd.errors import ConfigError
from ssd.pools import map_ahead
from ssd.schemas import PredictConfig

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["decode_files"]


def _decode(path: Path) -> Tensor | Exception:
    try:
        return read_image(path)
    except (ValueError, OSError) as e:  # an unreadable file is the caller's to report, in its place
        return e


def decode_files(paths: Iterable[Path], workers: int = PredictConfig.workers, ahead: int = 16
                 ) -> Iterator[tuple[Path, Tensor | Exception]]:
    """``(path, image [3, H, W] uint8)`` for each path in order, or ``(path, error)`` for a file that cannot be read
    (:func:`ssd.data.images.read_image`'s ``ValueError`` / ``OSError``). ``workers`` threads decode up to ``ahead``
    files ahead of the consumer; ``workers=0`` decodes each file when it is asked for, in the calling thread."""
    if workers < 0 or ahead < 1:
        raise ConfigError(f"workers must be >= 0 and ahead >= 1, got workers={workers}, ahead={ahead}")
    paths = iter(paths)
    if workers == 0:
        yield from ((path, _decode(path)) for path in paths)
        return
    with ThreadPoolExecutor(workers, thread_name_prefix="ssd-decode") as pool:
        yield from map_ahead(pool, lambda path: (path, _decode(path)), paths, ahead)

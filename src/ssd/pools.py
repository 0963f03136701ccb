"""Work run ahead on a thread pool, in order and bounded: :func:`map_ahead` (the disk image cache's build, the files
``ssd predict`` decodes ahead of the network)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from itertools import islice
from typing import TypeVar

__all__ = ["map_ahead"]

T, R = TypeVar("T"), TypeVar("R")


def map_ahead(pool: Executor, fn: Callable[[T], R], items: Iterable[T], ahead: int) -> Iterator[R]:
    """``fn(item)`` for each of ``items``, in their order, run on ``pool`` at most ``ahead`` items ahead of the
    consumer (memory bounded whatever the number of items); those not started yet are cancelled when the consumer
    stops (an error raised by ``fn`` or the consumer, Ctrl-C)."""
    items = iter(items)
    pending: deque[Future] = deque(pool.submit(fn, item) for item in islice(items, ahead))
    try:
        while pending:
            future = pending.popleft()
            for following in islice(items, 1):
                pending.append(pool.submit(fn, following))
            yield future.result()
    finally:
        for future in pending:
            future.cancel()

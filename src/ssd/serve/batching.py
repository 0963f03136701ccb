"""Dynamic batching: the images of concurrent requests gathered into one batch for the network.

A request's image waits in a queue; the gatherer takes the first one, then what is already waiting and, while other
requests are being decoded (:meth:`Batcher.arriving`: their bodies have arrived), what arrives within ``max_wait_ms``,
up to ``max_batch`` images (a lone request is never held back, nor by a client still sending its upload), and
runs each group of requests with the same options as one :meth:`ssd.inference.detector.Detector.detect` call (one
:func:`ssd.detect.detect_batch`) on a single inference thread, so the event loop keeps accepting requests while the
network runs. ``max_batch=1`` turns batching off.

A request whose caller stopped waiting (its deadline passed, its client went away) is dropped before its batch runs.
If the gathering task ends (a bug, or :meth:`Batcher.stop`), every waiting request fails with 503 at once and later ones
are refused, and :meth:`Batcher.problem` says why, for ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ssd.errors import RequestError
from ssd.inference.detector import Detector
from ssd.inference.results import Result
from ssd.schemas import ServeConfig
from ssd.settings import check_batching

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Batcher"]


@dataclass
class _Request:
    image: Tensor
    options: tuple[tuple[str, Any], ...]
    future: asyncio.Future


class Batcher:
    """Runs requests' images through ``detector`` in batches of up to ``max_batch``, gathered for at most
    ``max_wait_ms`` after the first; ``on_batch(size)`` is called for each batch run (the metrics).

    Use inside a running event loop: :meth:`start`, then :meth:`detect` from any number of tasks, then :meth:`stop`.
    """

    def __init__(self, detector: Detector, max_batch: int = ServeConfig.max_batch,
                 max_wait_ms: float = ServeConfig.max_wait_ms, on_batch: Callable[[int], None] | None = None):
        check_batching(max_batch, max_wait_ms)
        self.detector, self.max_batch, self.max_wait = detector, max_batch, max_wait_ms / 1000
        self.on_batch = on_batch
        self._queue: asyncio.Queue[_Request] = asyncio.Queue()
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task | None = None
        self._arriving = 0
        self._failure: str | None = None  # the last batch's error, until a batch succeeds
        self._taken: list[_Request] = []  # the batch being gathered or run

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Wrap what a request does between receiving its body and :meth:`detect` (decoding): the gatherer waits for
        such requests, up to ``max_wait_ms``, and for no others."""
        self._arriving += 1
        try:
            yield
        finally:
            self._arriving -= 1

    def start(self) -> None:
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ssd-inference")  # one batch at a time
        self._task = asyncio.get_running_loop().create_task(self._gather())
        self._task.add_done_callback(self._fail_waiting)

    def problem(self) -> str | None:
        """Why the batcher cannot answer (its task has ended, or the last batch failed), or ``None`` when ready."""
        if self._task is None or self._task.done():
            return "the batching task is not running" + (_ending(self._task) if self._task is not None else "")
        return self._failure

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    async def detect(self, image: Tensor, options: dict[str, Any]) -> Result:
        """Detections of one ``[3, H, W]`` uint8 image with ``Detector.detect``'s keyword ``options`` (thresholds,
        classes), run in a batch with the requests of equal options that arrive meanwhile."""
        if self._task is None or self._task.done():
            raise RequestError(f"server not ready: {self.problem()}", 503)
        future = asyncio.get_running_loop().create_future()
        self._queue.put_nowait(_Request(image, tuple(sorted(options.items())), future))
        return await future

    async def _gather(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = self._taken = [await self._queue.get()]
            deadline = loop.time() + self.max_wait
            while len(batch) < self.max_batch:
                if self._queue.empty():
                    remaining = deadline - loop.time()
                    if remaining <= 0 or not self._arriving:
                        break
                    try:
                        batch.append(await asyncio.wait_for(self._queue.get(), remaining))
                    except TimeoutError:
                        break
                else:
                    batch.append(self._queue.get_nowait())
            groups: dict[tuple, list[_Request]] = {}
            for request in (r for r in batch if not r.future.done()):  # done: its caller gave up
                groups.setdefault(request.options, []).append(request)
            for options, group in groups.items():
                await self._run(group, dict(options))
            self._taken = []  # let the batch's images go

    async def _run(self, group: list[_Request], options: dict[str, Any]) -> None:
        images = [request.image for request in group]
        try:
            results = await asyncio.get_running_loop().run_in_executor(
                self._executor, lambda: self.detector.detect(images, **options))
        except Exception as e:  # the requests of this batch fail with it; the server goes on with the next batch
            results = [e] * len(group)
            self._failure = f"the last batch failed ({type(e).__name__}: {e})"
        else:
            self._failure = None
            if self.on_batch is not None:
                self.on_batch(len(group))
        for request, result in zip(group, results):
            if request.future.done():  # the client went away
                continue
            if isinstance(result, Exception):
                request.future.set_exception(result)
            else:
                request.future.set_result(result)

    def _fail_waiting(self, task: asyncio.Task) -> None:
        """The gathering task has ended: fail the requests still queued (they would wait forever)."""
        error = RequestError(f"server not ready: the batching task has ended{_ending(task)}", 503)
        waiting = self._taken
        while not self._queue.empty():
            waiting.append(self._queue.get_nowait())
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(error)


def _ending(task: asyncio.Task) -> str:
    """How a finished task ended, for messages: `` (stopped)`` or `` (ValueError: ...)``."""
    if not task.done():
        return ""
    if task.cancelled():
        return " (stopped)"
    error = task.exception()
    return f" ({type(error).__name__}: {error})" if error is not None else ""

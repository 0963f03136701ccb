"""SIGTERM as Ctrl-C for ``ssd predict``: what ``docker stop``, ``systemctl stop``, ``timeout`` and ``kill`` send
ends a run as Ctrl-C does (the results so far in ``predictions.jsonl`` and the ``--format`` file, drawn videos
finished), instead of Python's default for SIGTERM, which ends the process where it stands."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Terminated", "sigterm_as_ctrl_c"]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C raises :class:`KeyboardInterrupt` (so every ``except KeyboardInterrupt`` and
    ``finally`` that completes outputs on Ctrl-C does so on SIGTERM too)."""


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises :class:`Terminated` in the main thread; a second SIGTERM is ignored while the
    outputs are completed (SIGKILL still ends the process). Outside the main thread (where Python cannot take
    signals), or where there is no SIGTERM, nothing changes. The previous handler is restored on leaving."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGTERM"):
        yield
        return

    def terminate(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)

"""The one channel for messages: the ``ssd`` logger and its progress bars.

Every module reports through :data:`LOGGER` (``logging.getLogger("ssd")``). As a library it prints nothing unless the
application configures logging (a :class:`logging.NullHandler` keeps Python's last-resort handler quiet); the
``ssd`` command shows INFO and above on stderr. Under torchrun :func:`quiet_other_ranks` (installed by
:func:`ssd.distributed.setup`) silences every process but rank 0, messages and progress bars alike; ``--quiet`` turns
the bars off with :func:`set_progress`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from tqdm import tqdm

__all__ = ["LOGGER", "progress", "set_progress", "progress_enabled", "quiet_other_ranks"]

LOGGER = logging.getLogger("ssd")
LOGGER.addHandler(logging.NullHandler())

_PROGRESS = {"enabled": True}


class _MainProcessOnly(logging.Filter):
    """Drops every record: installed on the ``ssd`` logger of processes other than rank 0."""

    def filter(self, record: logging.LogRecord) -> bool:
        return False


def set_progress(enabled: bool) -> None:
    """Show (``True``, the default) or hide every progress bar of this process."""
    _PROGRESS["enabled"] = enabled


def progress_enabled() -> bool:
    return _PROGRESS["enabled"]


def progress(iterable: Iterable[Any] | None = None, *, disable: bool | None = False, **options: Any) -> tqdm:
    """A :class:`tqdm` bar (``options`` are tqdm's), off when ``disable`` (``None``: shown on a terminal only, tqdm's
    rule), after :func:`set_progress(False) <set_progress>` or on a rank other than 0."""
    return tqdm(iterable, disable=True if not _PROGRESS["enabled"] else disable, **options)


def quiet_other_ranks(rank: int) -> None:
    """On a process of rank > 0, drop the ``ssd`` logger's records and hide progress bars; rank 0 is unchanged."""
    if rank == 0:
        return
    if not any(isinstance(f, _MainProcessOnly) for f in LOGGER.filters):
        LOGGER.addFilter(_MainProcessOnly())
    set_progress(False)

"""Plain text for messages and reports: tables (:func:`render_table`) and shortened lists (:func:`few`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["render_table", "few"]


def render_table(header: Sequence[Any], rows: Iterable[Sequence[Any]]) -> list[str]:
    """Lines of a plain-text table: the first column left-aligned, the others right-aligned, two spaces apart."""
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
            for row in cells]


def few(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` items joined by commas, then how many more there are."""
    shown = ", ".join(items[:limit])
    return shown + (f", ... ({len(items) - limit} more)" if len(items) > limit else "")

"""Plain text for messages and reports: tables (:func:`render_table`), shortened lists (:func:`few`) and URLs with
their secrets hidden (:func:`redact_url`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["render_table", "few", "redact_url"]


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


_SECRET = "***"


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+")


def redact_url(text: str) -> str:
    """``text`` with the secrets of every URL in it hidden: the user and password before ``@`` and every query and
    fragment value (``rtsp://user:pass@cam/live?token=abc`` -> ``rtsp://***@cam/live?token=***``). The one way a
    source's name is made for outputs, titles, logs and messages (a camera's URL is kept only to open it)."""
    return _URL.sub(lambda m: _redact_one(m.group()), text)


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    host, tail = rest[:end], rest[end:]
    if "@" in host:
        host = f"{_SECRET}@{host.rsplit('@', 1)[1]}"
    path, query_sep, query = tail.partition("?")
    if not query_sep:
        path, query_sep, query = tail.partition("#")
    if query_sep:
        query = re.sub(r"(^|[&;#])([^&;#=]*)=[^&;#]*", rf"\1\2={_SECRET}", query)
        query = re.sub(r"(^|[&;#])([^&;#=]+)(?=[&;#]|$)", rf"\1{_SECRET}", query)  # a bare value: ?abc123
    return f"{scheme}{sep}{host}{path}{query_sep}{query}"

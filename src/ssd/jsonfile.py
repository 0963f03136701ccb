"""The one JSON reader for the files a user hands the library (``ssd val --detections``).

:func:`read_json` is :func:`json.loads` with bounds: the file's size is checked against a bound before a byte is
read, nesting deeper than the interpreter can decode is one line (not a ``RecursionError``), ``NaN`` / ``Infinity``
(not JSON) are refused, and every error names the file (and the line and column where the text is not JSON).
Callers check each object as the decoder builds it (``object_hook``), so a file of millions of items is turned into
compact arrays instead of millions of dicts.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ssd.errors import JSONInputError
from ssd.files import describe_os_error

__all__ = ["read_json"]


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def read_json(path: str | os.PathLike, *, max_bytes: int, bound: str, what: str = "JSON file",
              object_hook: Callable[[dict[str, Any]], Any] | None = None, array: bool = False) -> Any:
    """The value of the JSON file ``path``, at most ``max_bytes`` long (``bound``: the name of that limit, for the
    message); ``object_hook`` as for :func:`json.loads` (it may raise :class:`JSONInputError` itself); ``array``:
    the top level must be a list (checked before anything is decoded).

    Raises:
        JSONInputError: naming ``path``: unreadable, over ``max_bytes``, not JSON (line and column), nested too
            deeply, or not a list where ``array`` asks for one; ``object_hook`` raises this type (or a subclass) for
            what it refuses.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise JSONInputError(f"{path}: {what} of {size:,} bytes is over the bound of {max_bytes:,} bytes "
                                     f"({bound})")
            data = f.read(max_bytes + 1)  # the file may grow while it is read
    except OSError as error:
        raise JSONInputError(f"cannot read {what}: {describe_os_error(error, path, action='reading')}") from None
    if len(data) > max_bytes:
        raise JSONInputError(f"{path}: {what} is over the bound of {max_bytes:,} bytes ({bound})")
    if array and not data.lstrip(b" \t\r\n\xef\xbb\xbf").startswith(b"["):
        raise JSONInputError(f"{path}: {what} must be a JSON list [...]")
    try:
        return json.loads(data, object_hook=object_hook, parse_constant=_no_constant)
    except JSONInputError:  # the object_hook's own, naming the file already
        raise
    except RecursionError:
        raise JSONInputError(f"{path}: {what} is nested too deeply to be what it should be") from None
    except json.JSONDecodeError as error:
        raise JSONInputError(f"{path}: not valid JSON at line {error.lineno}, column {error.colno}: "
                             f"{error.msg}") from None
    except UnicodeDecodeError as error:
        raise JSONInputError(f"{path}: not UTF-8 text (byte {error.start}): {what} must be JSON") from None
    except ValueError as error:  # NaN / Infinity, an integer of more than 4300 digits
        raise JSONInputError(f"{path}: {error}") from None

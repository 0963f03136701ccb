"""Small helpers shared by every layer: closest-name hints, plain-text tables, model unwrapping, checked loading,
optional dependencies (``require``).

This module imports nothing from the rest of the package (any layer may import it).
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Mapping, Sequence
from types import ModuleType
from typing import Any

from ssd.errors import MissingDependencyError

__all__ = ["closest_names", "did_you_mean", "render_table", "few", "unwrap_model", "state_dict_mismatch", "require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingDependencyError` when it (or a module it needs) is not
    installed: ``"<what> needs <module>: pip install 'ssd-detect[<extra>]'"``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = module if e.name in (None, module) else f"{module} ({e.name} is missing)"
        raise MissingDependencyError(f"{what} needs {missing}, from the optional '{extra}' dependencies: "
                                     f"pip install 'ssd-detect[{extra}]'") from e


def closest_names(name: str, known: Iterable[str], n: int = 3) -> list[str]:
    """Up to ``n`` names of ``known`` closest to ``name``: case-insensitive equals first, then difflib's."""
    known = [str(k) for k in known]
    name = str(name)
    same_case = [k for k in known if k.lower() == name.lower() and k != name]
    close = [k for k in difflib.get_close_matches(name, known, n=n, cutoff=0.5) if k not in same_case]
    return (same_case + close)[:n]


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'a', 'b'?"`` for the closest names, else ``"; valid: a, b, c"`` (every known name)."""
    known = [str(k) for k in known]
    close = closest_names(name, known, n)
    if close:
        return f"; did you mean {', '.join(map(repr, close))}?"
    return f"; valid: {', '.join(known)}"


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


def unwrap_model(model: Any) -> Any:
    """The plain module inside ``DistributedDataParallel`` / ``DataParallel`` / ``torch.compile`` wrappers."""
    from torch import nn

    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        else:
            return model


def state_dict_mismatch(expected: Mapping[str, Any], given: Mapping[str, Any], allowed_missing: Iterable[str] = ()
                        ) -> str | None:
    """What keeps ``given`` (a state dict) from loading into a module whose state dict is ``expected``, or ``None``.

    Returns ``"missing keys (N): ...; unexpected keys (N): ...; wrong shapes (N): key [given] (expected [...]);
    wrong types (N): key torch.int64 (expected floating point)"``, a few of each, for the caller to put in its own
    error (which names the file and the architecture). A floating-point tensor given as integers would load
    truncated: it is a wrong type.
    """
    allowed = set(allowed_missing)
    missing = [k for k in expected if k not in given and k not in allowed]
    unexpected = [k for k in given if k not in expected]
    mismatched = [f"{k} {list(given[k].shape)} (expected {list(v.shape)})"
                  for k, v in expected.items() if k in given and tuple(given[k].shape) != tuple(v.shape)]
    integral = [f"{k} {given[k].dtype} (expected floating point)" for k, v in expected.items()
                if k in given and v.is_floating_point() and not given[k].is_floating_point()]
    parts = [f"{label} ({len(keys)}): {few(keys)}"
             for label, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                 ("wrong shapes", mismatched), ("wrong types", integral)) if keys]
    return "; ".join(parts) or None

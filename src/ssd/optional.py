"""Optional dependencies (the pip extras of ssd-detect): :func:`require` imports one, or names the
``pip install`` that brings it in a :class:`~ssd.errors.MissingDependencyError` (the CLI prints it as one line)."""

from __future__ import annotations

import importlib
from types import ModuleType

from ssd.errors import MissingDependencyError

__all__ = ["require"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingDependencyError` when it (or a module it needs) is not
    installed: ``"<what> needs <module>: pip install 'ssd-detect[<extra>]'"``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = module if e.name in (None, module) else f"{module} ({e.name} is missing)"
        raise MissingDependencyError(f"{what} needs {missing}, from the optional '{extra}' dependencies: "
                                     f"pip install 'ssd-detect[{extra}]'") from e

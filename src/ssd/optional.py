"""Optional dependencies (the pip extras of ssd-detect): :func:`require` imports one, or names the
``pip install`` that brings it in a :class:`~ssd.errors.MissingDependencyError` (the CLI prints it as one line)."""

from __future__ import annotations

import functools
import importlib
import importlib.util
from types import ModuleType

from ssd.errors import MissingDependencyError

__all__ = ["require", "require_installed", "has_torch"]


def require(module: str, extra: str, what: str) -> ModuleType:
    """``importlib.import_module(module)``, or :class:`MissingDependencyError` when it (or a module it needs) is not
    installed: ``"<what> needs <module>: pip install 'ssd-detect[<extra>]'"``."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise _missing(module if e.name in (None, module) else f"{module} ({e.name} is missing)", extra, what) from e


def _missing(module: str, extra: str, what: str) -> MissingDependencyError:
    return MissingDependencyError(f"{what} needs {module}, from the optional '{extra}' dependencies: "
                                  f"pip install 'ssd-detect[{extra}]'")


def require_installed(module: str, extra: str, what: str) -> None:
    """:func:`require`'s check without the import (for a module imported elsewhere, e.g. in a child process)."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise _missing(module, extra, what)


@functools.cache
def has_torch() -> bool:
    """Whether PyTorch can be imported (without importing it): ``False`` on the runtime install
    (``pip install 'ssd-detect[runtime]'``), where exported files with the pipeline in their graph run on numpy."""
    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):  # an import hook refusing it, or a half-initialized module
        return False

"""The package facade (``src/ssd/__init__.py``) and the optional-dependency helper.

``_EXPORTS`` (public name -> defining module, imported lazily) and the ``TYPE_CHECKING`` imports that mirror it
for type checkers must name the same things; every public name must resolve; a missing extra is one line naming
the ``pip install`` that brings it."""

import ast
import importlib
import json
import sys
from pathlib import Path

import pytest

import ssd
from ssd.errors import MissingDependencyError
from ssd.optional import require

INIT = Path(__file__).resolve().parents[1] / "src" / "ssd" / "__init__.py"


def _exports_and_mirror() -> tuple[dict[str, str], dict[str, str]]:
    """``_EXPORTS`` as written, and ``{name: module}`` of the imports under ``if TYPE_CHECKING:``."""
    tree = ast.parse(INIT.read_text())
    exports, mirror = None, {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "_EXPORTS":
            exports = ast.literal_eval(node.value)
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom), ast.dump(statement)
                for alias in statement.names:
                    assert alias.asname is None, alias.name
                    assert alias.name not in mirror, f"{alias.name} imported twice under TYPE_CHECKING"
                    mirror[alias.name] = statement.module
    assert exports is not None, "no `_EXPORTS: dict[str, str] = {...}` in ssd/__init__.py"
    return exports, mirror


def test_the_type_checking_imports_mirror_the_lazy_exports():
    exports, mirror = _exports_and_mirror()
    assert mirror == exports
    assert ssd.__all__ == ["__version__", *exports]


def test_every_public_name_resolves_to_the_module_the_table_names():
    exports, _ = _exports_and_mirror()
    for name, module in exports.items():
        value = getattr(ssd, name)
        assert value is getattr(importlib.import_module(module), name), name
    with pytest.raises(AttributeError, match="module 'ssd' has no attribute 'trian'"):
        ssd.trian  # noqa: B018


def test_an_installed_module_is_returned_by_require():
    assert require("json", "export", "reading JSON") is json


def test_a_missing_extra_names_the_pip_install_that_brings_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed: `import onnx` raises ModuleNotFoundError
    with pytest.raises(MissingDependencyError) as e:
        require("onnx", "export", "ONNX export")
    assert str(e.value) == ("ONNX export needs onnx, from the optional 'export' dependencies: "
                            "pip install 'ssd-detect[export]'")
    assert isinstance(e.value, ImportError)

"""The import contract of pyproject.toml ([tool.importlinter]): layers, no import of the package root, no cycle.

Run by import-linter on this checkout's ``src/ssd``; a copy with an upward import, a root import and a cycle shows
that each contract can fail."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="import-linter is not installed (the dev extra: pip install -e '.[dev]')")

REPO = Path(__file__).resolve().parents[1]
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def lint_imports(src: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` with the contracts of this repository, on the ``ssd`` package under ``src``."""
    return subprocess.run([sys.executable, "-c", LINT, "--no-cache", "--no-logo", str(REPO / "pyproject.toml")],
                          capture_output=True, text=True, cwd=src, env={**os.environ, "PYTHONPATH": str(src)})


def test_the_package_keeps_its_import_contracts():
    result = lint_imports(REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken\.", result.stdout), result.stdout


def test_an_upward_import_a_root_import_and_a_cycle_break_the_contracts(tmp_path):
    shutil.copytree(REPO / "src" / "ssd", tmp_path / "ssd", ignore=shutil.ignore_patterns("__pycache__"))
    with open(tmp_path / "ssd" / "boxes.py", "a") as f:
        f.write("\nimport ssd.training.trainer  # noqa\n")  # core imports the training layer
    with open(tmp_path / "ssd" / "data" / "records.py", "a") as f:
        f.write("\nfrom ssd import load  # noqa\n")  # the lazy facade: it imports every layer
    with open(tmp_path / "ssd" / "priors" / "config.py", "a") as f:
        f.write("\nimport ssd.priors.fit  # noqa\n")  # fit.py imports config.py: a cycle inside one layer
    result = lint_imports(tmp_path)
    assert result.returncode == 1
    out = result.stdout
    assert "layers: nothing imports upward BROKEN" in out, out
    assert "nothing imports the package root (import ssd.x.y, not from ssd import name) BROKEN" in out
    assert "ssd.boxes is not allowed to import ssd.training" in out
    assert "ssd.data.records -> ssd (l." in out
    assert "No cycles are allowed in ssd.priors." in out

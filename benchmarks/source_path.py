"""The path of ``ssd predict --source X`` through the code: how many modules it enters, and how many times it comes
back to a module it left (issue 34: "reads top-down, with about half the modules and returns").

Method: ``ssd predict`` runs in this process on a folder of two images and a three-frame video (a seeded random
``ssd_tiny``, drawn copies on, the defaults otherwise) under ``sys.setprofile``. Every call into a function of the
``ssd`` package made beneath ``_cmd_predict`` in the main thread counts, except what runs inside ``load`` (opening
the model) and ``Detector.detect`` (running it), which are the same whatever the source, and module bodies run by an
import; comprehensions and generated ``__init__`` methods count as their caller. Counted:

- modules: the modules whose functions are called;
- cross-module calls: the distinct (caller function, callee function) pairs whose modules differ: each is a place
  where the path leaves a module and comes back to it when the call returns.

Both are given for the whole ``ssd`` package and for the modules a reader follows (``ssd.cli`` and
``ssd.inference``; the utilities below are leaves). Usage: ``PYTHONPATH=src .venv/bin/python
benchmarks/source_path.py [--list]`` (``--list``: the modules and calls themselves).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

from ssd.cli import main
from ssd.models import build_model
from ssd.weights.checkpoint import save_checkpoint

SKIPPED = {"load", "detect"}  # bodies not followed: the model opened, the model run
FOLLOWED = ("ssd.cli", "ssd.inference")


def _module(frame) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("ssd") else None


def trace(argv: list[str]) -> tuple[set[str], set[tuple[str, str, str, str]]]:
    """Run ``ssd`` with ``argv`` and return the modules entered and the cross-module calls (caller module, caller
    function, callee module, callee function) on the path (see the module docstring)."""
    modules: set[str] = set()
    calls: set[tuple[str, str, str, str]] = set()

    def profile(frame, event, arg):
        callee = _module(frame) if event == "call" else None
        code = frame.f_code
        if callee is None or code.co_name.startswith("<") or "__create_fn__" in code.co_qualname:
            return
        chain, above = [], frame.f_back
        while above is not None and (not chain or chain[-1][1] != "_cmd_predict"):
            if above.f_code.co_name == "<module>":  # a module body run by an import
                return
            if (module := _module(above)) is not None and not above.f_code.co_name.startswith("<"):
                chain.append((module, above.f_code.co_qualname))
            above = above.f_back
        names = [qualname.rsplit(".", 1)[-1] for _, qualname in chain]
        if "_cmd_predict" not in names or SKIPPED & set(names):
            return
        modules.add(callee)
        if chain and chain[0][0] != callee:
            calls.add((*chain[0], callee, code.co_qualname))

    sys.setprofile(profile)
    try:
        code = main(argv)
    finally:
        sys.setprofile(None)
    if code != 0:
        raise SystemExit(f"ssd {' '.join(argv)} exited {code}")
    return modules, calls


def _inputs(folder: Path) -> Path:
    """A folder of two 96x64 images and a three-frame MJPEG video."""
    folder.mkdir()
    for i in range(2):
        Image.new("RGB", (96, 64), (120, 30 * i, 200)).save(folder / f"img{i}.png")
    video = cv2.VideoWriter(str(folder / "clip.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10, (96, 64))
    for i in range(3):
        video.write(np.full((64, 96, 3), 40 * i, np.uint8))
    video.release()
    return folder


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print the modules and the calls too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        weights = save_checkpoint(root / "best.pt", build_model("ssd_tiny", class_names=["a", "b", "c"],
                                                                image_size=128))
        source = _inputs(root / "src")
        modules, calls = trace(["predict", "--weights", str(weights), "--source", str(source), "--save-dir",
                                str(root / "out"), "--exist-ok", "--quiet"])
    followed = {m for m in modules if m.startswith(FOLLOWED)}
    followed_calls = {c for c in calls if c[0].startswith(FOLLOWED) and c[2].startswith(FOLLOWED)}
    print(f"ssd package: {len(modules)} modules, {len(calls)} cross-module calls")
    print(f"ssd.cli and ssd.inference: {len(followed)} modules, {len(followed_calls)} cross-module calls")
    if args.list:
        print("\n".join(sorted(followed)))
        print("\n".join(f"{a}.{b} -> {c}.{d}" for a, b, c, d in sorted(followed_calls)))


if __name__ == "__main__":
    run()

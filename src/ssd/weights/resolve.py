"""From what a user names to the file to read: a weights file, a run directory's checkpoint, or known weights.

One rule for every command: to *deploy* (predict, val, export, import, fine-tune with ``--weights``) a run directory
gives ``weights/best.pt``, else ``weights/last.pt``, and a known detector name (``ssd300_vgg16_coco``, see
:mod:`ssd.weights.hub`) its cached file, downloaded once; to *resume* a run directory gives ``weights/last.pt`` (the
state to continue from). A file is returned as it is; what it holds is decided when it is read (``weights.identify``,
the backends).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import ssd.weights.hub as hub
from ssd.errors import CheckpointError

__all__ = ["resolve_weights", "RUN_CHECKPOINTS"]

RUN_CHECKPOINTS: dict[str, tuple[str, ...]] = {
    "deploy": ("weights/best.pt", "weights/last.pt", "best.pt", "last.pt"),
    "resume": ("weights/last.pt", "last.pt"),
}
"""The files a run directory is searched for, in order, per purpose."""


def resolve_weights(path: str | Path, purpose: Literal["deploy", "resume"] = "deploy") -> Path:
    """The file behind ``path``: the path itself when it is a file, else the run directory's checkpoint; to deploy,
    a known detector name that is no path gives its cached file (:func:`ssd.weights.hub.weights_file`).

    Raises:
        CheckpointError: ``path`` does not exist, or is a folder without the checkpoint ``purpose`` needs; to deploy,
            a name that is not known, or known weights that cannot be downloaded.
    """
    path = hub.weights_file(path) if purpose == "deploy" else Path(path)
    candidates = RUN_CHECKPOINTS[purpose]
    if path.is_dir():
        for name in candidates:
            if (path / name).is_file():
                return path / name
        wanted = " or ".join(candidates[:2])
        action = "resume from" if purpose == "resume" else "load weights from"
        raise CheckpointError(f"cannot {action} {path}: a folder without {wanted} (give a checkpoint file, an "
                              "exported model or a run directory)")
    if not path.is_file() and purpose == "resume":
        raise CheckpointError(f"cannot resume from {path}: no run directory or checkpoint is there (a run stopped "
                              "before it wrote its first checkpoint has nothing to resume: start it again without "
                              "--resume)")
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    return path

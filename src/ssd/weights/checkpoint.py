"""Self-describing checkpoints: saved atomically, loaded with ``torch.load(weights_only=True)``.

A checkpoint is a dict: ``format`` (:data:`FORMAT`), ``version`` (``__version__``), ``config`` (the model's
``config.to_dict()``), ``class_names``, ``model`` (state dict), plus whatever extras the caller adds (optimizer,
scheduler, scaler, epoch, rng, metrics, train_config ...). Everything in it must be plain data (dicts, lists, tuples,
strings, numbers, booleans, ``None``, tensors) so that loading never runs pickled code; :func:`save_checkpoint` checks
this before writing (RNG states, for instance, must be stored as tensors).
"""

from __future__ import annotations

import os
import pickle
import re
import secrets
import stat
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ssd._utils import unwrap_model
from ssd._version import __version__

__all__ = ["FORMAT", "CheckpointError", "save_checkpoint", "load_checkpoint", "read_file", "checked_checkpoint",
           "checkpoint_dict", "remove_stale_temporaries"]

FORMAT = "ssd-checkpoint-v1"
"""Value of the ``format`` key; the version suffix changes only with an incompatible layout."""

_RESERVED = ("format", "version", "config", "class_names", "model")
# Temporary files of save_checkpoint: ".<name>.<8 characters>.tmp" next to the target (the 8 characters are drawn
# from the alphabet tempfile.mkstemp used before, so that files left by earlier versions are recognised too).
_TEMP_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789_"
_TEMP_PATTERN = re.compile(r"\.(.+)\.[a-z0-9_]{8}\.tmp")
_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, corrupt, foreign, or does not fit the request."""


def save_checkpoint(path: str | os.PathLike, model: nn.Module, **extra: Any) -> Path:
    """Write ``model`` (an :class:`ssd.models.SSD`, possibly wrapped) and ``extra`` to ``path`` atomically.

    The file is written to a temporary file ``.<name>.<8 characters>.tmp`` in the same directory and renamed over
    ``path``, so a crash never leaves a half-written checkpoint (an existing file stays intact; a process killed
    mid-write leaves the temporary file, which :func:`remove_stale_temporaries` removes). Parent directories are
    created. The file gets the permissions any new file gets (``0o666`` less the umask), or keeps those of the file
    it replaces.

    Raises:
        TypeError: an extra value (at any depth) is not plain data; the message names where it is.
        ValueError: an extra uses a reserved key (``format``, ``version``, ``config``, ``class_names``, ``model``).
    """
    payload = checkpoint_dict(model, **extra)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = None
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:  # a file rewritten in place would keep its permissions: so does a replaced one
                os.chmod(tmp, mode)
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def checkpoint_dict(model: nn.Module, **extra: Any) -> dict[str, Any]:
    """What :func:`save_checkpoint` writes for ``model`` and ``extra`` (same checks, same errors)."""
    model = unwrap_model(model)
    clash = [k for k in extra if k in _RESERVED]
    if clash:
        raise ValueError(f"save_checkpoint: extra key(s) {clash} are reserved ({', '.join(_RESERVED)})")
    for key, value in extra.items():
        _check_plain(value, key)
    return {
        "format": FORMAT,
        "version": __version__,
        "config": model.config.to_dict(),
        "class_names": list(model.class_names),
        "model": {k: v.contiguous() for k, v in model.state_dict().items()},
        **extra,
    }


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (``torch.load(weights_only=True)``: no code runs).

    Returns:
        The checkpoint dict (tensors on ``map_location``).

    Raises:
        CheckpointError: the file is missing, truncated or corrupt, not a checkpoint of this library (e.g. a plain
            state dict or a torchvision weights file), or of an unknown format version.
    """
    return checked_checkpoint(read_file(path, map_location), path)


def read_file(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> Any:
    """The content of any PyTorch file, read with ``torch.load(weights_only=True)`` (no code runs): a checkpoint
    of this library or a foreign state dict (what ``ssd.weights.importers`` converts).

    Raises:
        CheckpointError: the file is missing, truncated, corrupt or holds pickled objects other than plain data.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} is not a file")
    try:
        with warnings.catch_warnings():  # e.g. "pickle protocol 4" for foreign files: the error below says it all
            warnings.simplefilter("ignore", UserWarning)
            ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(_unsafe(path, exc)) from None
    except Exception as exc:
        raise CheckpointError(_unreadable(path, exc)) from None
    return ckpt


def checked_checkpoint(ckpt: Any, path: str | os.PathLike) -> dict[str, Any]:
    """``ckpt`` (read from ``path``) if it is a checkpoint of this library; :class:`CheckpointError` otherwise."""
    if not isinstance(ckpt, Mapping):
        raise CheckpointError(f"{path} holds a {type(ckpt).__name__}, not an ssd checkpoint (a dict with a "
                              f"'format' tag)")
    tag = ckpt.get("format")
    if tag is None:
        if ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values()):
            raise CheckpointError(f"{path} is a plain state dict ({len(ckpt)} tensors, e.g. {next(iter(ckpt))!r}), "
                                  "not an ssd checkpoint: it has no model configuration or class names. ImageNet "
                                  "backbone files go to backbone_weights=, not to weights=")
        raise CheckpointError(f"{path} is not an ssd checkpoint (no 'format' tag; keys: {sorted(map(str, ckpt))[:8]})")
    if tag != FORMAT:
        raise CheckpointError(f"{path} has format {tag!r}, but this version of ssd ({__version__}) reads "
                              f"{FORMAT!r} (saved by ssd {ckpt.get('version', '?')})")
    missing = [k for k in _RESERVED if k not in ckpt]
    if missing:
        raise CheckpointError(f"{path} is an incomplete ssd checkpoint: missing {missing}")
    return dict(ckpt)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that :func:`save_checkpoint` left in ``directory`` when its process was killed
    while writing.

    Only regular files directly in ``directory`` named like those temporaries (``.<name>.<8 characters>.tmp``) are
    removed: no sub-folder, link or other file is touched. Call it when no save into ``directory`` is under way
    (e.g. when a training run starts, before its first save). A missing directory has nothing to remove.

    Returns:
        The removed paths, sorted.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if _TEMP_PATTERN.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                Path(entry.path).unlink(missing_ok=True)  # missing_ok: another cleanup may have been faster
                removed.append(Path(entry.path))
    return sorted(removed)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """Create and open (write-only) a new temporary file beside ``path``; ``O_EXCL`` never opens an existing one.

    ``os.open`` with mode ``0o666`` lets the system apply the umask (and default ACLs) as for any new file, where
    ``tempfile.mkstemp`` would force ``0o600``.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    for _ in range(100):  # 37**8 names: a clash is already unlikely, a hundred in a row means something is wrong
        tmp = path.with_name(f".{path.name}.{''.join(secrets.choice(_TEMP_ALPHABET) for _ in range(8))}.tmp")
        try:
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"save_checkpoint: could not create a new temporary file beside {path}")


def _unsafe(path: Path, exc: pickle.UnpicklingError) -> str:
    """The refusal of a file holding pickled objects (torch's own message would advise loading it unsafely)."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    what = f"it refers to {found.group(1)}" if found else "it holds pickled content other than plain data"
    return (f"{path} is refused: loading it could execute code ({what}; checkpoints of this library hold only "
            "tensors and plain data). It is not a checkpoint of this library: a pickled model or another program's "
            "file?")


def _unreadable(path: Path, exc: BaseException) -> str:
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(4)
    if head.startswith(b"PK") and not zipfile.is_zipfile(path):
        return (f"{path} is truncated ({size} bytes, the end of the archive is missing): the save was interrupted "
                "or the copy is incomplete")
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"{path} ({size} bytes) is corrupt or not a PyTorch file: {reason[:200]}"


def _check_plain(value: Any, where: str) -> None:
    """Raise ``TypeError`` naming the first value under ``where`` that ``weights_only`` loading would refuse."""
    if isinstance(value, _LEAVES):
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                raise TypeError(f"save_checkpoint: {where} has a key of type {type(key).__name__} ({key!r}); "
                                "keys must be strings or numbers")
            _check_plain(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple, set, frozenset)):
        for index, item in enumerate(value):
            _check_plain(item, f"{where}[{index}]")
        return
    raise TypeError(f"save_checkpoint: {where} is a {type(value).__module__}.{type(value).__qualname__}, which "
                    "torch.load(weights_only=True) cannot read back; store plain data (convert arrays and RNG "
                    "states to tensors, objects to dicts)")

"""Self-describing checkpoints: saved atomically, loaded with ``torch.load(weights_only=True)``.

A checkpoint is a dict: ``format`` (:data:`FORMAT`), ``version`` (``__version__``), ``config`` (the model's
``config.to_dict()``), ``class_names``, ``model`` (state dict), ``card`` (the model's :class:`ssd.card.ModelCard`,
sealed with the state dict's digest: :func:`checkpoint_card` checks both), plus whatever extras the caller adds
(optimizer, scheduler, scaler, epoch, rng, metrics, train_config, ``category_ids`` and ``operating_point``, which
are part of the card ...). Everything in it must be plain data (dicts, lists, tuples,
strings, numbers, booleans, ``None``, tensors) so that loading never runs pickled code; :func:`save_checkpoint` checks
this before writing (RNG states, for instance, must be stored as tensors).

Format-version policy: :data:`FORMAT` names the one layout this version reads and writes. A change that older
readers would misread gets a new suffix (``-v2``) and no compatibility reader: a file of another format version is
refused by name, saying which version wrote it and what to do (load it with that version, or re-import / retrain).
The one exception is :data:`LEGACY_FORMATS`, the layout before the model card (the same without ``card``): read, its
card made from its configuration and extras.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ssd._version import __version__
from ssd.card import OPERATING_POINT_KEYS, ModelCard, legacy_warning, network_digest
from ssd.card import check_operating_point as _check_point
from ssd.errors import CheckpointError, InputError
from ssd.files import atomic_write
from ssd.limits import value_text
from ssd.log import LOGGER
from ssd.nn import unwrap_model
from ssd.weights.identify import file_kind, foreign_format, identify

__all__ = ["FORMAT", "save_checkpoint", "load_checkpoint", "read_file", "checked_checkpoint", "checkpoint_dict",
           "checkpoint_card", "check_operating_point", "OPERATING_POINT_KEYS", "LEGACY_FORMATS", "TORCHSCRIPT_REFUSAL"]

FORMAT = "ssd-checkpoint-v2"
"""Value of the ``format`` key: the checkpoint layout this version reads and writes (see the policy above)."""

LEGACY_FORMATS = ("ssd-checkpoint-v1",)
"""Layouts this version still reads: ``v1`` is ``v2`` without the ``card`` (written before model cards)."""

_RESERVED = ("format", "version", "config", "class_names", "model", "card")
_LEAVES = (str, bytes, int, float, bool, complex, type(None), torch.Tensor, torch.dtype, torch.device, torch.Size)
_HEAD_BYTES = 4096  # enough of a file to tell text, pickles and archives apart


def check_operating_point(value: Any, source: str, error: type[Exception] = CheckpointError
                          ) -> dict[str, Any] | None:
    """:func:`ssd.card.check_operating_point` raising :class:`CheckpointError` by default."""
    return _check_point(value, source, error)


def save_checkpoint(path: str | os.PathLike, model: nn.Module, **extra: Any) -> Path:
    """Write ``model`` (an :class:`ssd.models.SSD`, possibly wrapped) and ``extra`` to ``path`` atomically.

    Written through :func:`ssd.files.atomic_write`: a crash never leaves a half-written checkpoint (an existing file
    stays intact; a process killed mid-write leaves a ``.<name>.<8 characters>.ssdtmp`` temporary, which
    :func:`ssd.files.remove_stale_temporaries` removes). Parent directories are created; a new file gets ``0o666``
    less the umask, a replaced one keeps its permissions.

    Raises:
        TypeError: an extra value (at any depth) is not plain data; the message names where it is.
        ValueError: an extra uses a reserved key (``format``, ``version``, ``config``, ``class_names``, ``model``,
            ``card``), or its ``category_ids`` / ``operating_point`` break their rules.
        ssd.errors.OutputError: the write failed (disk full, permissions ...): one line naming the file and cause.
    """
    payload = checkpoint_dict(model, **extra)
    path = Path(path)
    with atomic_write(path, "wb") as f:
        torch.save(payload, f)
    return path


def checkpoint_dict(model: nn.Module, **extra: Any) -> dict[str, Any]:
    """What :func:`save_checkpoint` writes for ``model`` and ``extra`` (same checks, same errors)."""
    model = unwrap_model(model)
    clash = [k for k in extra if k in _RESERVED]
    if clash:
        raise InputError(f"save_checkpoint: extra key(s) {clash} are reserved ({', '.join(_RESERVED)})")
    for key, value in extra.items():
        _check_plain(value, key)
    ckpt = {
        "format": FORMAT,
        "version": __version__,
        "config": model.config.to_dict(),
        "class_names": list(model.class_names),
        "model": {k: v.contiguous() for k, v in model.state_dict().items()},
        **extra,
    }
    card = _card_of(ckpt, "save_checkpoint", ValueError).sealed(network_digest("", ckpt["model"]))
    return {**ckpt, "card": card.to_dict()}


def _card_of(ckpt: Mapping[str, Any], source: str, error: type[Exception] = CheckpointError) -> ModelCard:
    """The card a checkpoint's contents describe: its configuration, class names and extras."""
    config = ckpt["config"]
    return ModelCard.from_dict({
        "model_name": config.get("name"), "class_names": ckpt["class_names"], "image_size": config.get("image_size"),
        "mean": config.get("mean"), "std": config.get("std"), "variances": config.get("variances"), "nms": False,
        "category_ids": ckpt.get("category_ids"), "operating_point": ckpt.get("operating_point")}, source, error)


def checkpoint_card(ckpt: Mapping[str, Any], source: str) -> ModelCard:
    """The card of a checked checkpoint, after checking the one stored against its checksum (the state dict and
    every field) and the contents against it (naming a field that differs). A :data:`LEGACY_FORMATS` file has no
    card: it is made from the contents.

    Raises:
        CheckpointError: naming ``source`` and the field, or saying that the weights changed."""
    card = _card_of(ckpt, source)
    if ckpt.get("format") in LEGACY_FORMATS:
        LOGGER.warning(legacy_warning(source, "save the model again"))
        return card
    if "card" not in ckpt:
        raise CheckpointError(f"{source} has no model card (format {FORMAT} stores one): it was removed; save the "
                              "model again")
    stored = ModelCard.from_dict(ckpt["card"], f"{source}: card", CheckpointError)
    stored.verify(network_digest("", ckpt["model"]), source, CheckpointError)
    ours, theirs = card.to_dict(), stored.to_dict()
    changed = [k for k in [*ours, *theirs] if k != "checksum" and ours.get(k) != theirs.get(k)]
    if changed:
        field = changed[0]
        raise CheckpointError(f"{source}: its {field} ({value_text(ours.get(field))}) is not the one of its model "
                              f"card ({value_text(theirs.get(field))}): the checkpoint was edited; save the model "
                              "again")
    return card


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
    of this library or a foreign state dict (what ``ssd.models.importers`` converts).

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
    except Exception as exc:
        raise CheckpointError(_refusal(path, exc)) from None
    return ckpt


def checked_checkpoint(ckpt: Any, path: str | os.PathLike) -> dict[str, Any]:
    """``ckpt`` (read from ``path``) if it is a checkpoint of this library; :class:`CheckpointError` otherwise."""
    found = identify(ckpt)
    if found.kind != "ours":
        raise CheckpointError(f"{path} is not an ssd checkpoint: it holds {found.description}; {found.use}")
    tag = ckpt.get("format")
    if tag != FORMAT and tag not in LEGACY_FORMATS:
        raise CheckpointError(f"{path} has format {tag!r} (saved by ssd {ckpt.get('version', '?')}), but this "
                              f"version of ssd ({__version__}) reads only {FORMAT!r} (and the older "
                              f"{', '.join(map(repr, LEGACY_FORMATS))}): load it with the version "
                              "that saved it, or import / train the model again with this one")
    missing = [k for k in _RESERVED if k not in ckpt and k != "card"]  # checkpoint_card checks the card
    if missing:
        raise CheckpointError(f"{path} is an incomplete ssd checkpoint: missing {missing}")
    return dict(ckpt)


TORCHSCRIPT_REFUSAL = ("a TorchScript export, which this version of ssd no longer reads (torch.jit is deprecated by "
                       "PyTorch, and loading TorchScript runs code from the file): export the checkpoint again with "
                       "`ssd export --weights CKPT --format pt2` (torch.export)")
"""Why a TorchScript file is refused, whatever its suffix (``.torchscript``, or renamed ``.pt``)."""


def _is_torchscript(path: Path) -> bool:
    """Whether the zip archive ``path`` is TorchScript: its code or constants folder beside the pickled data."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(n.partition("/")[2].startswith(("code/", "constants.pkl")) for n in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


def _refusal(path: Path, exc: BaseException) -> str:
    """Why ``torch.load`` could not read ``path``, from what the file looks like (torch's own message would advise
    loading a pickle unsafely)."""
    size = path.stat().st_size
    with path.open("rb") as f:
        head = f.read(_HEAD_BYTES)
    kind = file_kind(head)
    foreign = foreign_format(head, path.suffix)
    if foreign is not None:
        return f"{path} is not PyTorch weights: it is {foreign}"
    if kind == "archive" and _is_torchscript(path):
        return f"{path} is {TORCHSCRIPT_REFUSAL}"
    if kind == "archive" and not zipfile.is_zipfile(path):
        return (f"{path} is truncated ({size} bytes, the end of the archive is missing): the save was interrupted "
                "or the copy is incomplete")
    if kind == "text":
        first = head.decode("utf-8", errors="replace").lstrip("\ufeff").strip().split("\n", 1)[0][:60]
        return f"{path} is not a weights file: it looks like text ({size} bytes, starting {first!r})"
    if isinstance(exc, pickle.UnpicklingError) and kind in ("archive", "pickle"):
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"it refers to {found.group(1)}" if found else "it holds pickled content other than plain data"
        return (f"{path} is refused: loading it could execute code ({what}; checkpoints of this library hold only "
                "tensors and plain data). It is not a checkpoint of this library: a pickled model or another "
                "program's file?")
    readable = str(exc).strip() and not isinstance(exc, pickle.UnpicklingError)  # torch's advises unsafe loading
    reason = str(exc).strip().splitlines()[0] if readable else type(exc).__name__
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

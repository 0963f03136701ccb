"""Pretrained weights by name: the catalog of torchvision's official files and the one way they are fetched.

A name (``ssd300_vgg16_coco``, ``vgg16``, ...) stands for a file of ``download.pytorch.org`` (the URL is read from
torchvision's weight enums, never retyped). It is kept where torchvision keeps it,
``torch.hub.get_dir()/checkpoints/<file>``, so a file torchvision already downloaded is used as it is, and downloaded
there once otherwise, with a progress bar, by ``torch.hub.download_url_to_file``: it writes a temporary
``<file>.<uuid>.partial`` next to the target and moves it into place only after the SHA-256 of the bytes starts
with the prefix torchvision publishes in the file name (``vgg16-397923af.pth``), so the cache never holds a file
that looks complete and is not. A file in the cache is trusted as it is (what torchvision does): it got there whole
and checked, or a user put it there.

What a user names as weights goes through :func:`weights_file` (detectors: ``--weights``, ``ssd import``) or
:func:`ssd.models.backbone_weights.read_backbone_weights` (``--backbone-weights``): a path that exists always wins
over a name.
"""

from __future__ import annotations

import functools
import glob
import http.client
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.error import URLError

from ssd.errors import CheckpointError, WeightsDownloadError
from ssd.log import LOGGER
from ssd.names import did_you_mean
from ssd.text import render_table

__all__ = ["HubWeights", "catalog", "cache_dir", "known_names", "lookup", "fetch", "weights_file", "looks_like_name",
           "unknown_name", "format_catalog", "OPTIONS", "remove_stale_partials", "STALE_PARTIAL_SECONDS"]


Kind = Literal["detector", "backbone"]

OPTIONS: dict[str, str] = {"detector": "--weights", "backbone": "--backbone-weights"}
"""The ``ssd train`` option (``build_model`` / ``import_model`` argument) that takes each kind of weights."""

_HASH = re.compile(r"-([0-9a-f]{8,64})\.[A-Za-z0-9]+$")  # torchvision's "<name>-<sha256 prefix>.pth"
_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial")  # what torch.hub.download_url_to_file appends to the target's name

STALE_PARTIAL_SECONDS = 60.0
"""A ``.partial`` download not written to for this long was left by a killed run (:func:`remove_stale_partials`)."""


@dataclass(frozen=True)
class HubWeights:
    """One known weights file.

    Attributes:
        name: what users type (``--weights NAME``, ``--backbone-weights NAME``).
        kind: ``"detector"`` (a whole SSD, imported by :mod:`ssd.models.importers`) or ``"backbone"``.
        models: the models of this library it gives (a detector) or it initialises (a backbone).
        url: where it is downloaded from; its last part is the file name, which carries the SHA-256 prefix.
        description: one line for ``ssd weights``.
    """

    name: str
    kind: Kind
    models: tuple[str, ...]
    url: str
    description: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def hash_prefix(self) -> str:
        """The SHA-256 prefix the file name carries (what ``torch.hub.load_state_dict_from_url`` checks)."""
        found = _HASH.search(self.filename)
        if found is None:
            raise RuntimeError(f"internal error: weights {self.name!r}: {self.filename} carries no sha256 prefix")
        return found.group(1)

    @property
    def path(self) -> Path:
        """Where the file is kept: ``torch.hub.get_dir()/checkpoints/<filename>``."""
        return cache_dir() / self.filename

    @property
    def cached(self) -> bool:
        return self.path.is_file()


def cache_dir() -> Path:
    """torchvision's download folder, ``$TORCH_HOME/hub/checkpoints`` (``~/.cache/torch/hub/checkpoints``)."""
    import torch  # here: resolving an existing file's path needs no torch (the runtime install)

    return Path(torch.hub.get_dir()) / "checkpoints"


@functools.lru_cache(maxsize=1)
def catalog() -> dict[str, HubWeights]:
    """Name -> :class:`HubWeights`, in the order ``ssd weights`` lists them. Built on first use (it imports
    torchvision's model modules); tests replace entries of the returned dict."""
    from torchvision.models import MobileNet_V3_Large_Weights, VGG16_Weights
    from torchvision.models.detection import SSD300_VGG16_Weights, SSDLite320_MobileNet_V3_Large_Weights

    vgg = ("ssd300_vgg16", "ssd512_vgg16")
    entries = [
        HubWeights("ssd300_vgg16_coco", "detector", ("ssd300_vgg16",), SSD300_VGG16_Weights.COCO_V1.url,
                   "torchvision's SSD300 VGG16 trained on COCO (80 classes)"),
        HubWeights("ssdlite320_mobilenet_v3_large_coco", "detector", ("ssdlite320_mobilenet_v3_large",),
                   SSDLite320_MobileNet_V3_Large_Weights.COCO_V1.url,
                   "torchvision's SSDLite320 MobileNetV3-Large trained on COCO (80 classes)"),
        HubWeights("vgg16", "backbone", vgg, VGG16_Weights.IMAGENET1K_V1.url,
                   "torchvision's VGG16 ImageNet classifier (fc6 / fc7 subsampled into conv6 / conv7)"),
        HubWeights("vgg16_features", "backbone", vgg, VGG16_Weights.IMAGENET1K_FEATURES.url,
                   "the VGG16 features of the original SSD port (torchvision's copy; takes 0..255 pixels)"),
        HubWeights("mobilenet_v3_large", "backbone", ("ssdlite320_mobilenet_v3_large",),
                   MobileNet_V3_Large_Weights.IMAGENET1K_V1.url, "torchvision's MobileNetV3-Large ImageNet classifier"),
    ]
    return {entry.name: entry for entry in entries}


def known_names(kind: Kind | None = None) -> list[str]:
    """The catalog's names, of one kind or all."""
    return [name for name, entry in catalog().items() if kind is None or entry.kind == kind]


def lookup(name: str, kind: Kind) -> HubWeights | None:
    """The entry named ``name`` when it is of ``kind``; ``None`` when no entry has that name.

    Raises:
        CheckpointError: ``name`` is an entry of the other kind (the message names the option that takes it).
    """
    entry = catalog().get(name)
    if entry is not None and entry.kind != kind:
        raise CheckpointError(f"{OPTIONS[kind]} {name}: {name!r} names {entry.kind} weights ({entry.description}); "
                              f"give it as {OPTIONS[entry.kind]} {name}")
    return entry


def looks_like_name(spec: str | os.PathLike) -> bool:
    """Whether a missing ``spec`` reads as a mistyped name rather than a path: no folder and no suffix."""
    text = str(spec)
    return "/" not in text and os.sep not in text and not Path(text).suffix


def unknown_name(spec: str | os.PathLike, kind: Kind, known: list[str] | None = None) -> str:
    """The words for a ``spec`` that is neither a file nor a known name of ``kind`` (``known``: the names that
    would fit, default every name of ``kind``)."""
    close = did_you_mean(str(spec), known_names(kind) if known is None else known)
    return f"{OPTIONS[kind]} {spec}: neither an existing file nor a known weights name{close} (see `ssd weights`)"


def weights_file(spec: str | os.PathLike, kind: Kind = "detector") -> Path:
    """The file behind what a user names as weights: an existing path as it is (a path always wins over a name);
    a known name's file in the cache, downloaded there when missing (:func:`fetch`).

    A missing path that does not look like a name (it has a folder or a suffix) is returned as it is, for the reader
    to refuse with its own message.

    Raises:
        CheckpointError: a name that is not known (the closest known names), of the other kind, or that
            cannot be fetched (:class:`WeightsDownloadError`).
    """
    path = Path(spec)
    if path.exists():
        return path
    entry = lookup(str(spec), kind)
    if entry is not None:
        return fetch(entry)
    if looks_like_name(spec):
        raise CheckpointError(unknown_name(spec, kind))
    return path


def fetch(entry: HubWeights, *, progress: bool = True) -> Path:
    """The cached file of ``entry``, downloaded first when missing (progress bar on stderr, checksum verified).

    Temporaries that killed downloads of it left are removed first (:func:`remove_stale_partials`).

    Raises:
        WeightsDownloadError: the download failed (offline, server error) or its SHA-256 does not start with the
            prefix in the file name; nothing is left at the cache path, and the message says which file to put
            there by hand, from which URL, and that a path to a copy works as well. The cache path is a directory
            (or a dangling link).
    """
    path = entry.path
    remove_stale_partials(path)
    if path.is_file():
        return path
    if path.exists() or path.is_symlink():  # a folder, a dangling link: the file cannot be put there
        kind = "a directory" if path.is_dir() else "not a file"
        raise WeightsDownloadError(f"the cache entry of {entry.name}, {path}, is {kind}: remove it and run again "
                                   f"(it is downloaded again), or pass the path of a copy: {OPTIONS[entry.kind]} PATH")
    LOGGER.info("%s: downloading %s to %s", entry.name, entry.url, path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        import torch

        torch.hub.download_url_to_file(entry.url, str(path), hash_prefix=entry.hash_prefix, progress=progress)
    except (OSError, http.client.HTTPException) as exc:  # URLError is an OSError; a cut connection an HTTPException
        reason = exc.reason if isinstance(exc, URLError) else exc
        raise WeightsDownloadError(f"cannot download {entry.name} ({reason}). {_by_hand(entry)}") from None
    except RuntimeError as exc:
        if "invalid hash value" not in str(exc):
            raise
        raise WeightsDownloadError(f"the download of {entry.name} from {entry.url} is corrupt: its sha256 does not "
                                   f"start with {entry.hash_prefix} as the file name says ({exc}); nothing was kept. "
                                   f"Try again, or {_by_hand(entry, lower=True)}") from None
    return path


def remove_stale_partials(path: Path) -> list[Path]:
    """Remove what killed downloads of ``path`` left next to it: ``torch.hub``'s ``<file>.<32 hex>.partial``
    temporaries not written to for :data:`STALE_PARTIAL_SECONDS` (a live download writes every few milliseconds).
    Returns the files removed."""
    removed = []
    now = time.time()
    for partial in path.parent.glob(f"{glob.escape(path.name)}.*.partial"):
        try:
            stale = _PARTIAL.fullmatch(partial.name[len(path.name):]) and now - partial.stat().st_mtime > \
                STALE_PARTIAL_SECONDS
            if stale and partial.is_file():
                partial.unlink()
                removed.append(partial)
        except FileNotFoundError:  # another process removed it first
            continue
    if removed:
        LOGGER.info("removed %d unfinished download(s) of %s left by an interrupted run: %s", len(removed),
                    path.name, ", ".join(p.name for p in removed))
    return removed


def _by_hand(entry: HubWeights, lower: bool = False) -> str:
    """What to do without a download: the URL and the exact cache path, or a path to a copy."""
    text = (f"Download {entry.url} another way and put it at {entry.path} (the torch hub cache), or pass the path "
            f"of a copy: {OPTIONS[entry.kind]} PATH")
    return text[0].lower() + text[1:] if lower else text


def format_catalog() -> str:
    """The ``ssd weights`` text: the cache folder; a table of every known name, its kind, the models it is for,
    whether its file is in the cache and the file's name; then where each file comes from."""
    rows = [[e.name, e.kind, " / ".join(e.models), "yes" if e.cached else "no", e.filename] for e in catalog().values()]
    lines = [f"cache: {cache_dir()}", *render_table(["name", "kind", "for", "cached", "file"], rows), "", "sources:"]
    return "\n".join([*lines, *(f"  {e.name}: {e.url}" for e in catalog().values())])

"""The inference backends: what every runtime offers (:class:`Backend`) and the one way to open one
(:func:`open_backend`).

:func:`open_backend` takes what a user names (a checkpoint ``.pt``, a run directory, an exported ``.onnx``, an SSD
module or an opened backend) and picks the runtime from :data:`BACKENDS`, keyed by artifact kind. A new runtime
(another exported format) is added with :func:`register_backend` (a row of that table), not by editing the dispatch.
Each runtime is a module of this package (:mod:`~ssd.inference.backends.pytorch`, :mod:`~ssd.inference.backends.onnx`,
:mod:`~ssd.inference.backends.opencv`, :mod:`~ssd.inference.backends.openvino`, :mod:`~ssd.inference.backends.pt2`),
imported only when a file of its kind is opened.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ssd.artifacts import ARTIFACTS, resolve
from ssd.card import ModelCard
from ssd.errors import ConfigError
from ssd.names import did_you_mean

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

__all__ = ["Backend", "BackendKind", "BACKENDS", "DEFAULT_BACKEND", "register_backend", "backend_kind", "folder_kind",
           "is_module", "open_backend", "refuse_torchscript"]


class Backend(Protocol):
    """A network ready to run between :func:`ssd.preprocess.preprocess` and post-processing.

    Attributes:
        card: what the network is (:class:`ssd.card.ModelCard`): class names, category ids, input size ``(h, w)``,
            normalization, variances, operating point (the default confidence), precision, and ``nms``: the
            thresholds fixed in a graph that returns detections itself, not head outputs; such a backend also has
            ``nms_detections(batch, *, score_threshold, iou_threshold, max_detections)`` -> per image ``boxes [N, 4]``
            xyxy normalized, ``scores [N]``, ``labels [N]`` (and ``__call__`` may refuse). Without PyTorch,
            :func:`ssd.arrays.detect_arrays` runs a backend through numpy twins of these: ``nms_arrays``, or
            ``head_arrays(batch) -> (loc, scores, priors)`` for a graph that returns head outputs.
        priors: ``[P, 4]`` cxcywh normalized default boxes.
        device: where its input batch is made.

    The built-in backends also say their runtime (``name``, the :data:`BACKENDS` key) and the file they were opened
    from (``source``, ``None`` for an in-memory model).
    """

    card: ModelCard
    device: torch.device

    @property
    def priors(self) -> Tensor: ...

    def __call__(self, batch: Tensor) -> tuple[Tensor, Tensor]:
        """``batch [B, 3, H, W]`` float32 normalized -> ``(loc [B, P, 4], logits [B, P, K+1])``."""
        ...



Opener = Callable[..., Backend]
"""``opener(path: Path, device: torch.device, half: bool) -> Backend``."""


@dataclass(frozen=True)
class BackendKind:
    """One runtime: the file suffixes it opens and its opener, a callable or ``"module:function"`` (imported on first
    use, so that ``import ssd`` and unrelated commands load no runtime). ``folder_file``: a folder holding a file of
    this name is this kind of artifact, opened through that file (OpenVINO's ``model.xml``)."""

    suffixes: tuple[str, ...]
    opener: Opener | str
    folder_file: str | None = None

    def open(self, path: Path, device: torch.device, half: bool) -> Backend:
        opener = resolve(self.opener) if isinstance(self.opener, str) else self.opener
        return opener(path, device, half)


BACKENDS: dict[str, BackendKind] = {
    runtime: BackendKind(kind.suffixes, opener, kind.folder_file) if index == 0 else BackendKind((), opener)
    for kind in ARTIFACTS.values() for index, (runtime, opener) in enumerate(kind.runtimes.items())}
"""Runtime name -> :class:`BackendKind`, from :data:`ssd.artifacts.ARTIFACTS`: each kind's first runtime opens its
suffixes (and folders), the others (``opencv``, ``openvino-bf16``) are asked for by name. A run directory opens
its checkpoint (``ssd.weights.resolve``)."""

DEFAULT_BACKEND = "torch"
"""Opens a file whose suffix no runtime claims: checkpoints and foreign detectors come with many suffixes, and
:func:`ssd.models.load.read_weights` tells them apart by content."""


def refuse_torchscript(path: Path, device: torch.device, half: bool) -> Backend:
    """TorchScript is retired (``torch.jit`` is deprecated by PyTorch, and loading a TorchScript file runs its code):
    a ``.torchscript`` file is refused with what to export instead."""
    from ssd.errors import CheckpointError
    from ssd.weights.checkpoint import TORCHSCRIPT_REFUSAL

    raise CheckpointError(f"{path} is {TORCHSCRIPT_REFUSAL}")


def register_backend(name: str, suffixes: Sequence[str], opener: Opener | str, folder_file: str | None = None
                     ) -> None:
    """Open files ending in one of ``suffixes`` (e.g. ``[".xml"]``) with ``opener`` (see :class:`BackendKind`).

    Raises ``ValueError`` when a suffix already belongs to another runtime."""
    suffixes = tuple(s.lower() for s in suffixes)
    for other, kind in BACKENDS.items():
        taken = set(suffixes) & set(kind.suffixes)
        if other != name and taken:
            raise ConfigError(f"backend {name!r}: suffix {sorted(taken)[0]} is already opened by backend {other!r}")
    BACKENDS[name] = BackendKind(suffixes, opener, folder_file)


def backend_kind(path: str | Path) -> str:
    """The :data:`BACKENDS` name that opens the file ``path``: the runtime claiming its suffix, else
    :data:`DEFAULT_BACKEND`."""
    suffix = Path(path).suffix.lower()
    return next((name for name, kind in BACKENDS.items() if suffix in kind.suffixes), DEFAULT_BACKEND)


def folder_kind(path: str | Path) -> str | None:
    """The :data:`BACKENDS` name whose ``folder_file`` the folder ``path`` holds (an OpenVINO folder), else None."""
    folder = Path(path)
    return next((name for name, kind in BACKENDS.items()
                 if kind.folder_file and folder.is_dir() and (folder / kind.folder_file).is_file()), None)


def is_module(value) -> bool:
    """Whether ``value`` is a ``torch.nn.Module`` (never, when torch was not imported: nothing imports it here)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def open_backend(weights: str | Path | nn.Module | Backend, device: str | torch.device | None = None,
                 half: bool = False, runtime: str | None = None) -> Backend:
    """A :class:`Backend` for ``weights``: a checkpoint, a run directory (its best checkpoint), an exported model
    (any suffix of :data:`BACKENDS`), an SSD module (possibly wrapped) or a backend (returned as it is).

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available); default the CPU for a
    file, the module's own device for a module. ``half``: float16 inference (PyTorch on CUDA only). ``runtime``: a
    :data:`BACKENDS` name to open a file with instead of its kind's own (``opencv`` for an ``.onnx`` file).

    Raises:
        CheckpointError: a missing path, or a file its runtime cannot read (``OnnxModelError`` for ONNX).
    """
    if is_module(weights):
        from ssd.device import resolve_device
        from ssd.inference.backends.pytorch import TorchBackend

        return TorchBackend(weights, None if device is None else resolve_device(device), half)
    if not isinstance(weights, (str, Path)):
        return weights
    from ssd.weights.resolve import resolve_weights

    if runtime is not None and runtime not in BACKENDS:
        raise ConfigError(f"unknown runtime {runtime!r}{did_you_mean(runtime, BACKENDS)} (known: "
                          f"{', '.join(BACKENDS)})")
    name = folder_kind(weights)
    if name is not None:
        path = Path(weights) / BACKENDS[name].folder_file
    else:
        path = resolve_weights(weights)
        name = backend_kind(path)
    if device not in (None, "cpu"):  # "auto", "cuda:N": torch tells; the CPU needs no torch (the runtime install)
        from ssd.device import resolve_device

        device = resolve_device(device)
    return BACKENDS[runtime or name].open(path, device or "cpu", half)


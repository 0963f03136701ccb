"""Helpers on torch modules: the plain module inside wrappers (:func:`unwrap_model`) and what keeps a state dict
from loading into a module (:func:`state_dict_mismatch`). torch is imported when a function needs it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ssd.text import few

__all__ = ["unwrap_model", "state_dict_mismatch"]


def unwrap_model(model: Any) -> Any:
    """The plain module inside ``DistributedDataParallel`` / ``DataParallel`` / ``torch.compile`` wrappers."""
    from torch import nn

    while True:
        if hasattr(model, "_orig_mod"):
            model = model._orig_mod
        elif isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            model = model.module
        else:
            return model


def state_dict_mismatch(expected: Mapping[str, Any], given: Mapping[str, Any], allowed_missing: Iterable[str] = ()
                        ) -> str | None:
    """What keeps ``given`` (a state dict) from loading into a module whose state dict is ``expected``, or ``None``.

    Returns ``"missing keys (N): ...; unexpected keys (N): ...; wrong shapes (N): key [given] (expected [...]);
    wrong types (N): key torch.int64 (expected floating point)"``, a few of each, for the caller to put in its own
    error (which names the file and the architecture). A floating-point tensor given as integers would load
    truncated: it is a wrong type.
    """
    allowed = set(allowed_missing)
    missing = [k for k in expected if k not in given and k not in allowed]
    unexpected = [k for k in given if k not in expected]
    mismatched = [f"{k} {list(given[k].shape)} (expected {list(v.shape)})"
                  for k, v in expected.items() if k in given and tuple(given[k].shape) != tuple(v.shape)]
    integral = [f"{k} {given[k].dtype} (expected floating point)" for k, v in expected.items()
                if k in given and v.is_floating_point() and not given[k].is_floating_point()]
    parts = [f"{label} ({len(keys)}): {few(keys)}"
             for label, keys in (("missing keys", missing), ("unexpected keys", unexpected),
                                 ("wrong shapes", mismatched), ("wrong types", integral)) if keys]
    return "; ".join(parts) or None

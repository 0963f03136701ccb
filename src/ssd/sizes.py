"""Network input sizes: one parser and the forms a size is kept in.

A size is given as an int ``S`` (the square ``S x S``), a ``(height, width)`` pair or ``"HxW"`` text (``"512x288"``:
512 high, 288 wide; ``"300"`` is square). :func:`as_hw` is the one reader of all three (models, data, the model
card, configuration files and the command line), and its :class:`~ssd.errors.ConfigError` the one error.
Models, default boxes and cards store :func:`compact_size` (an int when square, else ``(height, width)``), bounded
by :func:`input_size`; ``TrainConfig`` and YAML files hold :func:`size_text`, bounded by :func:`parse_image_size`.

This module imports only the lowest layer (any layer may import it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ssd.errors import ConfigError, PriorConfigError
from ssd.limits import MAX_INPUT_SIDE, is_whole, value_text

__all__ = ["as_hw", "compact_size", "size_text", "input_size", "parse_image_size"]


def as_hw(size: int | Sequence[int] | str) -> tuple[int, int]:
    """``(height, width)`` of an input size given as an int, a ``(height, width)`` pair or ``"HxW"`` text.

    Raises :class:`~ssd.errors.ConfigError` naming the value and the accepted forms.
    """
    pair: Any = size
    if isinstance(size, str):
        parts = size.strip().lower().split("x")
        pair = [int(p) if p.strip().isascii() and p.strip().isdigit() else None for p in parts]  # not "²"
        if len(pair) == 1:
            pair = pair * 2
    elif is_whole(size, integral=True):
        pair = (size, size)
    if (isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2
            or not all(is_whole(v, integral=True) and v >= 1 for v in pair)):
        raise ConfigError(f"image_size={value_text(size)} is invalid: give N for a square N x N input or HxW "
                          "(height x width, e.g. 512x288), or a (height, width) pair of positive ints")
    return int(pair[0]), int(pair[1])


def compact_size(size: int | Sequence[int] | str) -> int | tuple[int, int]:
    """The stored form of an input size: an int when square, else a ``(height, width)`` tuple."""
    h, w = as_hw(size)
    return h if h == w else (h, w)


def size_text(size: int | Sequence[int] | str) -> str:
    """``"300"`` for a square size, ``"512x288"`` (height x width) otherwise: for messages, options and YAML."""
    h, w = as_hw(size)
    return str(h) if h == w else f"{h}x{w}"


def input_size(image_size: int | Sequence[int] | str) -> int | tuple[int, int]:
    """The stored form of a network input size (:func:`compact_size`), refused with
    :class:`~ssd.errors.PriorConfigError` when a side exceeds :data:`ssd.limits.MAX_INPUT_SIDE`."""
    size = compact_size(image_size)
    if max(as_hw(size)) > MAX_INPUT_SIDE:
        raise PriorConfigError(f"image_size {size_text(size)} exceeds the largest input side of {MAX_INPUT_SIDE} px "
                               "(ssd.limits.MAX_INPUT_SIDE)")
    return size


def parse_image_size(value: Any) -> int | str:
    """An input size to train at, as ``TrainConfig`` stores it: an int when square, else ``"HxW"``.

    :class:`~ssd.errors.ConfigError` for what :func:`as_hw` refuses, a side under 32 or one above
    :data:`ssd.limits.MAX_INPUT_SIDE`.
    """
    h, w = as_hw(value)
    if min(h, w) < 32 or max(h, w) > MAX_INPUT_SIDE:
        raise ConfigError(f"image_size={value_text(value)} is invalid: must be at least 32 and at most "
                          f"{MAX_INPUT_SIDE} on each side (--image-size; the bound is ssd.limits.MAX_INPUT_SIDE)")
    return h if h == w else size_text((h, w))

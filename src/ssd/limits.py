"""Size bounds, named in one place and checked before anything is allocated.

Each bound protects the machine from a value that is valid in type but absurd in size (a typo, an edited file, a
hostile input). A check that fails raises the caller's error type with a message that names the option or file, the
value and the bound.
"""

from __future__ import annotations

__all__ = ["MAX_INPUT_SIDE", "MAX_PRIORS", "MAX_TILES_PER_IMAGE", "MAX_BOXES_PER_IMAGE", "MAX_YAML_ALIASES",
           "MAX_VALUE_CHARS"]

MAX_INPUT_SIDE = 4096
"""Largest side of the network input in pixels (``--image-size``, a checkpoint's ``image_size``)."""

MAX_PRIORS = 1_000_000
"""Most default boxes one model may have (SSD512 has 24,564)."""

MAX_TILES_PER_IMAGE = 1024
"""Most tiles one image may be cut into by ``--tile`` / ``--tile-overlap``."""

MAX_BOXES_PER_IMAGE = 10_000
"""Most annotated objects in one image."""

MAX_YAML_ALIASES = 100
"""Most alias references a YAML file may use (an alias bomb expands a dozen lines to billions of items)."""

MAX_VALUE_CHARS = 80
"""Longest rendering of a user value inside an error message (longer values are cut before formatting)."""

"""``ssd predict --show``: the drawn frames in a window (OpenCV's HighGUI), one window per input.

A window needs a display and an OpenCV built with a GUI (``opencv-python``, not ``opencv-python-headless``);
:func:`open_window` says which one is missing before any work starts, instead of failing at the first frame.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from ssd.errors import ConfigError
from ssd.inference.bgr import to_bgr
from ssd.optional import require

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["Window", "open_window"]


class Window:
    """Shows ``[3, H, W]`` uint8 RGB frames, one named window per input; :meth:`close` closes them all."""

    def __init__(self, cv2):
        self._cv2 = cv2

    def show(self, name: str, image: Tensor) -> None:
        cv2 = self._cv2
        cv2.imshow(name, to_bgr(image))
        cv2.waitKey(1)  # HighGUI draws during waitKey

    def close(self) -> None:
        self._cv2.destroyAllWindows()


def open_window() -> Window:
    """A :class:`Window`, or :class:`~ssd.errors.ConfigError` saying why none can open here."""
    cv2 = require("cv2", "video", "--show")
    if sys.platform.startswith("linux") and not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        raise ConfigError("--show needs a display, and there is none here (DISPLAY and WAYLAND_DISPLAY are unset: a "
                          "server or an SSH session without -X); drop --show, the drawn frames are saved in the save "
                          "folder")
    gui = next((line.split(":", 1)[1].strip() for line in cv2.getBuildInformation().splitlines()
                if line.strip().startswith("GUI:")), "NONE")
    if gui.upper() == "NONE":
        raise ConfigError("--show needs an OpenCV with a GUI, and this one has none (opencv-python-headless): "
                          "pip install opencv-python")
    return Window(cv2)

"""``ssd predict --save-txt``: the detections as a YOLO dataset that ``ssd train`` and ``ssd check`` read.

In ``<save_dir>/yolo``: ``images/<name>`` links to each input image (a video frame is saved there as
``<name>_<frame>.jpg``), ``labels/...`` one ``.txt`` per image (paired as :func:`ssd.data.yolo.label_path` pairs
them: ``class cx cy w h`` normalized to the image, one detection a line, an empty file for an image without
detections) and ``data.yaml`` (``train: images`` and the class names). ``save_conf`` adds each detection's score as
a sixth value, as Ultralytics does: pseudo-labels to review, which no YOLO reader takes as a dataset, so no
``data.yaml`` is written then.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

from ssd.data.yolo import label_path
from ssd.files import fitted_name, write_text
from ssd.inference.results import Result

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["YoloLabelWriter", "frame_name", "frame_source", "yolo_lines"]


def frame_name(stem: str, frame: int) -> str:
    """The image file name of frame ``frame`` of the video (or stream) whose outputs are named ``stem``."""
    return fitted_name(stem, f"_{frame:06d}.jpg")


def frame_source(stem: str) -> str | None:
    """The stem of the video whose frame :func:`frame_name` names ``stem`` (the stem of a file), or ``None``."""
    match = re.fullmatch(r"(.*)_\d{6,}", stem)
    return match[1] if match else None


def yolo_lines(result: Result, save_conf: bool = False) -> str:
    """``class cx cy w h [score]`` lines of ``result`` (coordinates normalized to its image), newline-terminated."""
    boxes = np.asarray(result.boxes, dtype=np.float32).reshape(-1, 4) / np.float32(
        [result.width, result.height, result.width, result.height])
    centres, sides = (boxes[:, :2] + boxes[:, 2:]) / np.float32(2), boxes[:, 2:] - boxes[:, :2]
    lines = []
    for label, (cx, cy, w, h), score in zip(result.labels.tolist(), np.concatenate([centres, sides], 1).tolist(),
                                            result.scores.tolist()):
        lines.append(f"{label} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}" + (f" {score:.5f}" if save_conf else ""))
    return "".join(line + "\n" for line in lines)


class YoloLabelWriter:
    """The ``yolo/`` folder of a save folder: :meth:`start` writes ``data.yaml``, :meth:`write` one image's files."""

    def __init__(self, save_dir: Path, class_names: list[str], save_conf: bool = False):
        self.root = save_dir / "yolo"
        self.data_file = self.root / "data.yaml"
        self.class_names, self.save_conf = class_names, save_conf
        self.files = 0

    def image_link(self, name: Path) -> Path:
        """Where the input image named ``name`` (relative to the save folder) is linked."""
        return self.root / "images" / name

    def start(self) -> None:
        if not self.save_conf:
            write_text(self.data_file, yaml.safe_dump({"train": "images", "names": list(self.class_names)},
                                                      allow_unicode=True, sort_keys=False))

    def write(self, result: Result, name: Path, image: Tensor, frame: int | None) -> None:
        """``result``'s label file, and its image: the input linked (copied where links are refused) or, for a
        video frame, ``image`` ``[3, H, W]`` uint8 saved; :class:`~ssd.errors.InputError` for a result with a box
        that is not one (:meth:`Result.check`)."""
        from ssd.plots import save_image  # matplotlib: loaded when an image is written

        result.check()
        link = self.image_link(name)
        if frame is None:
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)  # this folder's own link of an earlier run (--exist-ok)
            try:
                os.symlink(os.path.abspath(result.path), link)
            except OSError:  # a file system without symbolic links
                shutil.copyfile(result.path, link)
        else:
            link = save_image(image, link.with_name(frame_name(link.stem, frame)), sync=False)
        write_text(label_path(link), yolo_lines(result, self.save_conf), sync=False)  # per image: not synced
        self.files += 1

    def report(self) -> list[str]:
        where = f"YOLO labels: {self.files} files in {self.root / 'labels'}"
        if self.save_conf:
            return [f"{where} (with confidences, a sixth value per line: no data.yaml; to train on them, predict "
                    "without --save-conf)"]
        return [f"{where}; read them as a dataset: ssd check {self.data_file}"]

"""``ssd predict --save-crop``: each detection's pixels, one JPEG per detection in a folder per class.

``<save_dir>/crops/<class>/<image stem>_<index>_<k>.jpg``: ``index`` is the image's line in ``predictions.jsonl``
and ``k`` the detection's place in it, so every crop leads back to its record. Class folder names are the class
names made safe as file names by :func:`ssd.files.safe_name`, the rule of the streams' names too (characters other
than letters, digits, ``. - _`` and spaces replaced, long names cut and hashed as the crops' own names are), a label
appended where two names would meet. A run saves at most :data:`ssd.limits.MAX_SAVED_CROPS` crops; the others are
counted and reported, their detections kept in the JSONL.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

from ssd.files import fitted_name, safe_name
from ssd.inference.results import Result
from ssd.limits import MAX_SAVED_CROPS

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["CropWriter", "class_folders"]


def class_folders(class_names: list[str]) -> list[str]:
    """A distinct, file-system-safe folder name for each class (label ``k`` -> ``folders[k]``,
    :func:`ssd.files.safe_name`; a name taken already, whatever its case, gets ``_<label>``, then ``_<label>_2``,
    ... until it is free)."""
    folders: list[str] = []
    seen: set[str] = set()
    for label, name in enumerate(class_names):
        folder, tries = safe_name(str(name), fallback=f"class{label}"), 1
        while folder.lower() in seen:
            folder = safe_name(str(name), f"_{label}" if tries == 1 else f"_{label}_{tries}", fallback=f"class{label}")
            tries += 1
        folders.append(folder)
        seen.add(folder.lower())
    return folders


class CropWriter:
    """Crops of each result's detections under ``<save_dir>/crops``, at most ``max_crops`` per run.

    ``stage``: a sharded run's part folder (:mod:`ssd.inference.shards`): the crops wait under ``<stage>/crops``,
    named after their record's line in this rank's share, until :meth:`place` knows the lines before it."""

    def __init__(self, save_dir: Path, class_names: list[str], max_crops: int | None = None,
                 stage: Path | None = None):
        self.root = save_dir / "crops"
        self.folders = class_folders(class_names)
        self.max_crops = MAX_SAVED_CROPS if max_crops is None else max_crops
        self.saved = self.over = 0
        self.stage = stage / "crops" if stage is not None else None
        self.staged: list[tuple[Path, int, str, int, int]] = []  # file, label, image stem, index, k

    def write(self, result: Result, name: Path, image: Tensor, index: int) -> None:
        """Save the crops of ``result``'s detections from ``image`` ``[3, H, W]`` uint8 (each at least a pixel);
        :class:`~ssd.errors.InputError` for a result with a box that is not one (:meth:`Result.check`)."""
        from ssd.plots import save_image  # matplotlib: loaded when an image is written

        result.check()
        height, width = image.shape[-2:]
        for k, (box, label) in enumerate(zip(result.boxes.tolist(), result.labels.tolist())):
            if self.saved >= self.max_crops:
                self.over += 1
                continue
            x1, y1 = min(max(math.floor(box[0]), 0), width - 1), min(max(math.floor(box[1]), 0), height - 1)
            x2, y2 = max(min(math.ceil(box[2]), width), x1 + 1), max(min(math.ceil(box[3]), height), y1 + 1)
            crop = image[:, y1:y2, x1:x2]  # a view: save_image copies it
            file = (self.stage or self.root) / self.folders[label] / fitted_name(name.stem, f"_{index}_{k}.jpg")
            save_image(crop, file, sync=False)  # one of many: the run's results file is the synced one
            if self.stage is not None:
                self.staged.append((file, label, name.stem, index, k))
            self.saved += 1

    def place(self, offset: int, room: int) -> None:
        """Move the staged crops to their final names, their record's line shifted by ``offset`` (the lines of the
        ranks before), the first ``room`` of them only (the run's cap less the crops of the ranks before); the others
        are deleted and counted as over the cap."""
        for number, (file, label, stem, index, k) in enumerate(self.staged):
            if number < room:
                final = self.root / self.folders[label] / fitted_name(stem, f"_{index + offset}_{k}.jpg")
                final.parent.mkdir(parents=True, exist_ok=True)
                file.replace(final)
            else:
                file.unlink()
                self.saved -= 1
                self.over += 1
        self.staged = []

    def report(self) -> list[str]:
        lines = [f"crops: {self.saved} in {self.root}"]
        if self.over:
            lines.append(f"crops: {self.over} more detections not cropped: a run saves at most "
                         f"{self.max_crops:,} (limits.MAX_SAVED_CROPS; their boxes are in predictions.jsonl)")
        return lines

"""Parsed annotations: :class:`ObjectRecord`, :class:`ImageRecord`, :class:`DatasetSpec`, and :class:`Issue`.

Every parser (VOC, COCO, YOLO) produces the same records. Boxes are pixel ``xyxy`` floats of the image as decoded
(EXIF orientation applied), with continuous pixel edges: a box covering pixel columns 0..9 is ``x1=0, x2=10``.
Parsers do not reject defective objects; they keep them (``label`` may be out of range, a box may be empty) so that
:func:`ssd.data.check.check_dataset` can report every problem at its file and line.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from dataclasses import dataclass, field
from pathlib import Path

from ssd.errors import DataError

__all__ = ["ObjectRecord", "ImageRecord", "DatasetSpec", "Issue"]


@dataclass(slots=True)
class ObjectRecord:
    """One annotated object.

    Attributes:
        box: pixel ``(x1, y1, x2, y2)`` of the decoded image.
        label: class index ``0..K-1``; ``-1`` when the name is unknown to the class list (reported by ``check``).
        name: class name as written in the annotation (or looked up from the label).
        difficult: VOC ``difficult`` flag (left out of training by default, ignored in evaluation).
        iscrowd: COCO ``iscrowd`` flag (an ignore region: never trained on, ignored in evaluation).
        line: 1-based line in the annotation file (YOLO), 1-based object index (VOC), annotation id (COCO).
        source: the annotation file.
        where: human readable location, e.g. ``labels/a.txt:3``, ``a.xml object 2 (RBC)``,
            ``ann.json annotation id 7``.
        raw: the box as written in the file (``xmin=1 ymin=1 xmax=9 ymax=9``, ``cx cy w h`` text,
            ``bbox [x, y, w, h]``),
            quoted in messages so users find the bad value they wrote.
        occluded: CVAT's ``occluded`` flag (kept for conversions; trained on like any object).
        z_order: CVAT's ``z_order`` (drawing order; kept for conversions).
        truncated: VOC's ``truncated`` flag (kept for conversions; trained on like any object).
    """

    box: tuple[float, float, float, float]
    label: int
    name: str
    difficult: bool = False
    iscrowd: bool = False
    line: int = 0
    source: Path | None = None
    where: str = ""
    raw: str = ""
    occluded: bool = False
    z_order: int = 0
    truncated: bool = False

    @property
    def ignore(self) -> bool:
        """True for objects that evaluation ignores and training leaves out by default (difficult or crowd)."""
        return self.difficult or self.iscrowd


@dataclass(slots=True)
class ImageRecord:
    """One image and its objects; ``width``/``height`` are those of the decoded, EXIF-rotated image."""

    path: Path
    annotation: Path | None
    objects: list[ObjectRecord] = field(default_factory=list)
    width: int | None = None
    height: int | None = None
    image_id: str | int | None = None

    def __post_init__(self) -> None:
        if self.image_id is None:
            self.image_id = self.path.stem


@dataclass(slots=True)
class Issue:
    """A problem found in a dataset.

    ``severity`` is ``"error"`` (training refuses the data) or ``"warning"``; ``code`` a stable short name
    (``label_out_of_range``, ``zero_area``, ...); ``file``/``line`` where it is; ``image`` the image it affects and
    ``object_index`` the object inside that image's record (``None`` when the whole image or file is affected).
    """

    severity: str
    code: str
    message: str
    file: str = ""
    line: int | None = None
    split: str | None = None
    image: Path | None = None
    object_index: int | None = None

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["image"] = str(self.image) if self.image is not None else None
        return d


@dataclass
class DatasetSpec:
    """A parsed dataset: ``format`` is ``"voc"``, ``"coco"``, ``"yolo"``, ``"labelme"``, ``"cvat"`` or
    ``"labelstudio"``; ``splits`` maps split names to records.

    ``issues`` holds problems found while parsing (unparseable files, missing images); ``check_dataset`` adds the
    rest. ``sources`` maps a split to the file that describes it (``data.yaml``, a COCO JSON), for messages; a split
    without an entry was read from folders under ``root``.
    ``category_ids``: the dataset's own category id of each label (COCO: label ``k`` is category
    ``category_ids[k]``), for results written in the dataset's ids; ``None`` for formats without ids.
    ``watched``: what the reader looked at besides the records' files: the folders it listed and list files it read
    (a YOLO split, an image folder named), and where a missing image was looked for. The dataset index fingerprints
    them (folders walked, files stat'ed), so an image added to a split folder outside ``root``, or a missing image put
    in place, is seen by the next run.
    """

    root: Path
    format: str
    class_names: list[str]
    splits: dict[str, list[ImageRecord]]
    issues: list[Issue] = field(default_factory=list)
    category_ids: list[int] | None = None
    sources: dict[str, Path] = field(default_factory=dict)
    watched: list[Path] = field(default_factory=list)

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def records(self, split: str) -> list[ImageRecord]:
        """The records of ``split``; a clear error lists the available splits."""
        if split not in self.splits:
            available = ", ".join(self.splits) or "none"
            raise DataError(f"dataset {self.root} has no split {split!r} (available: {available})")
        return self.splits[split]

    def input_files(self) -> list[Path]:
        """Every file the dataset was read from (descriptions, images, annotations): what no output may replace."""
        files = list(self.sources.values())
        for records in self.splits.values():
            if hasattr(records, "input_files"):  # a RecordTable: its path columns, no records built
                files += records.input_files()
                continue
            files += [p for r in records for p in (r.path, r.annotation) if p is not None]
        return files


def relative_path(path: str | Path, root: Path) -> str:
    """``path`` relative to the dataset ``root`` for messages (unchanged when it lies elsewhere)."""
    try:
        return str(Path(path).relative_to(root))
    except ValueError:
        return str(path)


def broken_link(path: Path) -> str | None:
    """Why ``path``, a symbolic link, leads to no file (a loop, or a missing target); None for anything else."""
    try:
        os.stat(path)
    except OSError as e:
        if path.is_symlink():
            return ("is a symbolic link in a loop" if e.errno == errno.ELOOP else
                    f"is a symbolic link to {os.readlink(path)}, which does not exist")
    return None

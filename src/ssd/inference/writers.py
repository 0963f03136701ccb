"""``ssd predict``'s outputs, written as the results come: :class:`PredictionWriter`.

Every image or video frame becomes one line of ``predictions.jsonl`` (:meth:`Result.to_dict
<ssd.inference.results.Result.to_dict>`, plus ``frame`` for video frames), flushed at once, so a run killed at any
moment leaves a valid prefix: whole lines, and at most one torn last line, which :func:`read_jsonl` ignores. The
file of ``--format`` (``predictions.json``, the COCO results, CSV, Label Studio tasks) is assembled from the JSONL
when the run ends, Ctrl-C included, reading it line by line: no step holds every result in memory. ``--save-txt``
(:mod:`ssd.inference.yolo_labels`) and ``--save-crop`` (:mod:`ssd.inference.crop_files`) are written per image too.

A save folder holds :data:`SAVE_DIR_MARKER`; :func:`exclude_save_dirs` keeps every file under such a folder out of
the inputs of a later run, so predicting a folder twice never reads the first run's outputs back.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ssd.data.images import is_image
from ssd.data.yolo import label_path
from ssd.errors import ConfigError, OutputError
from ssd.files import safe_name, write_text
from ssd.inference.crop_files import CropWriter
from ssd.inference.result_files import FORMATS, check_format, local_files_url, ls_folder, write_results
from ssd.inference.results import Result
from ssd.inference.yolo_labels import YoloLabelWriter, frame_name
from ssd.limits import MAX_SAVED_FRAMES
from ssd.names import printable

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["JSONL_FILE", "SAVE_DIR_MARKER", "PredictionWriter", "check_ls_root", "exclude_save_dirs", "read_jsonl"]

JSONL_FILE = "predictions.jsonl"
SAVE_DIR_MARKER = ".ssd-predict"
"""The file that marks a folder as an ``ssd predict`` save folder (never read back as input)."""


def read_jsonl(path: str | Path) -> Iterator[dict]:
    """The records of a ``predictions.jsonl``, one at a time; a last line without its newline (a run killed while
    writing it) is ignored."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.endswith("\n"):
                yield json.loads(line)


def exclude_save_dirs(files: Iterable[Path]) -> tuple[list[Path], list[Path]]:
    """``(kept, save_dirs)``: the files not inside an ``ssd predict`` save folder (one holding
    :data:`SAVE_DIR_MARKER`, at any depth above them), and the save folders that held the others, sorted."""
    marked: dict[Path, Path | None] = {}  # folder -> the save folder it is inside, or None

    def save_dir_of(folder: Path) -> Path | None:
        if folder not in marked:
            own = folder if (folder / SAVE_DIR_MARKER).is_file() else None
            marked[folder] = own or (save_dir_of(folder.parent) if folder.parent != folder else None)
        return marked[folder]

    kept, found = [], set()
    for file in files:
        owner = save_dir_of(Path(os.path.abspath(file.parent)))
        if owner is None:
            kept.append(file)
        else:
            found.add(owner)
    return kept, sorted(found)


def _entries(folder: Path) -> Iterator[Path]:
    """Every file and link under ``folder`` (links to folders not followed)."""
    for root, folders, files in os.walk(folder):
        yield from (Path(root) / name for name in [*files, *(f for f in folders if os.path.islink(Path(root) / f))])


def check_ls_root(ls_root: str, save_dir: Path, inputs: Iterable[Path | str]) -> None:
    """Raise :class:`~ssd.errors.ConfigError` unless ``save_dir`` (where video frames are saved) and every image of
    ``inputs`` are inside the folder ``ls_root`` serves (:func:`~ssd.inference.result_files.ls_folder`)."""
    folder = ls_folder(ls_root)
    for path in [save_dir, *(p for p in inputs if isinstance(p, Path) and is_image(p))]:
        if not Path(os.path.abspath(path)).is_relative_to(os.path.abspath(folder)):
            raise ConfigError(f"--ls-root {ls_root}: {path} is outside {folder}, where Label Studio cannot read it "
                              "(give a folder, or the URL of the current directory, that holds the inputs and the "
                              "save folder)")


class PredictionWriter:
    """The outputs of one ``ssd predict`` run in ``save_dir``; a context manager: entering it writes the marker and
    opens the JSONL, leaving it (an error or Ctrl-C included) closes the JSONL and assembles the ``fmt`` file.

    Args:
        save_dir: the run's folder (already made).
        names: the input file -> its name relative to ``save_dir`` (that of its drawn copy; videos ``.avi``).
        class_names: label ``k`` -> name; ``category_ids``: label -> the dataset's id (COCO), or ``None``.
        fmt: a key of :data:`ssd.inference.result_files.FORMATS`. ``model_version``: Label Studio's field.
        save_txt, save_conf: YOLO label files (and their confidences), see :class:`YoloLabelWriter`.
        save_crop: a crop per detection, see :class:`CropWriter` (``max_crops`` the cap).
        part_dir: under torchrun, on a rank other than 0, where its JSONL and crops wait for rank 0's merge
            (:class:`ssd.inference.shards.Shard`); such a writer assembles no ``fmt`` file and writes no marker.
        ls_root: with ``fmt="labelstudio"``, the folder Label Studio's local-files storage serves
            (``LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT``, default ``/``) or the URL prefix at which the current
            directory is served (:func:`~ssd.inference.result_files.local_files_url`): ``data.image`` is each image's
            URL there, and each video or stream frame is saved as ``frames/<name>_<frame>.jpg`` for it (every input
            and the save folder must be inside that folder: :func:`check_ls_root`).
    """

    def __init__(self, save_dir: Path, names: dict[Path, Path], class_names: list[str], *, fmt: str = "json",
                 category_ids: list[int] | None = None, model_version: str = "ssd", save_txt: bool = False,
                 save_conf: bool = False, save_crop: bool = False, max_crops: int | None = None,
                 part_dir: Path | None = None, ls_root: str | None = None):
        check_format(fmt)
        self.ls_root = str(ls_root or "/") if fmt == "labelstudio" else None
        self.save_dir, self.names, self.class_names = save_dir, names, class_names
        self.fmt, self.category_ids, self.model_version = fmt, category_ids, model_version
        self.part_dir = part_dir
        self.jsonl_file = (part_dir or save_dir) / JSONL_FILE
        self.results_file = save_dir / FORMATS[fmt]
        self.labels = YoloLabelWriter(save_dir, class_names, save_conf) if save_txt else None
        self.crops = CropWriter(save_dir, class_names, max_crops, stage=part_dir) if save_crop else None
        self.count = self.frames_saved = self.frames_over = 0
        self.tracked = False
        self._jsonl: IO[str] | None = None

    def fixed_outputs(self) -> list[Path]:
        """The files this writer creates whatever the results (checked against the inputs before any is written); an
        image link of ``--save-txt`` that is a link already (an earlier run's, replaced, never written through) is
        not one: it leads to the input by design."""
        fixed = [self.save_dir / SAVE_DIR_MARKER, self.jsonl_file, self.results_file]
        if self.labels is not None:
            links = (self.labels.image_link(name) for name in self.names.values())
            fixed += [self.labels.data_file, *(link for link in links if not link.is_symlink())]
        return fixed

    def check_folder(self, drawn: Iterable[Path]) -> None:
        """Refuse, before anything is written, a save folder (given again with ``exist_ok``) whose content this run
        would write through or mix with: a symbolic link on the way to any output (its target, maybe outside, would
        be written), or a file of an earlier run that this one does not replace (crops, frames, the drawn copies or
        labels of other inputs, a rank's parts): the user's to keep or delete, never mixed with this run's. A rerun
        over the same inputs replaces its files. ``drawn``: the drawn copies this run writes."""
        if not self.save_dir.is_dir():
            return
        with os.scandir(self.save_dir) as entries:
            if next(entries, None) is None:
                return  # a fresh or empty folder holds neither links nor an earlier run
        ours = {*drawn, *self.fixed_outputs()}
        if self.labels is not None:
            links = {self.labels.image_link(name) for name in self.names.values()}
            ours |= links | {label_path(link) for link in links}
        roots = [self.crops.root] if self.crops is not None else []
        roots += [self.labels.root] if self.labels is not None else []
        roots += [self.save_dir / "frames"] if self.ls_root is not None else []
        if (self.save_dir / SAVE_DIR_MARKER).exists():  # an earlier run's folder: every file in it is an output
            left = sorted(path for path in _entries(self.save_dir) if path not in ours)
        else:  # the user's folder: only this run's own folders would mix
            left = [root for root in roots if root.exists() or root.is_symlink()]
        if left:
            shown = ", ".join(printable(str(p.relative_to(self.save_dir))) for p in left[:3])
            raise OutputError(f"{self.save_dir} holds outputs of an earlier run that this one would not replace "
                              f"({shown}{', ...' if len(left) > 3 else ''}): they would mix; delete them, or give "
                              "a new --name (without --exist-ok)")
        links = links if self.labels is not None else set()
        for path in [*ours, *roots]:
            for part in [*([path] if path not in links else []), *path.parents]:  # its own link is replaced
                if part == self.save_dir or self.save_dir not in part.parents:
                    break
                if part.is_symlink():
                    raise OutputError(f"{part} is a symbolic link in the save folder: ssd predict never writes "
                                      "through one (its target may be anywhere); remove it, or give a new --name")

    def __enter__(self) -> PredictionWriter:
        if self.part_dir is None:
            write_text(self.save_dir / SAVE_DIR_MARKER, "written by ssd predict: never read as input\n")
            if self.labels is not None:
                self.labels.start()
        else:
            self.part_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.jsonl_file, "w", encoding="utf-8")
        return self

    def write(self, result: Result, image: Tensor, frame: int | None = None) -> None:
        """One image's (or video frame's, ``frame`` its index) result; ``image`` ``[3, H, W]`` uint8 its pixels."""
        record = result.to_dict()
        if frame is not None:
            record["frame"] = frame
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()  # a kill from now on keeps this line
        self.tracked |= result.track_ids is not None
        name = self._name(result.path)
        saved = frame is None or self._frame_room()  # a live stream runs for ever: its frame files are capped
        if self.labels is not None and saved:
            self.labels.write(result, name, image, frame)
        if self.crops is not None:
            self.crops.write(result, name, image, self.count)
        if self.ls_root is not None and frame is not None and saved:  # a Label Studio task needs its own image
            from ssd.plots import save_image  # matplotlib: loaded when an image is written

            save_image(image, self.frame_file(name, frame), sync=False)
        self.count += 1

    def _frame_room(self) -> bool:
        """Whether one more frame may have its files (:data:`~ssd.limits.MAX_SAVED_FRAMES`), counting it."""
        if self.labels is None and self.ls_root is None:
            return True
        room = self.frames_saved < MAX_SAVED_FRAMES
        self.frames_saved += room
        self.frames_over += not room
        return room

    def frame_file(self, name: Path, frame: int) -> Path:
        """The image of frame ``frame`` of the video or stream named ``name`` for Label Studio's tasks."""
        return self.save_dir / "frames" / name.parent / frame_name(name.stem, frame)

    def _ls_image(self, record: dict) -> str | None:
        """A record's Label Studio ``data.image``: the local-files URL of its image, or of its frame's."""
        if record["file"] is None:
            return None
        path = self.frame_file(self._name(record["file"]), record["frame"]) if "frame" in record else record["file"]
        return local_files_url(path, self.ls_root) if "frame" not in record or path.is_file() else None

    def _name(self, path: str | None) -> Path:
        """The input's name relative to ``save_dir``; an in-memory input is named after its index, a source outside
        ``names`` (a stream named otherwise) after its text, so that the name is the same when the results are
        assembled."""
        if path is None:
            return Path(f"input{self.count}.jpg")
        name = self.names.get(Path(path))
        return name if name is not None else Path(safe_name(path, ".jpg", fallback="input"))

    def close(self) -> None:
        """Close the JSONL (every line is already written): what a sharded run does before its merge."""
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None

    def __exit__(self, *exc) -> None:
        self.close()
        if self.part_dir is None:
            write_results(self.fmt, read_jsonl(self.jsonl_file), self.results_file, class_names=self.class_names,
                          category_ids=self.category_ids, model_version=self.model_version, tracked=self.tracked,
                          image=self._ls_image)

    def counts(self) -> dict[str, int]:
        """What this writer wrote: ``results`` (JSONL lines), ``tracked``, YOLO ``labels`` files and ``crops``
        (detections to crop, saved or over the cap), for :meth:`ssd.inference.shards.Shard.merge`."""
        return {"results": self.count, "tracked": self.tracked, "labels": self.labels.files if self.labels else 0,
                "crops": self.crops.saved + self.crops.over if self.crops else 0}

    def set_totals(self, counts: list[dict[str, int]]) -> None:
        """Count the whole run from every rank's :meth:`counts` (rank 0's included): what :meth:`report` says."""
        self.count = sum(c["results"] for c in counts)
        self.tracked = any(c["tracked"] for c in counts)
        if self.labels is not None:
            self.labels.files = sum(c["labels"] for c in counts)
        if self.crops is not None:
            wanted = sum(c["crops"] for c in counts)
            self.crops.saved = min(wanted, self.crops.max_crops)
            self.crops.over = wanted - self.crops.saved

    def report(self) -> list[str]:
        """Lines for the run's summary: what the per-detection outputs wrote and what they could not."""
        lines = [f"{self.count} results streamed to {self.jsonl_file}"]
        if self.labels is not None:
            lines += self.labels.report()
        if self.crops is not None:
            lines += self.crops.report()
        if self.frames_over:
            lines.append(f"frames: {self.frames_over} more video or stream frames have no label file or Label Studio "
                         f"image: a run saves at most {MAX_SAVED_FRAMES:,} (limits.MAX_SAVED_FRAMES; their boxes are "
                         "in predictions.jsonl)")
        return lines

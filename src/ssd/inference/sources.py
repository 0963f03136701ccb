"""``ssd predict``'s front end: :func:`predict_source` over an image, a folder, a glob or a video, writing drawn
copies and the results as they come (:class:`ssd.inference.writers.PredictionWriter`; the detections themselves come
from :class:`ssd.inference.pipeline.Detector`, image files decoded ahead in threads by
:func:`ssd.inference.prefetch.decode_files`).

Outputs never overwrite inputs: the save directory is a fresh one (``predict``, ``predict2``, ... like training runs)
unless ``exist_ok``, drawn copies keep the inputs' paths relative to their common folder (equal file names from
different folders stay apart), a plan that would write over an input is refused before anything is written, and the
files of an earlier save folder are never read as inputs.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from tqdm import tqdm

from ssd._utils import require
from ssd.data.images import IMAGE_SUFFIXES, is_image
from ssd.files import check_output, check_outputs, make_run_dir
from ssd.inference.pipeline import Detector, Result
from ssd.inference.prefetch import DECODE_WORKERS, decode_files
from ssd.inference.result_files import check_format
from ssd.inference.tiling import TILE_OVERLAP, check_tile
from ssd.inference.writers import PredictionWriter, exclude_save_dirs
from ssd.settings import PREDICT, ConfigError, check_thresholds

__all__ = ["VIDEO_SUFFIXES", "PredictSummary", "is_video", "output_paths", "predict_source", "resolve_source"]

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".wmv", ".mpg", ".mpeg")


@dataclass
class PredictSummary:
    """What :func:`predict_source` did: counts, where it wrote, and the inputs it skipped (name and reason)."""

    save_dir: Path
    results_file: Path
    images: int = 0
    videos: int = 0
    frames: int = 0
    detections: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        done = f"{self.images} image{'s' * (self.images != 1)}"
        if self.videos:
            done += f", {self.videos} video{'s' * (self.videos != 1)} ({self.frames} frames)"
        lines = [f"{done}, {self.detections} detections -> {self.results_file}", *self.notes]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} unreadable file{'s' * (len(self.skipped) != 1)}:")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)

    def skip(self, path: Path, error: Exception, bar: tqdm | None = None) -> None:
        """Record an unreadable input and say so now (image errors name the file themselves: their reason only)."""
        reason = getattr(error, "reason", str(error))
        self.skipped.append((str(path), reason))
        (bar.write if bar is not None else print)(f"skipped {path}: {reason}")


def is_video(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_SUFFIXES


def resolve_source(source: str | Path) -> list[Path]:
    """Files of a source: the file itself, a folder's images and videos with its subfolders' (sorted), or a glob's
    files (sorted). A link that leads nowhere (dangling, or a loop) is kept, so that reading it skips it by name."""
    path = Path(source)
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if (is_image(f) or is_video(f)) and not f.is_dir())
    elif path.is_file():
        return [path]
    elif glob.has_magic(str(source)):
        files = sorted(Path(f) for f in glob.glob(str(source), recursive=True) if Path(f).is_file())
    else:
        raise FileNotFoundError(f"source {source} does not exist (give an image, a folder, a glob or a video file)")
    if not files:
        raise FileNotFoundError(f"no images or videos in {source} (images: "
                                f"{', '.join(s[1:] for s in IMAGE_SUFFIXES)}; videos: "
                                f"{', '.join(s[1:] for s in VIDEO_SUFFIXES)})")
    return files


def output_paths(files: list[Path], save_dir: Path) -> dict[Path, Path]:
    """Where the drawn copy of each input goes: ``save_dir`` / its path relative to the inputs' common folder
    (videos as ``.mp4``); a name taken twice gets ``_2``, ``_3``, ... before its suffix."""
    root = os.path.commonpath([os.path.abspath(f.parent) for f in files])
    taken: set[Path] = set()
    plan = {}
    for file in files:
        relative = Path(os.path.relpath(os.path.abspath(file), root))
        first = out = save_dir / (relative.with_suffix(".mp4") if is_video(file) else relative)
        index = 1
        while out in taken:  # e.g. clip.avi and clip.mkv, both drawn as clip.mp4
            index += 1
            out = first.with_name(f"{first.stem}_{index}{first.suffix}")
        taken.add(out)
        plan[file] = out
    return plan


def _prepare(files: list[Path], save_dir: Path, exist_ok: bool, detector: Detector, outputs: dict
             ) -> tuple[dict[Path, Path], PredictionWriter]:
    """The output of every input and the run's writer in the save directory (a fresh ``name``, ``name2``, ...
    unless ``exist_ok``); refuses, before creating anything, a plan in which an output is one of the inputs (the same
    file: hard links and symlinks included) or ``save_dir`` is a file."""
    check_output(save_dir, kind="dir", what="--save-dir")
    if not exist_ok:
        save_dir = make_run_dir(save_dir.parent, save_dir.name)
    plan = output_paths(files, save_dir)
    writer = PredictionWriter(save_dir, {file: out.relative_to(save_dir) for file, out in plan.items()},
                              detector.class_names, category_ids=detector.category_ids,
                              model_version=detector.card.model_name or "ssd", **outputs)
    check_outputs(plan.values(), inputs=files, what="--save-dir output")
    writer.check(files)
    save_dir.mkdir(parents=True, exist_ok=True)
    return plan, writer


def predict_source(
    detector: Detector,
    source: str | Path,
    save_dir: str | Path = "runs/predict",
    *,
    score_threshold: float | None = None,
    iou_threshold: float = PREDICT.iou_threshold,
    max_detections: int = PREDICT.max_detections,
    batch_size: int = 8,
    save_images: bool = True,
    fmt: str = "json",
    progress: bool = True,
    exist_ok: bool = False,
    tile: int | str | tuple[int, int] | None = None,
    tile_overlap: float = TILE_OVERLAP,
    save_txt: bool = False,
    save_conf: bool = False,
    save_crop: bool = False,
    classes: list[int | str] | None = None,
    workers: int = DECODE_WORKERS,
) -> PredictSummary:
    """Predict on an image, a folder, a glob or a video file and write the results to ``save_dir``.

    ``save_dir`` is used as it is with ``exist_ok``, else as a fresh run directory (``save_dir``, or ``save_dir2``,
    ``save_dir3``, ... when taken). Images are decoded with :func:`ssd.data.images.read_image` by ``workers`` threads
    (0: one at a time between batches) and run ``batch_size`` at a time; videos are read frame by frame with OpenCV.
    Files inside an earlier save folder are not read (reported). With ``save_images``, each image is saved with its
    boxes drawn (see :func:`output_paths`) and each video as ``.mp4``. Every result is written at once to
    ``predictions.jsonl``, one line per image or frame (``file``, ``frame`` (videos only), ``width``, ``height``,
    ``detections``: ``box`` xyxy pixels, ``score``, ``label``, ``name``); the ``fmt`` file is assembled from it at the
    end, also after Ctrl-C: ``"json"`` ``predictions.json`` (``{"class_names", "images": [record, ...]}``),
    ``"coco"`` ``predictions_coco.json`` (``image_id`` = the running index of the image or frame, ``category_id`` =
    the dataset's category id of the label when the checkpoint stores them (:attr:`Detector.category_ids`), else the
    label ``0..K-1``, ``bbox`` xywh pixels, ``score``), ``"csv"`` or ``"labelstudio"`` (see
    :mod:`ssd.inference.result_files`). ``save_txt`` / ``save_conf``: YOLO label files that ``ssd train`` reads
    (:mod:`ssd.inference.yolo_labels`); ``save_crop``: a crop per detection in a folder per class
    (:mod:`ssd.inference.crop_files`). ``classes``: keep only these classes (names or labels, see
    :meth:`Detector.class_indices`). An unreadable image or video is reported by name, skipped and
    listed in the summary. ``tile`` / ``tile_overlap``: tiled prediction of large images and video frames (see
    :meth:`Detector.predict`). ``score_threshold``: ``None`` is the model's best-F1 confidence, else
    ``settings.PREDICT``'s (:meth:`Detector.confidence`).
    """
    check_tile(tile, tile_overlap)
    check_format(fmt)
    if save_conf and not save_txt:
        raise ConfigError("save_conf adds confidences to the labels of save_txt: give both (--save-txt --save-conf)")
    if workers < 0:
        raise ConfigError(f"workers must be 0 (decode in this thread) or more, got {workers}")
    files, save_dirs = exclude_save_dirs(resolve_source(source))
    for folder in save_dirs:
        print(f"not read: {folder}, a save folder of ssd predict (its files are outputs, never inputs)")
    if not files:
        raise FileNotFoundError(f"no inputs in {source} outside save folders of ssd predict")
    score_threshold = detector.confidence(score_threshold)[0]
    check_thresholds(score_threshold, iou_threshold, max_detections, batch_size)
    options = dict(score_threshold=score_threshold, iou_threshold=iou_threshold, max_detections=max_detections,
                   tile=tile, tile_overlap=tile_overlap, classes=detector.class_indices(classes))
    plan, writer = _prepare(files, Path(save_dir), exist_ok, detector,
                            dict(fmt=fmt, save_txt=save_txt, save_conf=save_conf, save_crop=save_crop))
    summary = PredictSummary(writer.save_dir, writer.results_file)
    outputs = plan if save_images else None
    images = [f for f in files if not is_video(f)]
    bar = tqdm(total=len(images), desc="images", unit="img", disable=not progress or not images)
    with writer:  # also on Ctrl-C: the results so far are in the JSONL and the fmt file
        decoded = decode_files(images, workers, ahead=2 * batch_size)
        while chunk := list(islice(decoded, batch_size)):
            _predict_images(detector, chunk, outputs, options, writer, summary, bar)
            bar.update(len(chunk))
        bar.close()
        for video in (f for f in files if is_video(f)):
            _predict_video(detector, video, outputs, batch_size, options, writer, summary, progress)
    summary.notes += writer.report()
    return summary


def _predict_images(detector: Detector, chunk: list[tuple[Path, Tensor | Exception]],
                    outputs: dict[Path, Path] | None, options: dict, results: PredictionWriter,
                    summary: PredictSummary, bar: tqdm) -> None:
    """One batch of decoded image files; an unreadable one (its ``ValueError`` / ``OSError``) is skipped."""
    for path, error in chunk:
        if isinstance(error, Exception):
            summary.skip(path, error, bar)
    kept = [(path, image) for path, image in chunk if not isinstance(image, Exception)]
    if not kept:
        return
    paths, decoded = [str(path) for path, _ in kept], [image for _, image in kept]
    for result, (path, image) in zip(detector.detect(decoded, paths, **options), kept):
        results.write(result, image)
        summary.images += 1
        summary.detections += len(result.scores)
        if outputs is not None:
            from ssd.plots import save_image

            save_image(_draw(image, result, detector.class_names), outputs[path])


def _draw(image: Tensor, result: Result, class_names: list[str]) -> Tensor:
    from ssd.plots import draw_detections

    return draw_detections(image, result.boxes, result.labels, result.scores, class_names)


def _read_frames(capture, count: int) -> list[Tensor]:
    cv2 = require("cv2", "video", "reading video")

    frames = []
    while len(frames) < count:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(torch.from_numpy(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)).permute(2, 0, 1))
    return frames


def _predict_video(detector: Detector, path: Path, outputs: dict[Path, Path] | None, batch_size: int, options: dict,
                   results: PredictionWriter, summary: PredictSummary, progress: bool) -> None:
    """Frames read with OpenCV, run ``batch_size`` at a time, written to ``outputs[path]`` (mp4) with boxes."""
    cv2 = require("cv2", "video", "reading video")

    capture = cv2.VideoCapture(str(path))
    writer = None
    frames = 0
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if capture.isOpened() else 0
    bar = tqdm(total=total or None, desc=path.name, unit="frame", disable=not progress)
    try:
        while capture.isOpened() and (chunk := _read_frames(capture, batch_size)):
            for result, image in zip(detector.detect(chunk, [str(path)] * len(chunk), **options), chunk):
                results.write(result, image, frames)
                summary.detections += len(result.scores)
                frames += 1
                if outputs is not None:
                    if writer is None:
                        outputs[path].parent.mkdir(parents=True, exist_ok=True)
                        fps, size = capture.get(cv2.CAP_PROP_FPS) or 25.0, (image.shape[-1], image.shape[-2])
                        writer = cv2.VideoWriter(str(outputs[path]), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
                    drawn = _draw(image, result, detector.class_names).permute(1, 2, 0).numpy()
                    writer.write(cv2.cvtColor(np.ascontiguousarray(drawn), cv2.COLOR_RGB2BGR))
            bar.update(len(chunk))
    finally:
        bar.close()
        capture.release()
        if writer is not None:
            writer.release()
    if frames == 0:
        summary.skip(path, ValueError("cannot read any frame (not a video OpenCV can decode)"))
        return
    summary.videos += 1
    summary.frames += frames


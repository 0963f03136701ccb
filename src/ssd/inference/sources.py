"""``ssd predict``'s front end: :func:`predict_source` over an image, a folder, a glob, a video or live streams
(:mod:`ssd.inference.streams`), optionally tracking objects (:mod:`ssd.inference.tracking`), writing drawn
copies and the results as they come (:class:`ssd.inference.writers.PredictionWriter`; the detections themselves come
from :class:`ssd.inference.detector.Detector`, and images, videos and streams alike go through the one frame loop of
:mod:`ssd.inference.frames`). Under ``torchrun`` each process takes a slice of the files and rank 0 merges the
outputs (:mod:`ssd.inference.shards`).

Outputs never overwrite inputs: the save directory is a fresh one (``predict``, ``predict2``, ... like training runs)
unless ``exist_ok``, drawn copies keep the inputs' paths relative to their common folder (equal file names from
different folders stay apart), a plan that would write over an input is refused before anything is written, and the
files of an earlier save folder are never read as inputs.
"""

from __future__ import annotations

import glob
import os
import re
from contextlib import nullcontext
from pathlib import Path

from ssd.data.images import IMAGE_SUFFIXES, is_image
from ssd.errors import ConfigError, MissingInputError
from ssd.files import check_output, check_outputs, make_run_dir
from ssd.inference.detector import Detector, load
from ssd.inference.display import open_window
from ssd.inference.frames import Run
from ssd.inference.globs import expand_glob
from ssd.inference.result_files import check_format
from ssd.inference.results import PredictSummary
from ssd.inference.shards import Shard
from ssd.inference.streams import StreamGroup, is_live, live_sources, stream_name
from ssd.inference.tracking import tracker_settings
from ssd.inference.videos import DRAWN_VIDEO_SUFFIX
from ssd.inference.writers import PredictionWriter, check_ls_root, exclude_save_dirs
from ssd.inference.yolo_labels import frame_source
from ssd.log import LOGGER
from ssd.optional import has_torch
from ssd.schemas import PredictConfig

__all__ = ["VIDEO_SUFFIXES", "is_video", "output_paths", "predict_source", "resolve_source"]

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".wmv", ".mpg", ".mpeg")


def is_video(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_SUFFIXES


def resolve_source(source: str | Path) -> list[Path]:
    """Files of a source: the file itself, a folder's images and videos with its subfolders' (sorted), or a glob's
    files (sorted). A link that leads nowhere (dangling, or a loop) is kept, so that reading it skips it by name."""
    path = Path(source)
    kinds = (f"images: {', '.join(s[1:] for s in IMAGE_SUFFIXES)}; videos: {', '.join(s[1:] for s in VIDEO_SUFFIXES)}")
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if (is_image(f) or is_video(f)) and not f.is_dir())
    elif path.is_file():
        if not (is_image(path) or is_video(path)):  # its outputs are named after its kind (/dev/stdin has none)
            raise ConfigError(f"source {source}: {path.suffix or 'no suffix'} is not an image or video suffix "
                              f"({kinds})")
        return [path]
    elif path.exists():
        raise ConfigError(f"source {source} is not a regular file (a FIFO, a device or a socket: ssd predict reads "
                          "files, it does not wait on a stream of bytes); give an image, a folder, a glob or a video")
    elif glob.has_magic(str(source)):
        files = sorted(f for f in expand_glob(str(source)) if f.is_file())  # links to folders followed once
    else:
        raise MissingInputError(f"source {source} does not exist (give an image, a folder, a glob or a video file)")
    if not files:
        raise MissingInputError(f"no images or videos in {source} ({kinds})")
    return files


def output_paths(files: list[Path | str], save_dir: Path) -> dict[Path | str, Path]:
    """Where the drawn copy of each input goes: ``save_dir`` / its path relative to the inputs' common folder
    (videos as ``.avi``), a live source (a string, :func:`~ssd.inference.streams.is_live`) as
    ``save_dir / <stream_name>.avi`` (:mod:`ssd.inference.videos`: readable after a kill). Every per-image output
    (drawn copy, ``--save-txt`` image and label, crops) is named after this name, so it is one per input by its
    stem: control characters become ``_``, and a name whose
    folder and stem are taken (``x.png`` after ``x.jpg``, ``clip.avi`` and ``clip.mkv``), or that a video's frames
    take (``clip_000000.jpg`` beside ``clip.avi``: :func:`~ssd.inference.yolo_labels.frame_name`), gets ``_2``,
    ``_3``, ... before its suffix."""
    local = [Path(f) for f in files if not (isinstance(f, str) and is_live(f))]
    root = os.path.commonpath([os.path.abspath(f.parent) for f in local]) if local else ""
    taken: set[Path] = set()
    framed: set[Path] = set()  # the stems of videos and streams, whose frames are <stem>_<frame>
    plan = {}
    for file in sorted(files, key=lambda f: not _has_frames(f)):  # frame names reserved before any image's
        if isinstance(file, str) and is_live(file):
            relative = Path(stream_name(file, DRAWN_VIDEO_SUFFIX))
        else:  # a name with a newline or a tab is no name a dataset reader takes
            relative = Path(_CONTROL.sub("_", os.path.relpath(os.path.abspath(file), root)))
        first = out = save_dir / (relative.with_suffix(DRAWN_VIDEO_SUFFIX) if is_video(Path(file)) else relative)
        index = 1
        while _clash(out, taken, framed):
            index += 1
            out = first.with_name(f"{first.stem}_{index}{first.suffix}")
        taken.add(out.with_suffix(""))
        if _has_frames(file):
            framed.add(out.with_suffix(""))
        plan[file] = out
    return {file: plan[file] for file in files}


def _has_frames(file: Path | str) -> bool:
    return (isinstance(file, str) and is_live(file)) or is_video(Path(file))


def _clash(out: Path, taken: set[Path], framed: set[Path]) -> bool:
    """``out``'s stem is taken in its folder, or is the name of a frame of a video there."""
    video = frame_source(out.stem)
    return out.with_suffix("") in taken or (video is not None and out.parent / video in framed)


def _local_files(source: str | Path) -> list[Path]:
    """The files of a source that is not live (:func:`resolve_source`), but those inside an earlier save folder
    (said, never read: they are outputs)."""
    files, save_dirs = exclude_save_dirs(resolve_source(source))
    for folder in save_dirs:
        LOGGER.info(f"not read: {folder}, a save folder of ssd predict (its files are outputs, never inputs)")
    if not files:
        raise MissingInputError(f"no inputs in {source} outside save folders of ssd predict")
    return files


def _prepare(files: list[Path | str], config: PredictConfig, detector: Detector, shard: Shard, drawn: bool
             ) -> tuple[dict[Path | str, Path], PredictionWriter]:
    """The output of every input and the run's writer in the save directory (``config.run_dir``: a fresh ``name``,
    ``name2``, ... unless ``exist_ok``, made by rank 0 of a sharded run); refuses, before creating anything, a plan in
    which an output is one of the inputs (the same file: hard links and symlinks included) or the save directory is
    a file, and one that this run would write through a link in or mix with an earlier run's files in
    (:meth:`~ssd.inference.writers.PredictionWriter.check_folder`). ``drawn``: the drawn copies are written."""
    save_dir = Path(config.run_dir)
    check_output(save_dir, kind="dir", what="--save-dir")
    if config.fmt == "labelstudio" and config.ls_root is not None:  # before a save folder is made
        check_ls_root(str(config.ls_root), save_dir, files)
    if not config.exist_ok:
        save_dir = shard.run_dir(lambda: make_run_dir(save_dir.parent, save_dir.name))
    plan = output_paths(files, save_dir)
    writer = PredictionWriter(save_dir, {Path(file): out.relative_to(save_dir) for file, out in plan.items()},
                              detector.class_names, category_ids=detector.category_ids,
                              model_version=detector.card.model_name or "ssd", part_dir=shard.part_dir(save_dir),
                              fmt=config.fmt, ls_root=config.ls_root, save_txt=config.save_txt,
                              save_conf=config.save_conf, save_crop=config.save_crop)
    check_outputs([*plan.values(), *writer.fixed_outputs()], inputs=files, what="--save-dir output")
    if shard.is_main:  # the other ranks come once rank 0 may have begun to write
        writer.check_folder(plan.values() if drawn else ())
    save_dir.mkdir(parents=True, exist_ok=True)
    return plan, writer


def predict_source(config: PredictConfig, detector: Detector | None = None, *, progress: bool = True
                   ) -> PredictSummary:
    """Predict on ``config.source`` (an image, a folder, a glob, a video file or live streams) with the options of
    ``ssd predict`` (:class:`~ssd.schemas.PredictConfig`, checked when it was made) and write the results to
    ``config.run_dir``. ``detector``: the model, opened already (``ssd predict`` opens it on the rank's device; then
    ``config.weights`` may be ``None``); ``None`` opens ``config.weights`` on ``config.device``
    (:func:`~ssd.inference.detector.load`). ``progress``:
    progress bars on the ``ssd`` logger's stream. The options below are ``config``'s fields.

    The save directory (``--project/--name``, ``runs/predict/exp`` by default, or ``--save-dir``) is used as
    it is with ``exist_ok``, else as a fresh run directory (``exp``, or ``exp2``, ``exp3``, ... when
    taken: :func:`ssd.files.make_run_dir`). Images are decoded with :func:`ssd.data.images.read_image` by ``workers``
    threads (0: one at a time between batches) and run ``batch_size`` at a time; videos are read frame by frame with
    OpenCV. Files inside an earlier save folder are not read (reported). With ``save_images``, each image is saved with
    its boxes drawn (see :func:`output_paths`) and each video as ``.avi``. Every result is written at once to
    ``predictions.jsonl``, one line per image or frame (``file``, ``frame`` (videos only), ``width``, ``height``,
    ``detections``: ``box`` xyxy pixels, ``score``, ``label``, ``name``); the ``fmt`` file is assembled from it at the
    end, also after Ctrl-C: ``"json"`` ``predictions.json`` (``{"class_names", "images": [record, ...]}``), ``"coco"``
    ``predictions_coco.json`` (``image_id`` = the running index of the image or frame, ``category_id`` = the dataset's
    category id of the label when the checkpoint stores them (:attr:`Detector.category_ids`), else the label ``0..K-1``,
    ``bbox`` xywh pixels, ``score``), ``"csv"`` or ``"labelstudio"`` (see :mod:`ssd.inference.result_files`; ``ls_root``
    the folder Label Studio serves, see :class:`~ssd.inference.writers.PredictionWriter`).
    ``save_txt`` / ``save_conf``: YOLO label files that ``ssd train`` reads (:mod:`ssd.inference.yolo_labels`);
    ``save_crop``: a crop per detection in a folder per class (:mod:`ssd.inference.crop_files`). ``classes``: keep only
    these classes (names or labels, see :meth:`Detector.class_indices`). An unreadable image or video is reported by
    name, skipped and listed in the summary. ``tile`` / ``tile_overlap``: tiled prediction of large images and video
    frames (see :meth:`Detector.predict`). ``tta``: test-time augmentation (:mod:`ssd.inference.tta`).
    ``score_threshold``: ``None`` is the model's best-F1 confidence, else
    ``settings.PREDICT``'s (:meth:`Detector.confidence`).

    Live sources (a camera index, an ``rtsp://`` / ``http(s)://`` URL, a ``.streams`` file: see
    :mod:`ssd.inference.streams`) run until they end, fail (after reconnecting) or Ctrl-C (the outputs stay valid; why:
    :attr:`~ssd.inference.results.PredictSummary.stopped`): the newest frame of each, frames arriving while the model is
    busy dropped and counted; each stream drawn as ``<stream_name>.avi``. ``track``: ByteTrack ids (``tracker``: its
    YAML settings, :func:`~ssd.inference.tracking.tracker_settings`), one tracker per video or stream, and the images of
    a folder tracked as one sequence in name order (a single image has nothing to track: ``ConfigError``); ids go in
    every output (``track_id``) and in the drawn frames, with a trail. ``reconnect``: seconds a live stream that stopped
    is reopened before it fails; ``fail_fast``: one that fails stops the others (else they go on, and the run fails at
    the end). A stream's URL is named everywhere with its secrets hidden (:func:`ssd.text.redact_url`). ``show``: each
    drawn image or frame in a window (:mod:`ssd.inference.display`; ``ConfigError`` when no window can open).

    Under ``torchrun`` each process predicts a contiguous slice of the files (a video whole; with ``track``, the
    images as one sequence on one process) and rank 0 merges: every output is the one a single process writes
    (:mod:`ssd.inference.shards`), and rank 0's summary tells the whole run (the others': ``main`` false, their
    share). Live sources are not sharded (``ConfigError`` under torchrun).
    """
    check_format(config.fmt)  # an API caller's unknown format, before a save folder is made
    if detector is None and config.weights is None:
        raise ConfigError("predict_source needs a model: give config.weights, or a detector")
    settings = tracker_settings(config.tracker) if config.track else None
    live = live_sources(config.source) if is_live(config.source) else None
    files = live if live is not None else _local_files(config.source)
    images = [f for f in files if live is None and not is_video(f)]
    if config.track and images == files and len(images) == 1:
        raise ConfigError(f"track follows objects across the frames of a video or a stream, and {images[0]} is one "
                          f"image (a folder of images is tracked as one sequence, in name order)")
    if detector is None:
        detector = load(config.weights, device=config.device, half=config.half)
    options = dict(score_threshold=detector.confidence(config.score_threshold)[0], iou_threshold=config.iou_threshold,
                   max_detections=config.max_detections, tile=config.tile, tile_overlap=config.tile_overlap,
                   classes=detector.class_indices(config.classes), tta=config.tta)
    drawn, show = config.save_images, config.show
    if (drawn or show) and not has_torch():  # the drawing is torchvision's
        LOGGER.warning("drawn copies (--save-images, --show) need PyTorch, which this runtime lacks: only the results "
                       "files are written (--no-save-images silences this)")
        drawn = show = False
    # an image a unit of work, a video whole, and images tracked as one sequence whole: the units of the shards
    units = ([images] if config.track and images else [[image] for image in images]) + [
        [video] for video in files if live is None and is_video(video)]
    shard, window = Shard.join(live is not None), None
    mine = [file for unit in shard.take(units) for file in unit]
    try:
        window = open_window() if show else None
        # live sources open first: one that cannot be opened stops the run before anything is written
        streams = (StreamGroup(live, reconnect=config.reconnect, fail_fast=config.fail_fast) if live is not None
                   else nullcontext())
        with streams as group:
            plan, writer = _prepare(group.names if group is not None else files, config, detector, shard, drawn)
            run = Run(detector, options, settings, writer, PredictSummary(writer.save_dir, writer.results_file),
                      plan if drawn else None, window, config.batch_size, config.workers, progress)
            if config.track and len(images) > 1:
                LOGGER.info(f"--track: the {len(images)} images are tracked as one sequence of frames, in name order")
            with writer:  # also on Ctrl-C: the results so far are in the JSONL and the fmt file
                try:
                    if group is not None:
                        run.live(group)
                    run.images([f for f in mine if not is_video(f)])
                    for video in (f for f in mine if is_video(f)):
                        run.video(video)
                    writer.close()
                    shard.merge(writer, run.summary)
                except BaseException:
                    shard.salvage(writer)  # under torchrun, rank 0 keeps the other ranks' parts that exist
                    raise
    finally:
        if window is not None:
            window.close()
    run.summary.notes += writer.report()
    run.summary.main = shard.is_main
    return run.summary

"""One schema per command: the options of ``ssd val``, ``ssd predict``, ``ssd serve``, ``ssd export``,
``ssd benchmark`` and ``ssd tune`` (``ssd train``'s is :class:`ssd.training.config.TrainConfig`).

Each schema is a frozen dataclass with a field per option: its type, its default and its help text, written once.
The command line generates the command's options from the fields (:func:`ssd.cli.options.add_config_options`;
``batch_size`` is ``--batch-size``, :func:`option_flag`), and the Python API reads its keyword defaults from them
(``ssd.evaluate(batch_size=ValConfig.batch_size)``). Building a schema checks every value and raises
:class:`ssd.errors.ConfigError` naming the option's flag: the thresholds by :func:`ssd.settings.check_thresholds` and
the tile by :func:`ssd.settings.check_tile`, the rules the Python API applies too.

The commands that write a run directory take ``project`` / ``name`` / ``exist_ok``: ``runs/<command>/exp``, then
``exp2``, ``exp3``, ... (:func:`ssd.files.make_run_dir`), or ``project/name`` itself with ``exist_ok``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ssd.artifacts import BENCHMARK_ROWS, EXPORT_FORMATS
from ssd.errors import ConfigError
from ssd.limits import MAX_WORKERS, is_real, is_whole, value_text
from ssd.settings import (
    EVALUATE,
    PREDICT,
    THRESHOLD_OPTIONS,
    TILE_OVERLAP,
    check_batch_sizes,
    check_batching,
    check_calib_images,
    check_onnx_options,
    check_thresholds,
    check_tile,
)

__all__ = ["ValConfig", "PredictConfig", "ServeConfig", "ExportConfig", "BenchmarkConfig", "CommandSchema", "DATA_HELP",
           "option", "option_flag", "run_name_problem"]



def option(help: str, default: Any = dataclasses.MISSING, *, flag: str | None = None,
           choices: tuple[str, ...] | None = None, metavar: str | None = None, const: Any = None,
           default_factory: Callable[[], Any] | None = None, required: bool = False) -> Any:
    """A schema field (the commands' and :class:`ssd.training.config.TrainConfig`'s): ``help`` for ``--help``;
    ``flag`` when the option is not spelled after the field (``fmt`` is ``--format``); ``choices`` when they are not
    a ``Literal``; ``metavar``: the value's name in ``--help``; ``const``: the value of the option given alone;
    ``default_factory`` instead of ``default`` for a mutable default; ``required``: the command needs the option
    although the Python API has a default (a ``Detector`` given instead of ``weights``)."""
    metadata = {k: v for k, v in {"help": help, "flag": flag, "choices": choices, "metavar": metavar,
                                  "const": const, "required": required or None}.items() if v is not None}
    if default_factory is not None:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def option_flag(f: dataclasses.Field) -> str:
    """The command-line option of a field: its ``flag``, a threshold's (:data:`ssd.settings.THRESHOLD_OPTIONS`:
    ``--conf``, ``--iou``, ``--max-det``), else ``--`` and the field's name with dashes."""
    return f.metadata.get("flag") or THRESHOLD_OPTIONS.get(f.name, "--" + f.name.replace("_", "-"))


def run_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run directory's name (one folder inside the project), or ``None``."""
    if name in ("", ".", "..") or Path(name).name != name:
        return "must be one folder name inside --project (no '/', no '..', not absolute)"
    return None


class CommandSchema:
    """What every command schema does: refuse a bad value naming its flag, and give its fields as keywords."""

    @classmethod
    def from_options(cls, options: dict[str, Any]):
        """The schema of the fields among ``options`` (parsed command-line arguments); the others keep defaults."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in options.items() if k in names})

    def values(self, *leave_out: str) -> dict[str, Any]:
        """Every field as a keyword argument, but ``leave_out``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in leave_out}

    def _flags(self) -> dict[str, str]:
        return {f.name: option_flag(f) for f in dataclasses.fields(self)}

    def _require(self, name: str, ok: bool, rule: str) -> None:
        if not ok:
            raise ConfigError(f"{self._flags()[name]} {rule}, got {value_text(getattr(self, name))}")

    def _check_common(self) -> None:
        """The thresholds, batch size, workers, tile and run name of the schemas that have them."""
        flags, fields = self._flags(), {f.name for f in dataclasses.fields(self)}
        score = getattr(self, "score_threshold", None)
        check_thresholds(EVALUATE.score_threshold if score is None else score,  # None: the model's confidence
                         getattr(self, "iou_threshold", EVALUATE.iou_threshold),
                         getattr(self, "max_detections", EVALUATE.max_detections),
                         getattr(self, "batch_size", 1), names=flags)
        if "workers" in fields:
            self._require("workers", is_whole(self.workers) and 0 <= self.workers <= MAX_WORKERS,
                          f"must be a whole number from 0 to {MAX_WORKERS} (ssd.limits.MAX_WORKERS)")
        if "tile" in fields:  # stored as check_tile returns it: None, "auto" or (height, width)
            object.__setattr__(self, "tile", check_tile(self.tile, self.tile_overlap, names=flags))
        if "name" in fields:
            problem = run_name_problem(self.name)
            self._require("name", problem is None, problem or "")

    def _positive(self, *names: str) -> None:
        for name in names:
            value = getattr(self, name)
            self._require(name, value is None or (is_whole(value) and value >= 1), "must be a positive integer")


_WEIGHTS = "checkpoint (.pt), run directory, .onnx (FP32 or INT8), OpenVINO .xml or its folder, .pt2 (torch.export)"
DATA_HELP = "data.yaml, dataset folder or COCO JSON"
_TILE = ("also detect on overlapping tiles of N (or HxW) pixels of each image, or auto (images more than twice the "
         "network input, tiles of the input size), and merge (default: off)")
_TILE_OVERLAP = "share of a tile its neighbours also cover, in [0, 1)"
MAX_RECONNECT_S = 7 * 24 * 3600.0
_TTA = ("test-time augmentation: also detect on the mirrored image and on the image shrunk to 0.8 of the input, "
        "and fuse the boxes (weighted box fusion; about 3x the network time)")
_EXIST_OK = "write into --project/--name when it exists instead of a new name2, name3, ..."


@dataclass(frozen=True, kw_only=True)
class ValConfig(CommandSchema):
    """``ssd val``: score a model (or a file of detections) on a dataset split; a report in ``project/name``."""

    weights: Path | None = option(f"what to evaluate: {_WEIGHTS}", None)
    detections: Path | None = option("score this COCO results JSON (the dataset's image and category ids) instead "
                                     "of a model", None)
    data: str = option(DATA_HELP)
    split: str = option("dataset split", "val")
    metric: Literal["voc07", "voc", "coco"] = option(
        "voc07: VOC2007 11-point AP@0.5; voc: VOC2010+ area AP@0.5; coco: AP@[.5:.95]", "voc07")
    batch_size: int = option("images per batch", 16)
    workers: int = option("data loading worker processes (0: in the main process)", 0)
    recheck: bool = option("read and decode the whole dataset again instead of trusting its index (rebuilt)", False)
    device: str = option("cpu, cuda, cuda:N, mps or auto", "auto")
    score_threshold: float = option("score threshold in [0, 1]", EVALUATE.score_threshold)
    iou_threshold: float = option("NMS IoU threshold in [0, 1]", EVALUATE.iou_threshold)
    max_detections: int = option("detections kept per image", EVALUATE.max_detections, metavar="N")
    save_json: Path | None = option("also write the detections as COCO-format JSON here", None)
    save: bool = option("write the report to a run directory (--no-save: print it only)", True)
    project: Path = option("where the report's run directory goes", Path("runs/val"))
    name: str = option("run directory name; name2, name3, ... when taken", "exp")
    exist_ok: bool = option(_EXIST_OK, False)
    tile: str | tuple[int, int] | None = option(_TILE, None)
    tile_overlap: float = option(_TILE_OVERLAP, TILE_OVERLAP)
    tta: bool = option(_TTA, False)
    track: bool = option("score tracking (HOTA, IDF1, MOTA) on MOT ground truth: --data is a MOTChallenge sequence "
                         "folder (img1/, gt/gt.txt), a folder of them, or a folder of frames with its gt.txt", False)
    tracker: Path | None = option("with --track: ByteTrack settings (a YAML file, as ssd predict --tracker)", None)

    def __post_init__(self) -> None:
        if (self.weights is None) == (self.detections is None):
            raise ConfigError("give one of --weights (a model to evaluate) and --detections (a file of detections)")
        if self.tta and self.detections is not None:
            raise ConfigError("--tta augments a model's input, and --detections scores a file of detections: give "
                              "--weights with --tta")
        if self.track and self.weights is None:
            raise ConfigError("--track scores a model's tracks: give --weights, not --detections")
        if self.tracker is not None and not self.track:
            raise ConfigError("--tracker sets the tracker of --track: add --track")
        self._check_common()


@dataclass(frozen=True, kw_only=True)
class PredictConfig(CommandSchema):
    """``ssd predict``: detect objects in images, videos or streams; outputs in ``project/name`` (or ``save_dir``).
    :func:`ssd.inference.sources.predict_source` takes it (``weights`` ``None`` there: a detector given)."""

    weights: Path | None = option(_WEIGHTS, None, required=True)
    source: str = option("image, folder (subfolders included), glob, video file, camera index (0), rtsp:// or "
                         "http(s):// stream, or a .streams file (one camera or URL a line)")
    score_threshold: float | None = option("score threshold in [0, 1] (default: the model's best-F1 confidence, "
                                           f"else {PREDICT.score_threshold})", None)
    iou_threshold: float = option("NMS IoU threshold in [0, 1]", PREDICT.iou_threshold)
    max_detections: int = option("detections kept per image", PREDICT.max_detections, metavar="N")
    batch_size: int = option("images per batch", 8)
    device: str = option("cpu, cuda, cuda:N or auto", "auto")
    half: bool = option("half precision (CUDA only)", False)
    project: Path = option("where the run directory goes", Path("runs/predict"))
    name: str = option("run directory name; name2, name3, ... when taken", "exp")
    exist_ok: bool = option(_EXIST_OK, False)
    save_dir: Path | None = option("the run directory as one path, PROJECT/NAME (default: runs/predict/exp)", None)
    fmt: Literal["json", "coco", "csv", "labelstudio"] = option(
        "detections file assembled at the end from predictions.jsonl (written as results come)", "json",
        flag="--format")
    ls_root: str | None = option("--format labelstudio: the folder Label Studio's local-files storage serves "
                                 "(LABEL_STUDIO_LOCAL_FILES_DOCUMENT_ROOT; default /), or the http(s):// URL at "
                                 "which the current directory is served", None, metavar="DIR|URL")
    save_images: bool = option("draw the detections on a copy of each image and video (--no-save-images: only the "
                               "detection files)", True)
    save_txt: bool = option("YOLO labels per image in SAVE_DIR/yolo, with data.yaml: a dataset ssd train reads",
                            False)
    save_conf: bool = option("add each detection's confidence to --save-txt labels", False)
    save_crop: bool = option("one image per detection in SAVE_DIR/crops/CLASS", False)
    classes: list[str] | None = option("keep only these classes (names or labels 0..K-1)", None, metavar="CLASS")
    workers: int = option("threads decoding images ahead (0: in the main thread)", 2)
    track: bool = option("track objects across video and stream frames (ByteTrack): ids in every output and drawn "
                         "with a trail; a folder of images is tracked as one sequence in name order", False)
    tracker: Path | None = option("ByteTrack settings for --track (keys: see ssd.inference.tracking)", None,
                                  metavar="YAML")
    show: bool = option("show the drawn frames in a window (needs a display)", False)
    reconnect: float = option("seconds a live stream that stops (or gives no frame) is reopened, with a doubling delay "
                              "capped at 5 s, before it counts as failed (0: never)", 3.5, metavar="SECONDS")
    fail_fast: bool = option("stop every live stream when one fails (default: the others go on, and the run exits 1 "
                             "at the end)", False)
    tile: str | tuple[int, int] | None = option(_TILE, None)
    tile_overlap: float = option(_TILE_OVERLAP, TILE_OVERLAP)
    tta: bool = option(_TTA, False)

    def __post_init__(self) -> None:
        self._check_common()
        self._require("reconnect", is_real(self.reconnect) and 0 <= self.reconnect <= MAX_RECONNECT_S,
                      f"must be a number of seconds from 0 to {MAX_RECONNECT_S:g} (a week)")
        if self.tracker is not None and not self.track:
            raise ConfigError(f"--tracker {self.tracker} sets up tracking: give track too (--track --tracker "
                              f"{self.tracker})")
        if self.save_conf and not self.save_txt:
            raise ConfigError("--save-conf adds confidences to the labels of --save-txt: give both (--save-txt "
                              "--save-conf)")
        moved = [k for k in ("project", "name") if getattr(self, k) != getattr(PredictConfig, k)]
        if self.save_dir is not None and moved:
            raise ConfigError(f"--save-dir is --project and --name in one path: give either, not --save-dir with "
                              f"--{moved[0]}")

    @property
    def run_dir(self) -> Path:
        """Where the run writes: ``save_dir``, else ``project/name`` (``name2``, ... when taken, unless
        ``exist_ok``)."""
        return self.save_dir if self.save_dir is not None else self.project / self.name


@dataclass(frozen=True, kw_only=True)
class ServeConfig(CommandSchema):
    """``ssd serve``: serve a model over HTTP (:func:`ssd.serve.server.serve` takes it whole)."""

    weights: Path = option("anything ssd predict takes")
    host: str = option("address to listen on (a loopback address: this machine only)", "127.0.0.1")
    port: int = option("port to listen on", 8000)
    device: str = option("cpu, cuda, cuda:N or auto", "cpu")
    half: bool = option("half precision (CUDA only)", False)
    score_threshold: float | None = option("requests' default score threshold in [0, 1] (default: the model's "
                                           f"best-F1 confidence, else {PREDICT.score_threshold})", None)
    iou_threshold: float = option("requests' default NMS IoU threshold in [0, 1]", PREDICT.iou_threshold)
    max_detections: int = option("requests' default detections kept per image", PREDICT.max_detections,
                                 metavar="N")
    max_batch: int = option("most concurrent requests run as one batch (1: no batching)", 8)
    max_wait_ms: float = option("how long the first request of a batch waits for others, in ms", 5.0)
    samples: Path | None = option("folder of example images the page at / offers", None)
    threads: int | None = option("PyTorch threads of the server: pre-/post-processing, a .pt network (0: one per "
                                 "core)", 1)
    max_pending: int = option("most /predict requests in the server at once (arriving, queued or running); more are "
                              "answered 503 with Retry-After", 32, metavar="N")
    timeout: float = option("seconds a request may take from its arrival to its answer: 408 when its upload has not "
                            "arrived by then, else 504", 30.0, metavar="S")
    idle_timeout: float = option("seconds a connection may send nothing (before a request, between requests, in the "
                                 "middle of an upload) before it is closed", 5.0, metavar="S")
    max_pixels: int = option("most pixels an upload is decoded to (a JPEG is decoded at a reduced scale near the "
                             "model's input first); larger images are refused with 413", 4096 * 4096, metavar="N")

    def __post_init__(self) -> None:
        self._check_common()
        self._require("port", is_whole(self.port) and 0 <= self.port <= 65535, "must be in 0..65535 (0: a free port)")
        check_batching(self.max_batch, self.max_wait_ms)
        self._positive("max_pending", "max_pixels")
        for name in ("timeout", "idle_timeout"):
            self._require(name, is_real(getattr(self, name), finite=True) and 0 < getattr(self, name) <= 3600,
                          "must be a number of seconds in (0, 3600]")
        self._require("threads", self.threads is None or (is_whole(self.threads) and self.threads >= 0),
                      "must be a whole number, 0 or more (0: one per core)")


@dataclass(frozen=True, kw_only=True)
class ExportConfig(CommandSchema):
    """``ssd export``: a checkpoint to an artifact, next to the weights or at ``output``."""

    weights: Path = option("checkpoint (.pt) or run directory (its best.pt)")
    fmt: str = option("onnx (ONNX Runtime, OpenCV DNN), openvino, pt2 (torch.export, TorchScript's successor) or "
                      "tflite (LiteRT, MediaPipe)",
                      "onnx", flag="--format", choices=EXPORT_FORMATS)
    output: Path | None = option("output file (OpenVINO: folder), not the weights file (default: next to the "
                                 "weights)", None)
    opset: int = option("ONNX opset (lower ones are down-converted when possible)", 18)
    dynamic_batch: bool = option("allow any batch size", False)
    nms: bool = option("put score filtering and NMS inside the graph", False)
    uint8_input: bool = option("ONNX, OpenVINO: the graph takes uint8 [B, H, W, 3] RGB images at the network size and "
                               "normalizes them itself", False)
    score_threshold: float = option("with --nms: score threshold in [0, 1]", PREDICT.score_threshold)
    iou_threshold: float = option("with --nms: NMS IoU threshold in [0, 1]", PREDICT.iou_threshold)
    max_detections: int = option("with --nms: detections kept per image", PREDICT.max_detections, metavar="N")
    int8: bool = option("quantize to INT8, calibrated on --data's training images", False)
    fp16: bool = option("tflite: store the weights in float16 (half the size)", False)
    data: str | None = option(f"dataset whose training images calibrate --int8 ({DATA_HELP})", None)
    calib_images: int | None = option("calibration images for --int8 (default: 300, or every training image when "
                                      "fewer)", None)
    check: bool = option("check the export against PyTorch with its runtime (--no-check: skip it)", True)
    exist_ok: bool = option("replace an OpenVINO export of ssd in an existing --output folder (other folders are "
                            "refused)", False)

    def __post_init__(self) -> None:
        self._check_common()
        self._positive("opset")
        check_calib_images(self.calib_images)
        check_onnx_options(self.opset)  # before any calibration data is read


@dataclass(frozen=True, kw_only=True)
class BenchmarkConfig(CommandSchema):
    """``ssd benchmark``: export to every format, score each on the val split and time it, in ``project/name``."""

    weights: Path = option("checkpoint (.pt) or run directory (its best.pt)")
    data: str = option(f"{DATA_HELP} (val split scored, train split calibrates INT8)")
    formats: str | None = option(f"comma-separated: {', '.join(BENCHMARK_ROWS)} (default: all; with --artifacts: "
                                 "pytorch)", None)
    artifacts: tuple[Path, ...] = option("also benchmark these exported models as they are (.onnx, OpenVINO .xml or "
                                         "folder, .pt2): a row each, named kind:file", (), metavar="PATH")
    batch_sizes: tuple[int, ...] = option("latency at batch 1, images/s at the largest (space- or comma-separated)",
                                          (1, 8))
    floor: float | None = option("exit 1 when a format scores mAP50 (points) below this, or fails", None)
    device: str = option("cpu, cuda, cuda:N or auto", "cpu")
    calib_images: int | None = option("calibration images of the INT8 rows (default: 300 or all)", None)
    runs: int = option("timed images at batch 1", 30)
    skip_invalid: bool = option("score the val split without its invalid objects", False)
    project: Path = option("where the run directory goes", Path("runs/benchmark"))
    name: str = option("run directory name; name2, name3, ... when taken", "exp")
    exist_ok: bool = option(_EXIST_OK, False)

    def __post_init__(self) -> None:
        self._check_common()
        self._positive("runs")
        check_calib_images(self.calib_images)
        check_batch_sizes(self.batch_sizes)
        if self.floor is not None:  # nan would never be missed
            self._require("floor", is_real(self.floor, finite=True) and 0 <= self.floor <= 100,
                          "must be mAP50 points in [0, 100]")

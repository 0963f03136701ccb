"""Inference: :func:`load` a checkpoint or an exported ONNX model as a :class:`Detector`, predict on images, and
:func:`predict_source` over an image, a folder, a glob or a video, writing drawn images/videos and one JSON per run.

Every output box is pixel ``xyxy`` of the original image; labels are ``0..K-1``.
"""

from __future__ import annotations

import glob
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from torchvision.transforms.v2.functional import pil_to_tensor
from tqdm import tqdm

from ssd.boxes import pixel_scale
from ssd.data.images import is_image, read_image
from ssd.engine.distributed import resolve_device
from ssd.models.ssd import SSD
from ssd.postprocess import postprocess

__all__ = ["Result", "Detector", "OnnxDetector", "PredictSummary", "load", "predict_source", "VIDEO_SUFFIXES"]

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".m4v", ".webm", ".wmv", ".mpg", ".mpeg")


@dataclass
class Result:
    """Detections of one image.

    Attributes:
        boxes: ``[N, 4]`` float32 pixel ``xyxy`` of the original image, sorted by decreasing score.
        scores: ``[N]`` float32.
        labels: ``[N]`` int64 in ``0..K-1``.
        names: ``N`` class names (``class_names[label]``).
        width, height: the original image size in pixels.
        path: the image file, or ``None`` for in-memory images.
    """

    boxes: Tensor
    scores: Tensor
    labels: Tensor
    names: list[str]
    width: int
    height: int
    path: str | None = None

    def to_dict(self) -> dict:
        """JSON-able: ``file``, ``width``, ``height``, ``detections`` (``box`` xyxy pixels, ``score``, ``label``, ``name``)."""
        return {
            "file": self.path,
            "width": self.width,
            "height": self.height,
            "detections": [
                {"box": box, "score": score, "label": label, "name": name}
                for box, score, label, name in zip(
                    self.boxes.tolist(), self.scores.tolist(), self.labels.tolist(), self.names
                )
            ],
        }


def _to_image(item, index: int) -> Tensor:
    """One input -> ``[3, H, W]`` tensor (``SSD.preprocess`` checks tensors: shape, uint8 or float in ``0..1``)."""
    if isinstance(item, (str, Path)):
        return read_image(item)
    if isinstance(item, Image.Image):
        return pil_to_tensor(item.convert("RGB"))
    if isinstance(item, np.ndarray):
        if item.dtype != np.uint8 or item.ndim != 3 or item.shape[2] != 3:
            raise ValueError(f"input {index}: numpy image must be HWC uint8 RGB (shape [H, W, 3]), "
                             f"got shape {list(item.shape)} dtype {item.dtype}")
        return torch.from_numpy(np.ascontiguousarray(item)).permute(2, 0, 1)
    if isinstance(item, Tensor):
        return item
    raise ValueError(f"input {index}: unsupported type {type(item).__name__} (give a path, a PIL image, a numpy HWC "
                     f"uint8 array or a [3, H, W] tensor)")


class Detector:
    """A loaded PyTorch SSD ready for inference (see :func:`load`).

    Attributes: ``model`` (eval mode, on ``device``), ``class_names``, ``image_size``, ``device``, ``half``.
    """

    def __init__(self, model: nn.Module, device: str | torch.device = "cpu", half: bool = False):
        self.device = torch.device(device)
        if half and self.device.type != "cuda":
            raise ValueError(f"half precision needs a CUDA device, got device={str(self.device)!r}")
        self.model = model.to(self.device).eval()
        self.half = half
        self.class_names = list(model.class_names)
        self.image_size = model.config.image_size

    def predict(self, source, conf: float = 0.25, iou: float = 0.45, max_det: int = 100,
                batch_size: int = 8) -> list[Result]:
        """Detect objects in ``source``: one or a list of paths, PIL images, numpy ``[H, W, 3]`` uint8 RGB arrays,
        tensors ``[3, H, W]`` (uint8, or float in ``0..1``). Returns one :class:`Result` per image, in order.

        ``conf``: keep scores above it; ``iou``: NMS overlap threshold (per class); ``max_det``: detections per image.
        """
        items = list(source) if isinstance(source, (list, tuple)) else [source]
        results = []
        for start in range(0, len(items), batch_size):  # decoded batch by batch
            batch = items[start:start + batch_size]
            paths = [str(item) if isinstance(item, (str, Path)) else None for item in batch]
            images = [_to_image(item, start + offset) for offset, item in enumerate(batch)]
            results += self._results(images, paths, conf, iou, max_det)
        return results

    @staticmethod
    def to_tensors(items: Iterable) -> list[Tensor]:
        """Inputs (see :meth:`predict`) -> ``[3, H, W]`` tensors (uint8 or float 0..1); ``ValueError`` names a bad one."""
        return [_to_image(item, index) for index, item in enumerate(items)]

    def _results(self, images: list[Tensor], paths: list[str | None], conf: float, iou: float,
                 max_det: int) -> list[Result]:
        detections = self._detect(images, conf, iou, max_det)
        return [
            Result(d["boxes"].float().cpu(), d["scores"].float().cpu(), d["labels"].cpu(),
                   [self.class_names[i] for i in d["labels"].tolist()], image.shape[-1], image.shape[-2], path)
            for d, image, path in zip(detections, images, paths)
        ]

    def _detect(self, images: list[Tensor], conf: float, iou: float, max_det: int) -> list[dict]:
        """``SSD.predict`` (pixel xyxy of each image), in float16 autocast when ``half``."""
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16, enabled=self.half):
            return self.model.predict(images, score_threshold=conf, iou_threshold=iou, max_detections=max_det)


class OnnxDetector(Detector):
    """An exported ONNX model run with ONNX Runtime (see :mod:`ssd.engine.export` for inputs, outputs, metadata).

    Same preprocessing and, without in-graph NMS, the same :func:`ssd.postprocess` as :class:`Detector`.
    With in-graph NMS the thresholds were fixed at export: ``conf`` may only raise the score threshold, ``max_det``
    may only lower the count, ``iou`` must be the exported one.
    """

    def __init__(self, path: str | Path, device: str | torch.device = "cpu"):
        import onnxruntime as ort

        from ssd.checkpoint import CheckpointError

        self.path = Path(path)
        self.device = torch.device(device)
        self.half = False
        providers = ["CPUExecutionProvider"]
        if self.device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
            providers.insert(0, ("CUDAExecutionProvider", {"device_id": self.device.index or 0}))
        try:
            self.session = ort.InferenceSession(str(self.path), providers=providers)
        except Exception as e:  # onnxruntime raises its own exception types for unreadable files
            raise CheckpointError(f"cannot load ONNX model {self.path}: {e}") from e
        meta = self.session.get_modelmeta().custom_metadata_map
        if "class_names" not in meta:
            raise CheckpointError(f"{self.path} was not written by `ssd export` (no class_names metadata); "
                                  f"export it with `ssd export --weights CKPT --format onnx`")
        self.class_names = json.loads(meta["class_names"])
        self.image_size = int(meta["image_size"])
        # The model's own preprocessing (SSD.preprocess) reads only these attributes of the model.
        self._preprocess_settings = SimpleNamespace(
            image_size=self.image_size, priors=torch.empty(0),
            config=SimpleNamespace(mean=json.loads(meta["mean"]), std=json.loads(meta["std"])),
        )
        self.variances = tuple(json.loads(meta["variances"]))
        self.nms = json.loads(meta["nms"])
        if self.nms:
            self.score_threshold = float(meta["score_threshold"])
            self.iou_threshold = float(meta["iou_threshold"])
            self.max_det = int(meta["max_det"])
        batch_dim = self.session.get_inputs()[0].shape[0]
        self.fixed_batch = batch_dim if isinstance(batch_dim, int) else None

    def run(self, batch: Tensor) -> list[np.ndarray]:
        """Run the graph on a preprocessed ``[B, 3, S, S]`` batch (split to the exported batch size if it is fixed)."""
        array = batch.float().cpu().numpy()
        if self.fixed_batch is None or self.fixed_batch == len(array):
            return self.session.run(None, {"images": array})
        if self.fixed_batch != 1:
            raise ValueError(f"{self.path} takes batches of exactly {self.fixed_batch} images, got {len(array)}")
        outputs = [self.session.run(None, {"images": array[i:i + 1]}) for i in range(len(array))]
        names = [o.name for o in self.session.get_outputs()]
        return [parts[0] if name == "priors" else np.concatenate(parts) for name, parts in zip(names, zip(*outputs))]

    def _detect(self, images: list[Tensor], conf: float, iou: float, max_det: int) -> list[dict]:
        batch, sizes = SSD.preprocess(self._preprocess_settings, images)
        outputs = [torch.from_numpy(v) for v in self.run(batch)]
        if self.nms:
            detections = self._unpack_nms(*outputs, conf, iou, max_det)
        else:
            loc, logits, priors = outputs
            detections = postprocess(loc, logits, priors, score_threshold=conf, iou_threshold=iou, top_k=max_det,
                                     variances=self.variances)
        for d, factor in zip(detections, pixel_scale(sizes)):
            d["boxes"] = d["boxes"] * factor
        return detections

    def _unpack_nms(self, rows: Tensor, counts: Tensor, conf: float, iou: float, max_det: int) -> list[dict]:
        if iou != self.iou_threshold or conf < self.score_threshold or max_det > self.max_det:
            raise ValueError(
                f"{self.path} was exported with NMS at conf={self.score_threshold}, iou={self.iou_threshold}, "
                f"max_det={self.max_det}; got conf={conf}, iou={iou}, max_det={max_det} (conf may only be higher, "
                f"max_det only lower, iou must be equal; export again for other values or without --nms)"
            )
        keep = (torch.arange(rows.shape[1]) < counts[:, None]) & (rows[..., 4] > conf)  # still sorted by score
        return [
            {"boxes": r[k, :4][:max_det], "scores": r[k, 4][:max_det], "labels": r[k, 5][:max_det].long()}
            for r, k in zip(rows, keep)
        ]


def load(path: str | Path, device: str | torch.device = "cpu", half: bool = False) -> Detector:
    """A :class:`Detector` for a checkpoint (``.pt``) or an :class:`OnnxDetector` for an exported ``.onnx`` model.

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"`` (CUDA when available). ``half``: float16 inference
    (PyTorch on CUDA only). Raises ``CheckpointError`` for a missing file or one not written by this library.
    """
    from ssd.checkpoint import CheckpointError

    path = Path(path)
    device = resolve_device(device)
    if not path.is_file():
        raise CheckpointError(f"weights file {path} does not exist")
    if path.suffix.lower() == ".onnx":
        if half:
            raise ValueError(f"half precision applies to PyTorch checkpoints, not to the ONNX model {path}")
        return OnnxDetector(path, device)
    from ssd.models import model_from_checkpoint

    return Detector(model_from_checkpoint(path), device, half)


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

    def __str__(self) -> str:
        done = f"{self.images} image{'s' * (self.images != 1)}"
        if self.videos:
            done += f", {self.videos} video{'s' * (self.videos != 1)} ({self.frames} frames)"
        lines = [f"{done}, {self.detections} detections -> {self.results_file}"]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} unreadable file{'s' * (len(self.skipped) != 1)}:")
            lines += [f"  {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)


def _is_video(path: Path) -> bool:
    return path.suffix.lower() in VIDEO_SUFFIXES


def _resolve(source: str | Path) -> list[Path]:
    """Files of a source: the file itself, a folder's images and videos (sorted), or a glob's."""
    path = Path(source)
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and (is_image(f) or _is_video(f)))
    elif path.is_file():
        return [path]
    elif glob.has_magic(str(source)):
        files = sorted(Path(f) for f in glob.glob(str(source), recursive=True) if Path(f).is_file())
    else:
        raise FileNotFoundError(f"source {source} does not exist (give an image, a folder, a glob or a video file)")
    if not files:
        raise FileNotFoundError(f"no images or videos in {source} (image suffixes: jpg, png, bmp, webp, tif, gif; "
                                f"videos: {', '.join(s[1:] for s in VIDEO_SUFFIXES)})")
    return files


def predict_source(
    detector: Detector,
    source: str | Path,
    save_dir: str | Path = "runs/predict",
    conf: float = 0.25,
    iou: float = 0.45,
    max_det: int = 100,
    batch_size: int = 8,
    save_images: bool = True,
    fmt: str = "json",
    progress: bool = True,
) -> PredictSummary:
    """Predict on an image, a folder, a glob or a video file and write the results to ``save_dir``.

    Images are decoded with :func:`ssd.data.images.read_image` and run ``batch_size`` at a time; videos are read frame
    by frame with OpenCV. With ``save_images``, each image is saved with its boxes drawn under its own name and each
    video as ``<stem>.mp4``. ``fmt="json"`` writes ``predictions.json``: ``{"class_names", "images": [per image or
    frame: file, frame (videos only), width, height, detections: [box xyxy pixels, score, label, name]]}``;
    ``fmt="coco"`` writes ``predictions_coco.json``, COCO detection results (``image_id`` = the running index of the
    image or frame, ``category_id`` = label ``0..K-1``, ``bbox`` xywh pixels, ``score``).
    An unreadable image or video is reported by name, skipped and listed in the summary.
    """
    if fmt not in ("json", "coco"):
        raise ValueError(f"unknown results format {fmt!r} (choose json or coco)")
    files = _resolve(source)
    save_dir = Path(save_dir)
    save_dir.mkdir(parents=True, exist_ok=True)
    summary = PredictSummary(save_dir, save_dir / ("predictions.json" if fmt == "json" else "predictions_coco.json"))
    options = dict(conf=conf, iou=iou, max_det=max_det)
    entries: list[dict] = []
    images = [f for f in files if not _is_video(f)]
    bar = tqdm(total=len(images), desc="images", unit="img", disable=not progress or not images)
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        decoded, paths = [], []
        for path in chunk:
            try:
                decoded.append(read_image(path))
                paths.append(str(path))
            except ValueError as e:
                _skip(summary, path, e, bar)
        for result, image in zip(detector._results(decoded, paths, **options), decoded):
            entries.append(result.to_dict())
            summary.images += 1
            summary.detections += len(result.scores)
            if save_images:
                _save_drawn(image, result, detector.class_names, save_dir / Path(result.path).name)
        bar.update(len(chunk))
    bar.close()
    for video in (f for f in files if _is_video(f)):
        _predict_video(detector, video, save_dir, batch_size, save_images, options, entries, summary, progress)
    _write_results(summary.results_file, entries, detector.class_names, fmt)
    return summary


def _skip(summary: PredictSummary, path: Path, error: Exception, bar: tqdm | None = None) -> None:
    summary.skipped.append((str(path), str(error)))
    (bar.write if bar is not None else print)(f"skipped {path}: {error}")


def _draw(image: Tensor, result: Result, class_names: list[str]) -> Tensor:
    from ssd.engine.plots import draw_detections

    return draw_detections(image, result.boxes, result.labels, result.scores, class_names)


def _save_drawn(image: Tensor, result: Result, class_names: list[str], path: Path) -> None:
    from ssd.engine.plots import save_image

    save_image(_draw(image, result, class_names), path)


def _predict_video(detector, path: Path, save_dir: Path, batch_size: int, save_images: bool, options: dict,
                   entries: list[dict], summary: PredictSummary, progress: bool) -> None:
    """Frames read with OpenCV, run ``batch_size`` at a time, written back as ``save_dir/<stem>.mp4`` with boxes."""
    import cv2

    capture = cv2.VideoCapture(str(path))
    writer = None
    frames = 0
    total = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)) if capture.isOpened() else 0
    bar = tqdm(total=total or None, desc=path.name, unit="frame", disable=not progress)
    try:
        while capture.isOpened():
            chunk = []
            while len(chunk) < batch_size:
                ok, frame = capture.read()
                if not ok:
                    break
                chunk.append(torch.from_numpy(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)).permute(2, 0, 1))
            if not chunk:
                break
            for result, image in zip(detector._results(chunk, [str(path)] * len(chunk), **options), chunk):
                entries.append({**result.to_dict(), "frame": frames})
                summary.detections += len(result.scores)
                frames += 1
                if save_images:
                    if writer is None:
                        fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
                        size = (image.shape[-1], image.shape[-2])
                        writer = cv2.VideoWriter(str(save_dir / f"{path.stem}.mp4"),
                                                 cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
                    drawn = _draw(image, result, detector.class_names).permute(1, 2, 0).numpy()
                    writer.write(cv2.cvtColor(np.ascontiguousarray(drawn), cv2.COLOR_RGB2BGR))
            bar.update(len(chunk))
    finally:
        bar.close()
        capture.release()
        if writer is not None:
            writer.release()
    if frames == 0:
        _skip(summary, path, ValueError("cannot read any frame (not a video OpenCV can decode)"))
        return
    summary.videos += 1
    summary.frames += frames


def _write_results(path: Path, entries: list[dict], class_names: list[str], fmt: str) -> None:
    if fmt == "json":
        content = {"class_names": class_names, "images": entries}
    else:
        from ssd.engine.metrics import to_coco_detections

        content = to_coco_detections([
            {key: [d[field] for d in entry["detections"]] for key, field in
             (("boxes", "box"), ("scores", "score"), ("labels", "label"))}
            for entry in entries
        ])
    path.write_text(json.dumps(content, indent=1))

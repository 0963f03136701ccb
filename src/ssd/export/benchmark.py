"""``ssd benchmark``: export a checkpoint to every deployment format, score each on the val split and time it.

Each row of :data:`RUNTIMES` is one runtime on one artifact (several runtimes share an artifact: OpenCV DNN runs the
ONNX Runtime FP32 file, OpenVINO bf16 the FP32 IR, ``pytorch-bf16`` the checkpoint). Every artifact is written into
the benchmark's own new folder. A row's status is ``ok``, ``exported but validation failed``, ``export failed`` or
``skipped`` (``pytorch-bf16``, eager bfloat16 autocast, where the device has no native bfloat16), with the reason.
Scores come from :func:`ssd.evaluation.evaluator.evaluate` (COCO metric: mAP50 and mAP50-95, thresholds
:data:`ssd.settings.EVALUATE`); ``change vs eager`` is the mAP50 difference to the PyTorch row in points. Timing
(:mod:`ssd.export.timing`) runs the whole pipeline on decoded val images, the runtimes in turn call by call, after a
warm-up: p50 / p90 milliseconds per image at batch 1 and the medians of its three stages (``pre ms``, ``network
ms``, ``post ms``), images per second at the largest batch size.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ssd.artifacts import BENCHMARK_ROWS, ArtifactKind, BenchmarkVariant
from ssd.data.gate import load_training_data
from ssd.data.images import read_image
from ssd.device import amp_dtype, autocast
from ssd.errors import ConfigError, MissingInputError, OutputError
from ssd.evaluation.evaluator import evaluate
from ssd.export import export
from ssd.export.timing import time_backends
from ssd.files import write_text
from ssd.inference.backends import Backend, backend_kind, folder_kind, open_backend
from ssd.log import progress as progress_bar
from ssd.names import did_you_mean
from ssd.schemas import BenchmarkConfig
from ssd.settings import check_batch_sizes, check_calib_images
from ssd.text import render_table

__all__ = ["RUNTIMES", "BenchmarkRow", "run_benchmark", "artifact_rows", "format_benchmark", "parse_formats",
           "below_floor"]

OK, VALIDATION_FAILED, EXPORT_FAILED, SKIPPED = "ok", "exported but validation failed", "export failed", "skipped"

def _writer(kind: ArtifactKind, int8: bool, fp16: bool = False) -> Callable[[Path, Path, str, int, bool], Path]:
    """How to write a kind's artifact (INT8 with ``int8``, float16 weights with ``fp16``) into the benchmark
    folder: ``(weights, folder, data, calibration images, exist_ok) -> path`` (the checkpoint itself for ``pt``)."""
    if kind.exporter is None:
        return lambda weights, folder, data, calib, exist_ok: weights
    tag = ("_int8" if int8 else "") if kind.folder else (".int8" if int8 else ".fp16" if fp16 else "")
    name = f"{kind.name}{tag}" if kind.folder else f"model{tag}{kind.output_suffix}"

    def write(weights: Path, folder: Path, data: str, calib: int | None, exist_ok: bool) -> Path:
        quantized = dict(int8=True, data=data, calib_images=calib) if int8 else dict(fp16=True) if fp16 else {}
        return export(weights, kind.name, folder / name, exist_ok=exist_ok, **quantized)

    return write


def _artifact(kind: ArtifactKind, row: BenchmarkVariant) -> str:
    return f"{kind.name}-int8" if row.int8 else f"{kind.name}-fp16" if row.fp16 else kind.name


_ARTIFACTS: dict[str, Callable[[Path, Path, str, int, bool], Path]] = {
    _artifact(kind, row): _writer(kind, row.int8, row.fp16) for kind, row in BENCHMARK_ROWS.values()}
"""Artifact (a kind, ``-int8`` when quantized, ``-fp16`` with float16 weights) -> its writer (:func:`_writer`), from
:data:`ssd.artifacts.ARTIFACTS`."""


class _Bfloat16Backend:
    """A PyTorch ``backend`` run under bfloat16 autocast, its outputs back in float32 for the post-processing."""

    def __init__(self, backend: Backend):
        self.backend = backend

    def __getattr__(self, name: str):
        return getattr(self.backend, name)

    def __call__(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with autocast(self.backend.device, torch.bfloat16):
            loc, logits = self.backend(batch)
        return loc.float(), logits.float()


class _SkippedRow(Exception):
    """A runtime that does not apply on this machine; the message says why."""


def _opener(row: BenchmarkVariant) -> Callable[[Path, str], Backend]:
    """How a row opens its artifact on a device: through the registry with the row's runtime (under bfloat16
    autocast for ``bfloat16`` rows, skipped where the device has no native bfloat16)."""
    def opener(path: Path, device: str) -> Backend:
        backend = open_backend(path, device, runtime=row.runtime)
        if not row.bfloat16:
            return backend
        if amp_dtype(backend.device) != torch.bfloat16:
            raise _SkippedRow(f"{backend.device} has no native bfloat16 (AVX512-BF16 / AMX, or a CUDA GPU with "
                              "bfloat16), where it is emulated and slower than float32")
        return _Bfloat16Backend(backend)

    return opener


RUNTIMES: dict[str, tuple[str, Callable[[Path, str], Backend]]] = {
    name: (_artifact(kind, row), _opener(row)) for name, (kind, row) in BENCHMARK_ROWS.items()}
"""Row -> (its artifact, how to open it on a device), from :data:`ssd.artifacts.ARTIFACTS`."""


@dataclass
class BenchmarkRow:
    """One runtime's result; the numbers are ``None`` where the row failed before them."""

    format: str
    status: str
    reason: str = ""
    artifact: str | None = None
    size_mb: float | None = None
    map50: float | None = None
    map: float | None = None
    change_vs_eager: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    images_per_s: float | None = None
    pre_ms: float | None = None
    network_ms: float | None = None
    post_ms: float | None = None


def parse_formats(text: str | Sequence[str] | None) -> list[str]:
    """``"onnx,onnx-int8"`` -> the runtimes, ``pytorch`` first (the reference of ``change vs eager``); ``None``:
    all of :data:`RUNTIMES`. An unknown name raises ``ValueError`` with the closest valid ones."""
    names = list(RUNTIMES) if text is None else [n.strip() for n in
                                                 (text.split(",") if isinstance(text, str) else text) if n.strip()]
    for name in names:
        if name not in RUNTIMES:
            raise ConfigError(f"unknown benchmark format {name!r}{did_you_mean(name, RUNTIMES)} "
                              f"(choose from {', '.join(RUNTIMES)})")
    return ["pytorch", *dict.fromkeys(n for n in names if n != "pytorch")]


def _size_mb(path: Path) -> float:
    files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
    return sum(p.stat().st_size for p in files) / 1e6


def run_benchmark(weights: str | Path, data: str | Path, out_dir: str | Path, *, formats: Sequence[str] | None = None,
                  batch_sizes: Sequence[int] = BenchmarkConfig.batch_sizes, device: str = BenchmarkConfig.device,
                  calib_images: int | None = None, runs: int = BenchmarkConfig.runs, warmup: int = 3,
                  skip_invalid: bool = False, progress: bool = True, artifacts: Sequence[str | Path] = (),
                  exist_ok: bool = False) -> list[BenchmarkRow]:
    """Benchmark ``weights`` (a checkpoint or run directory) on ``data``'s val split into ``out_dir``, a new or empty
    folder, or with ``exist_ok`` one whose earlier benchmark files are replaced (the artifacts, ``benchmark.csv``,
    ``benchmark.json``, ``benchmark.txt``). ``formats``: names of :data:`RUNTIMES` (:func:`parse_formats`);
    ``calib_images``: for the INT8 rows (default: 300, or the whole training split when smaller); ``runs`` timed images
    at batch 1 after ``warmup``; ``skip_invalid``: score the val split without its invalid objects (as ``ssd val
    --skip-invalid``) instead of refusing it; ``artifacts``: exported models benchmarked as they are, a row each after
    the formats' (:func:`artifact_rows`)."""
    from ssd.weights.resolve import resolve_weights

    names, given = parse_formats(formats), artifact_rows(artifacts)
    check_batch_sizes(batch_sizes)
    check_calib_images(calib_images)
    weights, out_dir = resolve_weights(weights), Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()) and not exist_ok:
        raise OutputError(f"benchmark folder {out_dir} is not empty: the benchmark writes into a new folder")
    eager = open_backend(weights, device)
    spec = load_training_data(data, class_names=list(eager.card.class_names), splits=("val",),
                              skip_invalid=skip_invalid)
    images = [read_image(r.path) for r in spec.records("val")[:16]]  # timed in turn
    out_dir.mkdir(parents=True, exist_ok=True)
    exported: dict[str, Path | Exception] = {}

    def export_once(kind: str) -> Path | Exception:
        if kind not in exported:
            try:
                exported[kind] = _ARTIFACTS[kind](weights, out_dir, str(data), calib_images, exist_ok)
            except (ValueError, OSError, RuntimeError) as e:  # the reason goes in the table, the others still run
                exported[kind] = e
        return exported[kind]

    jobs = [(name, lambda kind=RUNTIMES[name][0]: export_once(kind), RUNTIMES[name][1]) for name in names]
    jobs += [(name, lambda path=path: path, open_backend) for name, path in given.items()]
    rows, backends = [], {}
    for name, artifact, opener in progress_bar(jobs, desc="benchmark", unit="format", disable=not progress):
        row, backend = _scored_row(name, artifact(), opener, data, device, skip_invalid)
        rows.append(row)
        if backend is not None:
            backends[name] = backend
    timings = time_backends(backends, images, max(batch_sizes), runs, warmup)
    eager_map50 = rows[0].map50
    for row in rows:
        timing = timings.get(row.format)
        if isinstance(timing, Exception):
            row.status, row.reason = VALIDATION_FAILED, _reason(timing)
        elif timing is not None:
            for key, value in asdict(timing).items():
                setattr(row, key, value)
        if row.map50 is not None and eager_map50 is not None:
            row.change_vs_eager = round(row.map50 - eager_map50, 2)
    _write(rows, out_dir)
    return rows


def _scored_row(name: str, artifact: Path | Exception, opener: Callable[[Path, str], Backend], data, device: str,
                skip_invalid: bool) -> tuple[BenchmarkRow, Backend | None]:
    """The row ``name`` of ``artifact`` (or of the error that kept it from being exported) with its size and scores,
    and its backend to time (``None`` when it failed)."""
    if isinstance(artifact, Exception):
        return BenchmarkRow(name, EXPORT_FAILED, _reason(artifact)), None
    row = BenchmarkRow(name, OK, artifact=str(artifact), size_mb=round(_size_mb(artifact), 3))
    try:
        backend = opener(artifact, device)
        result = evaluate(backend, data, metric="coco", device=device, skip_invalid=skip_invalid)
    except _SkippedRow as e:
        row.status, row.reason = SKIPPED, _reason(e)
        return row, None
    except (ValueError, OSError, RuntimeError) as e:
        row.status, row.reason = VALIDATION_FAILED, _reason(e)
        return row, None
    row.map50, row.map = round(100 * result["AP50"], 2), round(100 * result["AP"], 2)
    return row, backend


def artifact_rows(paths: Sequence[str | Path]) -> dict[str, Path]:
    """Row name -> path of each exported model in ``paths`` (an .onnx, OpenVINO .xml or its folder, .pt2, ...):
    ``"kind:file name"``, the kind being the :data:`ssd.inference.backends.BACKENDS` runtime that opens it
    (``"kind:path"`` when two file names are alike). A missing path raises ``ValueError``."""
    kinds = {}
    for path in map(Path, paths):
        if not path.exists():
            raise MissingInputError(f"artifact {path} does not exist (--artifacts: exported models: .onnx, "
                                    "OpenVINO .xml or its folder, .pt2)")
        kinds[path] = folder_kind(path) or backend_kind(path)
    short = {f"{kind}:{path.name}" for path, kind in kinds.items()}
    return {f"{kind}:{path.name}" if len(short) == len(kinds) else f"{kind}:{path}": path
            for path, kind in kinds.items()}


def _reason(error: Exception) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _write(rows: list[BenchmarkRow], out_dir: Path) -> None:
    records = [asdict(row) for row in rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(records[0]))
    writer.writeheader()
    writer.writerows(records)
    write_text(out_dir / "benchmark.csv", buffer.getvalue())
    write_text(out_dir / "benchmark.json", json.dumps(records, indent=1))
    write_text(out_dir / "benchmark.txt", format_benchmark(rows) + "\n")


HEADER = ("format", "status", "size MB", "mAP50", "mAP50-95", "change vs eager", "ms/img p50", "p90", "img/s",
          "pre ms", "network ms", "post ms")


def format_benchmark(rows: Sequence[BenchmarkRow]) -> str:
    """The table (see :data:`HEADER`), then the reason of each row that failed."""
    def cell(value) -> str:
        return "-" if value is None else str(value)

    lines = render_table(HEADER, [
        (r.format, r.status, cell(r.size_mb), cell(r.map50), cell(r.map),
         "-" if r.change_vs_eager is None else f"{r.change_vs_eager:+.2f}", cell(r.p50_ms), cell(r.p90_ms),
         cell(r.images_per_s), cell(r.pre_ms), cell(r.network_ms), cell(r.post_ms)) for r in rows])
    lines += [f"{r.format}: {r.reason}" for r in rows if r.reason]
    return "\n".join(lines)


def below_floor(rows: Sequence[BenchmarkRow], floor: float) -> list[str]:
    """The formats under a mAP50 ``floor`` (points): those scoring below it and those that failed (no score); a
    skipped row does not count."""
    return [r.format for r in rows if r.status != SKIPPED and (r.map50 is None or r.map50 < floor)]

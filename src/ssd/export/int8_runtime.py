"""Which INT8 format to use on this CPU: ``ssd export --int8`` names the faster INT8 runtime when another format
was asked for.

:data:`INT8_FORMATS` maps a CPU kind (:func:`cpu_kind`, from its instruction-set flags) to the format whose runtime
ran ``ssd_tiny`` end to end faster, the pipeline in the graph (benchmarks/README.md, "The pipeline inside the
graph"): on AVX512-VNNI, TFLite (XNNPACK) against ONNX Runtime. AVX2-only and AMX CPUs could not be measured here:
AVX2-only follows XNNPACK's AVX2 integer kernels (ONNX Runtime INT8 ran at 0.92x its FP32 on one), AMX ONNX
Runtime's AMX kernels, which XNNPACK lacks.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

__all__ = ["INT8_FORMATS", "cpu_flags", "cpu_kind", "int8_advice"]

INT8_FORMATS = {"amx": "onnx", "vnni": "tflite", "avx2": "tflite"}
"""CPU kind -> the INT8 format that runs fastest there (see the module docstring for what was measured)."""

_KINDS = {"amx": "AMX", "vnni": "VNNI", "avx2": "AVX2 without VNNI"}


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags (Linux ``/proc/cpuinfo``); empty where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set()
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[-1].split()}


def cpu_kind(flags: Iterable[str]) -> str | None:
    """``"amx"``, ``"vnni"`` or ``"avx2"`` for an x86 CPU with those flags; ``None`` for any other (ARM, unknown)."""
    flags = set(flags)
    if "amx_int8" in flags:
        return "amx"
    if flags & {"avx512_vnni", "avx_vnni"}:
        return "vnni"
    return "avx2" if "avx2" in flags else None


def int8_advice(fmt: str, flags: Iterable[str] | None = None) -> str | None:
    """A line for an INT8 export to ``fmt`` on a CPU with ``flags`` (default: this one's) when another INT8 format
    runs faster there, else ``None`` (also for formats that are not CPU runtimes' choice: OpenVINO is named by
    whoever deploys on it)."""
    kind = cpu_kind(cpu_flags() if flags is None else flags)
    if fmt not in ("onnx", "tflite") or kind is None or INT8_FORMATS[kind] == fmt:
        return None
    faster = INT8_FORMATS[kind]
    runtime = {"onnx": "ONNX Runtime", "tflite": "TFLite (XNNPACK)"}
    return (f"INT8 on this CPU ({_KINDS[kind]}): {runtime[faster]} is the faster INT8 runtime end to end "
            f"(benchmarks/README.md); for speed, export with --format {faster} --int8")

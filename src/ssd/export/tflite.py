"""Export an SSD to TFLite (LiteRT) with Google's ``litert-torch`` converter, the pipeline inside the graph.

The graph (:class:`EdgeGraph`) is what a phone or a board runs without any code of ours:

- input ``image [1, S, S, 3]`` uint8 RGB at the network size (NHWC): the normalization ``(x / 255 - mean) / std`` is
  inside the graph;
- outputs ``location [1, P, 4]``, the box offsets from the default boxes in ``(y, x, h, w)`` order, and
  ``scores [1, P, K]``, the softmax probability of each object class (the background column dropped).

The file carries MediaPipe's object-detector metadata (:mod:`ssd.export.tflite_metadata`: labels, normalization, the
default boxes as SSD anchors and their decoding), so MediaPipe's ``ObjectDetector`` runs it as it is, and the model
card (``ssd.json``, an associated file) sealed with the file's digest, which
:class:`ssd.inference.backends.tflite.TfliteBackend` checks.

Precisions: FP32; FP16 weights (``fp16=True``, the converter's float16 weight recipe, computed in float32); full
integer INT8 (``calibration``: :mod:`ssd.export.tflite_int8`). FP32 and FP16 files are checked against PyTorch
(:func:`ssd.export.parity.check_backend`) before anything is written.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ssd.errors import ExportCheckError
from ssd.export.onnx import as_model
from ssd.export.parity import check_backend
from ssd.export.tflite_metadata import with_metadata
from ssd.files import write_bytes
from ssd.inference.backends.tflite import LOCATION_ORDER, TfliteBackend, require_litert
from ssd.optional import require, require_installed
from ssd.sizes import as_hw

__all__ = ["EdgeGraph", "export_tflite", "require_tflite_export", "converter_error", "flatbuffer",
           "in_converter_process", "converter_command", "CONVERTER_ERROR", "FP16_TOLERANCES"]

FP16_TOLERANCES = (1e-2, 1e-2)
"""``(box_tol, score_tol)`` of the FP16 check: float16 weights move scores by about 1e-3 (FP32: the defaults of
:func:`ssd.export.parity.check_backend`)."""


def require_tflite_export() -> None:
    """Check that the converter, the interpreter and MediaPipe's metadata classes are installed, else
    :class:`ssd.errors.MissingDependencyError` naming the ``tflite`` extra. The converter is only looked up: it is
    imported in the converter process (:func:`in_converter_process`)."""
    require_litert()
    require("mediapipe.tasks.metadata.metadata_schema_py_generated", "tflite", "TFLite export")
    require_installed("litert_torch", "tflite", "TFLite export")


class EdgeGraph(nn.Module):
    """``image [1, S, S, 3]`` uint8 (or float pixel values, traced for INT8) -> ``(location [1, P, 4] (y, x, h, w)
    offsets, scores [1, P, K])``. The normalization is a per-channel 1x1 convolution, which INT8 quantizes."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        std, mean = torch.tensor(model.card.std), torch.tensor(model.card.mean)
        self.normalize = nn.Conv2d(3, 3, 1, groups=3)
        with torch.no_grad():
            self.normalize.weight.copy_((1 / (255 * std)).view(3, 1, 1, 1))
            self.normalize.bias.copy_(-mean / std)

    def forward(self, image: Tensor) -> tuple[Tensor, Tensor]:
        pixels = image.permute(0, 3, 1, 2)
        loc, logits = self.model(self.normalize(pixels if pixels.is_floating_point() else pixels.float()))
        return loc[..., LOCATION_ORDER], logits.softmax(dim=-1)[..., 1:]


def converter_error(error: BaseException, model_name: str | None) -> ExportCheckError:
    """A converter's failure as one line: its last line of text, without the traceback."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    reason = (lines[-1] if lines else type(error).__name__)[:300]
    return ExportCheckError(f"litert-torch could not convert {model_name or 'the model'} to TFLite "
                            f"({type(error).__name__}: {reason}); nothing was written")


@contextlib.contextmanager
def quiet_converter():
    """litert-torch's progress lines off while converting (its setting is an environment variable), and the
    quantizer's printed summary and progress bar kept off ``ssd export``'s output (a failure's reason is in the
    exception, :func:`converter_error`)."""
    before = os.environ.get("LITERT_TORCH_SHOW_PROGRESS")
    os.environ["LITERT_TORCH_SHOW_PROGRESS"] = "n"
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if before is None:
            os.environ.pop("LITERT_TORCH_SHOW_PROGRESS", None)
        else:
            os.environ["LITERT_TORCH_SHOW_PROGRESS"] = before


def convert(graph: nn.Module, example: Tensor, model_name: str | None, **options) -> bytes:
    """The TFLite flatbuffer of ``graph`` traced on ``example`` (``options``: litert-torch's, e.g. its
    ``quant_config``); a converter failure is :func:`converter_error`."""
    litert_torch = require("litert_torch", "tflite", "TFLite export")
    try:
        with quiet_converter(), torch.no_grad():
            return bytes(litert_torch.convert(graph, (example,), **options).model_content())
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # the converter raises its own and MLIR's error types
        raise converter_error(e, model_name) from None


def flatbuffer(model: nn.Module, calibration: Sequence[Path] | None, fp16: bool) -> bytes:
    """The TFLite model of an SSD's :class:`EdgeGraph`: full-integer INT8 calibrated on ``calibration``
    (:mod:`ssd.export.tflite_int8`), float16 weights with ``fp16``, else FP32. What the converter process runs."""
    graph, model_name = EdgeGraph(model).eval(), model.config.name
    example = torch.zeros(1, *as_hw(model.config.image_size), 3, dtype=torch.uint8)
    if calibration is not None:
        from ssd.export.tflite_int8 import quantized_graph, uint8_interface

        try:
            module, pixels, options = quantized_graph(graph, example, calibration)
        except (ValueError, MemoryError, KeyboardInterrupt):  # ValueError: a calibration image refused, by name
            raise
        except Exception as e:  # torch.export's and the quantizer's own error types
            raise converter_error(e, model_name) from None
        return uint8_interface(convert(module, pixels, model_name, **options))
    options = {}
    if fp16:
        recipes = require("litert_torch.generative.quantize.quant_recipes", "tflite", "TFLite FP16 export")
        options["quant_config"] = recipes.full_fp16_recipe()
    return convert(graph, example, model_name, **options)


CONVERTER_ERROR = "ssd-converter-error: "
"""The prefix of the line in which the converter process (:mod:`ssd.export.tflite_convert`) gives its error."""


def converter_command(folder: Path, int8: bool, fp16: bool) -> list[str]:
    """The converter process's command line, for the files :func:`in_converter_process` puts in ``folder``."""
    return [sys.executable, "-m", "ssd.export.tflite_convert", str(folder), *(["--int8"] if int8 else []),
            *(["--fp16"] if fp16 else [])]


def in_converter_process(model: nn.Module, calibration: Sequence[Path] | None, fp16: bool) -> bytes:
    """:func:`flatbuffer` of ``model`` (an SSD) run by a child Python process, from the model saved as a checkpoint
    in a private temporary folder. litert-torch, and the JAX it imports, never enter this process, whose later
    forks (DataLoader workers) JAX warns against; a converter that crashes or is killed (out of memory) ends the
    child, and ``ssd export`` says so in one line, having written nothing."""
    from ssd.weights.checkpoint import save_checkpoint

    with tempfile.TemporaryDirectory(prefix="ssd-tflite-") as work:
        folder = Path(work)
        save_checkpoint(folder / "model.pt", model)
        if calibration is not None:
            (folder / "calibration.json").write_text(json.dumps([str(path) for path in calibration]))
        source = str(Path(__file__).resolve().parents[2])  # the child imports this very ssd package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (source, os.environ.get("PYTHONPATH"))))}
        done = subprocess.run(converter_command(folder, calibration is not None, fp16), stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, check=False)
        if done.returncode == 0 and (folder / "model.tflite").is_file():
            return (folder / "model.tflite").read_bytes()
    said = [line for line in done.stderr.decode(errors="replace").splitlines() if line.startswith(CONVERTER_ERROR)]
    if said:
        raise ExportCheckError(said[-1][len(CONVERTER_ERROR):])
    code = done.returncode
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    raise ExportCheckError(f"the TFLite converter process {how} before it finished (out of memory?); nothing was "
                           "written")


def export_tflite(weights_or_model, out_path: str | Path, calibration: Sequence[Path] | None = None, *,
                  fp16: bool = False, check: bool = True, sample_images: Sequence | None = None) -> Path:
    """Export a checkpoint path or an ``SSD`` to a ``.tflite`` file (see the module docstring); returns the path.

    ``calibration``: image paths for full-integer INT8 (:func:`ssd.export.quantize.calibration_paths`);
    ``fp16``: float16 weights. ``check``: compare the file with PyTorch on ``sample_images`` (default: two seeded
    random images) first; ``out_path`` is written only once it passed, atomically.

    Raises:
        ExportCheckError: the converter failed (its reason in one line) or the file disagrees with PyTorch.
    """
    out_path = Path(out_path)
    require_tflite_export()
    model = as_model(weights_or_model, out_path)
    card = model.card.replace(nms=None)
    converted = in_converter_process(model, calibration, fp16)
    if calibration is not None:
        from ssd.export.tflite_int8 import report_float_ops

        report_float_ops(converted)
        card = card.replace(precision="int8")
    elif fp16:
        card = card.replace(precision="fp16")
    data = with_metadata(converted, card, model.priors.detach().cpu())
    if check and calibration is None:
        with tempfile.TemporaryDirectory(prefix="ssd-check-") as work:
            candidate = Path(work) / out_path.name
            candidate.write_bytes(data)
            tolerances = FP16_TOLERANCES if fp16 else ()
            try:
                check_backend(model, TfliteBackend(candidate), "LiteRT", sample_images, *tolerances)
            except ExportCheckError as e:
                raise ExportCheckError(f"{str(e).replace(str(candidate), str(out_path))}; nothing was written"
                                       ) from None
    return write_bytes(out_path, data)

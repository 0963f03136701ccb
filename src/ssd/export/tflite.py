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
import os
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
from ssd.optional import require
from ssd.sizes import as_hw

__all__ = ["EdgeGraph", "export_tflite", "require_tflite_export", "converter_error", "FP16_TOLERANCES"]

FP16_TOLERANCES = (1e-2, 1e-2)
"""``(box_tol, score_tol)`` of the FP16 check: float16 weights move scores by about 1e-3 (FP32: the defaults of
:func:`ssd.export.parity.check_backend`)."""


def require_tflite_export():
    """``litert_torch``, after checking that the interpreter and MediaPipe's metadata classes are installed; else
    :class:`ssd.errors.MissingDependencyError` naming the ``tflite`` extra."""
    require_litert()
    require("mediapipe.tasks.metadata.metadata_schema_py_generated", "tflite", "TFLite export")
    return require("litert_torch", "tflite", "TFLite export")


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
    litert_torch = require_tflite_export()
    try:
        with quiet_converter(), torch.no_grad():
            return bytes(litert_torch.convert(graph, (example,), **options).model_content())
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as e:  # the converter raises its own and MLIR's error types
        raise converter_error(e, model_name) from None


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
    example = torch.zeros(1, *as_hw(model.config.image_size), 3, dtype=torch.uint8)
    card = model.card.replace(nms=None)
    if calibration is not None:
        from ssd.export.tflite_int8 import quantized_graph, report_float_ops, uint8_interface

        try:
            module, pixels, options = quantized_graph(EdgeGraph(model).eval(), example, calibration)
        except (ValueError, MemoryError, KeyboardInterrupt):  # ValueError: a calibration image refused, by name
            raise
        except Exception as e:  # torch.export's and the quantizer's own error types
            raise converter_error(e, model.config.name) from None
        flatbuffer = uint8_interface(convert(module, pixels, model.config.name, **options))
        report_float_ops(flatbuffer)
        card = card.replace(precision="int8")

    else:
        options = {}
        if fp16:
            from litert_torch.generative.quantize import quant_recipes

            options["quant_config"] = quant_recipes.full_fp16_recipe()
            card = card.replace(precision="fp16")
        flatbuffer = convert(EdgeGraph(model).eval(), example, model.config.name, **options)
    data = with_metadata(flatbuffer, card, model.priors.detach().cpu())
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

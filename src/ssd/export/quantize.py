"""INT8 post-training quantization of an exported ONNX graph with ONNX Runtime, calibrated on the user's images.

The network (the convolutions and every node they depend on, each operator type ONNX Runtime can quantize) is
quantized to static QDQ INT8: weights per output channel (int8, symmetric), activations per tensor (uint8, MinMax
range over the calibration images). What follows the last convolutions stays float: the heads' reshapes and
concatenations, and the in-graph decoding and NMS of an ``--nms`` export. Quantizing the operators between the
convolutions too (MobileNet's hard-swish products, residual additions) spares a dequantize / quantize pair around
each, measured faster than convolutions alone (``benchmarks/README.md``). Calibration images are the first ``N`` of
the dataset's training split, decoded by :func:`ssd.data.images.read_image` and made into network inputs by
:func:`ssd.preprocess.preprocess` exactly as at inference. The INT8 file carries the FP32 file's model card with
``precision`` ``int8``, sealed with its own graph, so :class:`ssd.inference.backends.onnx.OnnxBackend` loads it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from ssd.data.images import read_image
from ssd.data.load import load_dataset
from ssd.errors import ConfigError, DataError
from ssd.export.onnx import onnx_metadata
from ssd.files import write_bytes
from ssd.inference.backends.onnx import OnnxBackend, graph_digest
from ssd.log import LOGGER
from ssd.preprocess import preprocess
from ssd.settings import check_calib_images

__all__ = ["CALIBRATION_IMAGES", "calibration_paths", "calibration_input", "calibration_inputs", "network_nodes",
           "quantize_onnx"]

CALIBRATION_IMAGES = 300
"""The default number of calibration images (fewer when the training split has fewer)."""



def calibration_paths(data: str | Path | None, count: int | None = None) -> list[Path]:
    """The first ``count`` images of ``data``'s training split (a data.yaml, dataset folder or COCO JSON); ``None``:
    :data:`CALIBRATION_IMAGES`, or every training image when the split has fewer (logged on the ``ssd`` logger).

    Raises ``ValueError`` without ``data``, for a ``count`` below 1, for a split without images, or when the split
    has fewer images than a ``count`` given (saying how many it has)."""
    if data is None:
        raise ConfigError("INT8 calibration needs images: give a dataset with --data DATA (its training split is used)")
    check_calib_images(count)
    records = load_dataset(data).records("train")
    if not records:
        raise DataError(f"INT8 calibration needs training images, but the training split of {data} has none")
    if count is None:
        count = min(CALIBRATION_IMAGES, len(records))
        LOGGER.info("INT8 calibration on %d training images of %s (%s)", count, data,
                    "the default" if count == CALIBRATION_IMAGES else f"all of them: fewer than {CALIBRATION_IMAGES}")
    if len(records) < count:
        raise ConfigError(f"INT8 calibration asked for {count} images (--calib-images) but the training split of "
                          f"{data} has {len(records)}: use --calib-images {len(records)} or fewer, or a dataset with "
                          "more images")
    return [record.path for record in records[:count]]


def calibration_input(path: Path, image_size: int | tuple[int, int], mean: Sequence[float],
                      std: Sequence[float]) -> np.ndarray:
    """One calibration image as a network input ``[1, 3, S, S]`` float32, as inference would make it."""
    batch, _ = preprocess([read_image(path)], image_size, mean, std)
    return batch.numpy()


def calibration_inputs(paths: Sequence[Path], image_size: int | tuple[int, int], mean: Sequence[float],
                       std: Sequence[float]) -> Iterator[np.ndarray]:
    """Each image of ``paths`` as :func:`calibration_input` (decoded one at a time)."""
    return (calibration_input(path, image_size, mean, std) for path in paths)


class _Reader:
    """An ONNX Runtime ``CalibrationDataReader`` over :func:`calibration_inputs`."""

    def __init__(self, inputs: Iterator[np.ndarray]):
        self.inputs = inputs

    def get_next(self) -> dict[str, np.ndarray] | None:
        array = next(self.inputs, None)
        return None if array is None else {"images": array}


def network_nodes(graph) -> set[str]:
    """Names of the ``Conv`` nodes of an ONNX ``graph`` and of every node they depend on: the network, without the
    reshapes, decoding and NMS that follow its last convolutions."""
    producer = {output: node for node in graph.node for output in node.output}
    names: set[str] = set()
    pending = [node for node in graph.node if node.op_type == "Conv"]
    while pending:
        node = pending.pop()
        if node.name not in names:
            names.add(node.name)
            pending += [producer[name] for name in node.input if name in producer]
    return names


def quantize_onnx(fp32_path: str | Path, out_path: str | Path, images: Sequence[Path],
                  exclude: Sequence[str] = (), op_types: Sequence[str] | None = None,
                  operator_format: bool = False) -> Path:
    """Write the static INT8 version of an ``ssd export`` FP32 graph to ``out_path`` (atomically).

    ``images``: the calibration image files (:func:`calibration_paths`), made into network inputs by
    :func:`calibration_inputs` with the FP32 file's card (the file is opened and checked once). The rest are the
    standard remedies when a network quantizes poorly or slowly (``benchmarks/deploy.py`` measures them):
    ``exclude``, names of nodes to keep in float besides those after the network (:func:`network_nodes`);
    ``op_types``, the operator types to quantize (``None``: every type ONNX Runtime can; ``["Conv"]``: the
    convolutions only); ``operator_format``, fused ``QLinear*`` operators instead of QDQ pairs. The model card is
    the FP32 file's with ``precision`` ``int8``, sealed with the new graph."""
    import onnx
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32_card = OnnxBackend(fp32_path).card  # checked
    inputs = calibration_inputs(images, fp32_card.image_size, fp32_card.mean, fp32_card.std)
    card = fp32_card.replace(precision="int8")
    with tempfile.TemporaryDirectory(prefix="ssd-int8-") as work:
        prepared, quantized = Path(work) / "prepared.onnx", Path(work) / "int8.onnx"
        quant_pre_process(str(fp32_path), str(prepared))
        graph = onnx.load(str(prepared)).graph
        network = network_nodes(graph)
        after = [node.name for node in graph.node if node.name not in network]
        quantize_static(str(prepared), str(quantized), _Reader(inputs),
                        quant_format=QuantFormat.QOperator if operator_format else QuantFormat.QDQ,
                        op_types_to_quantize=None if op_types is None else list(op_types), per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                        nodes_to_exclude=[*after, *exclude], calibrate_method=CalibrationMethod.MinMax)
        proto = onnx.load(str(quantized))
    onnx.helper.set_model_props(proto, onnx_metadata(card.sealed(graph_digest(proto))))
    return write_bytes(out_path, proto.SerializeToString())

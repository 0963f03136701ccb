"""Full-integer INT8 TFLite: PyTorch 2 export quantization (litert-torch's ``PT2EQuantizer``: int8 activations per
tensor, weights per output channel) calibrated on the user's images, converted by litert-torch.

Every tensor of the graph is an integer, so that an integer-only accelerator (the Edge TPU compiler) can map the
whole graph, and its ends are uint8 as MediaPipe requires (:func:`uint8_interface`):

- the input ``image [1, S, S, 3]`` is uint8 with scale 1 and zero point 0: the pixels as they are (no calibration
  range: every pixel value is exact); inside, int8 (the pixel minus 128), the normalization a per-channel 1x1
  convolution;
- ``location`` has its calibrated range, ``scores`` the fixed range of a softmax (scale 1/256), as TFLite's integer
  softmax requires; both int8 inside, uint8 out.

The graph is traced on a copy made for the quantizer's patterns (:func:`folded`: batch norms folded, activations
not in place, hard sigmoids as integer ops); MobileNetV3's hard-swish, residual additions and head concatenations
are annotated here, so SSDLite is full-integer too.

Calibration images are decoded and resized as at inference (:func:`ssd.preprocess.preprocess`). After conversion
the graph's operators are read back from the flatbuffer: any left in float is named on the ``ssd`` logger
(:func:`float_ops`).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor, nn

from ssd.data.images import read_image
from ssd.log import LOGGER
from ssd.optional import require
from ssd.preprocess import preprocess

__all__ = ["quantized_graph", "folded", "uint8_interface", "report_float_ops", "float_ops", "calibration_pixels"]


def calibration_pixels(path: Path, image_size: tuple[int, int]) -> Tensor:
    """One calibration image as the float graph's input: ``[1, S, S, 3]`` float32 pixel values ``0..255``."""
    batch, _ = preprocess([read_image(path)], image_size, (0.0, 0.0, 0.0), (1 / 255,) * 3)
    return batch.permute(0, 2, 3, 1).contiguous()


def _quantizer():
    """litert-torch's static per-channel quantizer, with the graph's ends fixed (see the module docstring)."""
    pt2e = require("litert_torch.quantize.pt2e_quantizer", "tflite", "TFLite INT8 export")
    spec = require("torchao.quantization.pt2e.quantizer", "tflite", "TFLite INT8 export")
    utils = require("litert_torch.quantize.pt2e_quantizer_utils", "tflite", "TFLite INT8 export")

    def fixed(scale: float):
        return spec.FixedQParamsQuantizationSpec(torch.int8, scale=scale, zero_point=-128, quant_min=-128,
                                                 quant_max=127, qscheme=torch.per_tensor_affine)

    aten = torch.ops.aten
    own_range = (aten.hardswish.default, aten.hardsigmoid.default, aten.add.Tensor, aten.mul.Tensor)

    class FullInteger(pt2e.PT2EQuantizer):
        def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
            model = super().annotate(model)
            for node in model.graph.nodes:
                if node.op != "call_function":
                    continue
                source = node.args[0] if node.args else None
                if node.target is aten.permute.default and getattr(source, "op", "") == "placeholder":
                    # the image: pixel - 128 exactly, shared by the layout change and the normalization
                    node.meta["quantization_annotation"] = spec.QuantizationAnnotation(
                        input_qspec_map={source: fixed(1.0)}, output_qspec=spec.SharedQuantizationSpec((source, node)),
                        _annotated=True)
                    for user in node.users:
                        user.meta["quantization_annotation"].input_qspec_map[node] = spec.SharedQuantizationSpec(node)
                elif node.target in (aten.softmax.int, aten._softmax.default):
                    node.meta["quantization_annotation"] = spec.QuantizationAnnotation(
                        input_qspec_map={source: self.global_config.input_activation}, output_qspec=fixed(1 / 256),
                        _annotated=True)
                elif node.target is aten.slice.Tensor and "quantization_annotation" in source.meta:
                    shared = spec.SharedQuantizationSpec(source)
                    node.meta["quantization_annotation"] = spec.QuantizationAnnotation(
                        input_qspec_map={source: shared}, output_qspec=shared, _annotated=True)
                elif "quantization_annotation" in node.meta:
                    continue
                elif node.target in own_range:  # MobileNetV3's activations and residual sums: int8 kernels
                    config = self.global_config
                    node.meta["quantization_annotation"] = spec.QuantizationAnnotation(
                        input_qspec_map={arg: config.input_activation for arg in node.args
                                         if isinstance(arg, torch.fx.Node)},
                        output_qspec=config.output_activation, _annotated=True)
                elif node.target is aten.cat.default:  # one range for all the inputs
                    inputs = source
                    shared = spec.SharedQuantizationSpec((inputs[0], node))
                    node.meta["quantization_annotation"] = spec.QuantizationAnnotation(
                        input_qspec_map={arg: self.global_config.input_activation if i == 0 else shared
                                         for i, arg in enumerate(inputs)}, output_qspec=shared, _annotated=True)
            utils.propagate_annotation(model)  # a clamp after an addition annotated here shares its range
            return model

    return FullInteger().set_global(pt2e.get_symmetric_quantization_config(is_per_channel=True))


class _Hardsigmoid(nn.Module):
    """``relu6(x + 3) / 6``: the hard sigmoid as an addition, a clamp and a multiplication, which TFLite runs in
    int8 (litert-torch lowers ``hardsigmoid`` itself to float operations)."""

    def forward(self, x: Tensor) -> Tensor:
        return torch.nn.functional.hardtanh(x + 3.0, 0.0, 6.0) * (1 / 6)


def folded(graph: nn.Module) -> nn.Module:
    """A copy of ``graph`` the quantizer's patterns meet: each ``Conv2d`` followed by a ``BatchNorm2d`` in a
    ``Sequential`` is one convolution (the batch norm folded into its weights), activations are not in place
    (torchvision's MobileNetV3 uses in-place ones, which the quantizer does not annotate), and each ``Hardsigmoid``
    is a :class:`_Hardsigmoid`."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    graph = copy.deepcopy(graph).eval()
    for module in graph.modules():
        if getattr(module, "inplace", None) is True:
            module.inplace = False
        for name, child in module.named_children():
            if isinstance(child, nn.Hardsigmoid):
                setattr(module, name, _Hardsigmoid())
        if isinstance(module, nn.Sequential):
            for (name, conv), (norm_name, norm) in itertools.pairwise(module.named_children()):
                if isinstance(conv, nn.Conv2d) and isinstance(norm, nn.BatchNorm2d):
                    setattr(module, name, fuse_conv_bn_eval(conv, norm))
                    setattr(module, norm_name, nn.Identity())
    return graph


def float_ops(flatbuffer: bytes) -> list[str]:
    """The operators of a TFLite model that read or write a float tensor, as ``"OP (tensor name)"`` (its first float
    tensor), in graph order."""
    schema = require("ai_edge_litert.schema_py_generated", "tflite", "reading a TFLite model")
    names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    model = schema.Model.GetRootAs(flatbuffer, 0)
    found = []
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            tensors = [graph.Tensors(t) for t in [*op.InputsAsNumpy(), *op.OutputsAsNumpy()] if t >= 0]
            floating = [t for t in tensors if t.Type() in (schema.TensorType.FLOAT32, schema.TensorType.FLOAT16)]
            if floating:
                name = names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
                found.append(f"{name} ({floating[0].Name().decode(errors='replace')})")
    return found


def quantized_graph(graph: nn.Module, example: Tensor, calibration: Sequence[Path]
                    ) -> tuple[nn.Module, Tensor, dict]:
    """``graph`` (:class:`ssd.export.tflite.EdgeGraph`, traced on float pixels the shape of ``example``
    ``[1, S, S, 3]``) calibrated on the images ``calibration`` and quantized: ``(module, its example input, the
    converter's options)`` for :func:`ssd.export.tflite.convert`."""
    quantize = require("torchao.quantization.pt2e.quantize_pt2e", "tflite", "TFLite INT8 export")
    config = require("litert_torch.quantize.quant_config", "tflite", "TFLite INT8 export")
    pixels = example.float()
    quantizer = _quantizer()
    with torch.no_grad():
        # functional ops throughout (a residual ``+=`` is an in-place add otherwise), none decomposed further
        exported = torch.export.export(folded(graph), (pixels,)).run_decompositions({})
        prepared = quantize.prepare_pt2e(exported.module(), quantizer)
        for path in calibration:
            prepared(calibration_pixels(path, tuple(example.shape[1:3])))
        quantized = quantize.convert_pt2e(prepared, fold_quantize=False)
    return quantized, pixels, {"quant_config": config.QuantConfig(pt2e_quantizer=quantizer)}


def uint8_interface(flatbuffer: bytes) -> bytes:
    """The full-integer model with uint8 input and outputs (what MediaPipe and the Edge TPU take) around its int8
    graph: a ``QUANTIZE`` (an integer requantization, the same scale and the zero point moved by 128) after the
    input and before each output."""
    import flatbuffers

    schema = require("ai_edge_litert.schema_py_generated", "tflite", "TFLite INT8 export")
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(flatbuffer, 0))
    graph = model.subgraphs[0]
    codes = [code.builtinCode for code in model.operatorCodes]
    if schema.BuiltinOperator.QUANTIZE not in codes:
        quantize = schema.OperatorCodeT()
        quantize.builtinCode = quantize.deprecatedBuiltinCode = schema.BuiltinOperator.QUANTIZE
        quantize.version = 2
        model.operatorCodes.append(quantize)
        codes.append(schema.BuiltinOperator.QUANTIZE)
    opcode = codes.index(schema.BuiltinOperator.QUANTIZE)

    def uint8_twin(index: int, suffix: bytes) -> int:
        tensor = copy.deepcopy(graph.tensors[index])
        tensor.type, tensor.name, tensor.buffer = schema.TensorType.UINT8, tensor.name + suffix, 0
        tensor.quantization.zeroPoint = [z + 128 for z in tensor.quantization.zeroPoint]
        graph.tensors.append(tensor)
        return len(graph.tensors) - 1

    def requantize(source: int, target: int) -> schema.OperatorT:
        op = schema.OperatorT()
        op.opcodeIndex, op.inputs, op.outputs = opcode, [source], [target]
        return op

    moved = {index: uint8_twin(index, b"_uint8") for index in [*graph.inputs, *graph.outputs]}
    graph.operators = ([requantize(moved[i], i) for i in graph.inputs] + graph.operators
                       + [requantize(o, moved[o]) for o in graph.outputs])
    graph.inputs, graph.outputs = [moved[i] for i in graph.inputs], [moved[o] for o in graph.outputs]
    for signature in model.signatureDefs or []:
        for entry in [*signature.inputs, *signature.outputs]:
            entry.tensorIndex = moved.get(entry.tensorIndex, entry.tensorIndex)
    builder = flatbuffers.Builder(0)
    builder.Finish(model.Pack(builder), b"TFL3")
    return bytes(builder.Output())


def report_float_ops(flatbuffer: bytes) -> None:
    """Name on the ``ssd`` logger the ops of a converted INT8 graph left in float (a warning), or say none is."""
    left = float_ops(flatbuffer)
    if left:
        LOGGER.warning("INT8: %d ops are left in float (an integer-only accelerator runs them on the CPU): %s",
                       len(left), ", ".join(left))
    else:
        LOGGER.info("INT8: every op of the graph is integer, its input and outputs included")

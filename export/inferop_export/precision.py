"""Reduced precision at export, behind an accuracy gate.

int8 is ONNX Runtime's static quantization: QDQ format (QuantizeLinear/DequantizeLinear pairs that ONNX Runtime
fuses into int8 kernels), int8 weights per output channel, uint8 activations with ranges calibrated on inputs the
source generates. Before quantizing, average pools become the depthwise convolutions they equal
(`average_pools_as_depthwise_convs`). The quantized model is then run beside the fp32 one on held-out inputs
(another seed): a model that does not keep fp32's answers as its gate says is not written.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import onnx

from inferop.agreement import Comparison, Gate, GateResult
from inferop.errors import InferopError
from inferop_export.signature import Signature

if TYPE_CHECKING:  # the sources import torch; `inferop export --help` needs only PRECISIONS
    from inferop_export.sources import Inputs, OnnxFile, TorchModule

    Source = TorchModule | OnnxFile

# bf16 is not offered: ONNX Runtime refuses a Conv on bfloat16 tensors at load (README, "Reduced precision");
# fp16 is for GPUs.
PRECISIONS = ("fp32", "int8")
CALIBRATION_SAMPLES = 64
GATE_SAMPLES = 1000
GATE_BATCH = 50


class PrecisionError(InferopError, ValueError):
    """A precision cannot be given to this model (unknown, no gate, calibration inputs of the wrong shape)."""


class GateFailed(InferopError, RuntimeError):
    """The reduced-precision model lost too much of fp32's answers; the message has the numbers."""


def check_precision(precision: str, gate: Gate | None, name: str) -> None:
    """Refuse what cannot be exported before any work is done."""
    if precision not in PRECISIONS:
        raise PrecisionError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision != "fp32" and gate is None:
        raise PrecisionError(
            f"--precision {precision}: {name} has no accuracy gate (built-in networks have one); export it as fp32"
        )


def _samples(source: Source, signature: Signature, count: int, batch: int, seed: int) -> Iterator[Inputs]:
    rng = np.random.default_rng(seed)
    for start in range(0, count, batch):
        yield source.inputs_for(signature, min(batch, count - start), rng)


def _check_shapes(inputs: Inputs, signature: Signature, batch: int) -> None:
    for spec, array in zip(signature.inputs, inputs, strict=True):
        want = signature.shape(spec, batch)
        if list(array.shape) != want:
            raise PrecisionError(
                f"calibration input {spec.name!r} has shape {list(array.shape)}; the model takes {want}"
            )


class CalibrationInputs:
    """ONNX Runtime's CalibrationDataReader over generated inputs, one sample at a time."""

    def __init__(self, source: Source, signature: Signature, count: int, seed: int) -> None:
        self.signature = signature
        self.batches = _samples(source, signature, count, 1, seed)

    def get_next(self) -> dict[str, np.ndarray] | None:
        inputs = next(self.batches, None)
        if inputs is None:
            return None
        _check_shapes(inputs, self.signature, 1)
        return {spec.name: array for spec, array in zip(self.signature.inputs, inputs, strict=True)}


def average_pools_as_depthwise_convs(model: onnx.ModelProto) -> int:
    """Rewrite in place each AveragePool that a depthwise Conv computes exactly; return how many.

    ONNX Runtime's int8 average pool (QLinearAveragePool) is a slow kernel: in Inception V3 at batch 8 its 9
    pools took 35% of the int8 time (71 of 200 ms) against 55% for all 94 convolutions. A depthwise int8 Conv
    runs on the vectorised convolution kernels, and loses nothing: a window's average, zero padding counted,
    is a convolution with weights 1/(kh*kw), which per-channel int8 holds exactly (127 at scale 1/(127*kh*kw)).
    Pools that exclude padding from the count, round up, or whose channels are unknown are left as they are.
    """
    model.CopyFrom(onnx.shape_inference.infer_shapes(model))
    graph = model.graph
    shapes = {v.name: v.type.tensor_type.shape for v in [*graph.input, *graph.value_info]}
    nodes, rewritten = [], 0
    for node in graph.node:
        channels = _depthwise_channels(node, shapes) if node.op_type == "AveragePool" else None
        if channels is None:
            nodes.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        kernel = list(attrs["kernel_shape"])
        weights = onnx.numpy_helper.from_array(
            np.full((channels, 1, *kernel), 1 / (kernel[0] * kernel[1]), dtype=np.float32), f"{node.output[0]}.box"
        )
        graph.initializer.append(weights)
        conv = onnx.helper.make_node(
            "Conv",
            [node.input[0], weights.name],
            list(node.output),
            name=node.name,
            group=channels,
            kernel_shape=kernel,
            pads=list(attrs.get("pads", [0, 0, 0, 0])),
            strides=list(attrs.get("strides", [1, 1])),
        )
        nodes.append(conv)
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def _depthwise_channels(pool: onnx.NodeProto, shapes: dict[str, onnx.TensorShapeProto]) -> int | None:
    """The channel count of a 2-D AveragePool that a depthwise Conv computes exactly, else None."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in pool.attribute}
    shape = shapes.get(pool.input[0])
    exact = (
        shape is not None
        and len(shape.dim) == 4
        and shape.dim[1].HasField("dim_value")
        and len(attrs.get("kernel_shape", [])) == 2
        and attrs.get("auto_pad", b"NOTSET") == b"NOTSET"
        and not attrs.get("ceil_mode", 0)
        and (attrs.get("count_include_pad", 0) or not any(attrs.get("pads", [])))
        and all(d == 1 for d in attrs.get("dilations", [1, 1]))
    )
    return int(shape.dim[1].dim_value) if exact and shape is not None else None


def quantize_int8(
    fp32: Path, target: Path, source: Source, signature: Signature, seed: int, pools_as_convs: bool = True
) -> None:
    """`target`: `fp32` statically quantized to int8 (QDQ, per-channel weights), calibrated on
    CALIBRATION_SAMPLES generated inputs; average pools rewritten as depthwise convolutions first, unless
    `pools_as_convs` is False (to measure what the rewrite is worth)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationInputs, CalibrationDataReader):
        pass

    with tempfile.TemporaryDirectory(prefix="inferop-quantize-") as work:
        prepared = Path(work) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        model = onnx.load(str(prepared))
        if pools_as_convs and average_pools_as_depthwise_convs(model):
            onnx.save_model(model, str(prepared))
        quantize_static(
            str(prepared),
            str(target),
            Reader(source, signature, CALIBRATION_SAMPLES, seed),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QUInt8,
            weight_type=QuantType.QInt8,
        )


def run_gate(
    precision: str, fp32: Path, reduced: Path, source: Source, signature: Signature, gate: Gate, seed: int
) -> GateResult:
    """Both models on GATE_SAMPLES held-out inputs (a seed calibration never saw)."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in (fp32, reduced)]
    names = [t.name for t in signature.outputs]
    comparison = Comparison(gate)
    for inputs in _samples(source, signature, GATE_SAMPLES, GATE_BATCH, seed):
        feeds = {spec.name: array for spec, array in zip(signature.inputs, inputs, strict=True)}
        want, got = ({n: o for n, o in zip(names, s.run(names, feeds), strict=True)} for s in sessions)
        comparison.add(want, got, len(inputs[0]))
    return comparison.result(precision)

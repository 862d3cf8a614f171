"""A model's cost read off its exported ONNX graph: what the memory-fit check and the benchmark build on.

Everything is derived from the file that will be served, not from the PyTorch module, so the numbers
describe what Triton loads. Shapes come from ONNX shape inference with the batch axis pinned to 1.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import onnx
from onnx import helper, shape_inference


@dataclass(frozen=True)
class ModelProfile:
    parameters: int
    macs_per_sample: int
    weight_bytes: int
    activation_bytes_per_sample: int
    samples_per_cpu_second: float | None = None  # measured capacity; None until measured
    io_bytes_per_sample: int | None = None  # measured inputs + outputs; None: the tensors' dims decide

    def as_spec(self) -> dict[str, int | float]:
        """The camelCase form an InferenceService's `model.profile` takes."""
        spec: dict[str, int | float] = {
            "parameters": self.parameters,
            "macsPerSample": self.macs_per_sample,
            "weightBytes": self.weight_bytes,
            "activationBytesPerSample": self.activation_bytes_per_sample,
        }
        if self.samples_per_cpu_second is not None:
            spec["samplesPerCpuSecond"] = self.samples_per_cpu_second
        if self.io_bytes_per_sample is not None:
            spec["ioBytesPerSample"] = self.io_bytes_per_sample
        return spec

    def as_dict(self) -> dict[str, int | float | None]:
        return asdict(self)


def profile_onnx(
    model: onnx.ModelProto, parameters: int | None = None, input_shapes: dict[str, list[int]] | None = None
) -> ModelProfile:
    """Profile `model` for one sample. `parameters` is the trainable count from the framework when known; the
    graph alone cannot tell trainable weights from buffers (BatchNorm statistics), so it otherwise counts
    initializers. `input_shapes` fixes the inputs' dims (at batch 1) where the file leaves them open.
    """
    graph = _shapes_at_batch_one(model, input_shapes or {}).graph
    initializers = {init.name: init for init in graph.initializer}
    shapes = _known_shapes(graph)
    weight_bytes = sum(_tensor_bytes(init) for init in initializers.values())
    macs = sum(_node_macs(node, shapes) for node in graph.node)
    return ModelProfile(
        parameters=parameters if parameters is not None else sum(_numel(i.dims) for i in initializers.values()),
        macs_per_sample=macs,
        weight_bytes=weight_bytes,
        activation_bytes_per_sample=peak_live_activation_bytes(graph, shapes, set(initializers)),
    )


def tensor_sizes(
    model: onnx.ModelProto, input_shapes: dict[str, list[int]] | None = None
) -> tuple[dict[str, int], int]:
    """Bytes of each tensor of `model` whose shape is known, for one sample, and its peak live activation bytes
    (inputs as in `profile_onnx`)."""
    graph = _shapes_at_batch_one(model, input_shapes or {}).graph
    shapes = _known_shapes(graph)
    sizes = {name: _numel(dims) * _elem_bytes(elem_type) for name, (elem_type, dims) in shapes.items()}
    return sizes, peak_live_activation_bytes(graph, shapes, {init.name for init in graph.initializer})


def conv_macs(output_shape: list[int], kernel_shape: list[int]) -> int:
    """Multiply-accumulates of a convolution: each output element sums over its kernel, whose shape
    [C_out, C_in / group, k...] already accounts for grouping."""
    return math.prod(output_shape) * math.prod(kernel_shape[1:])


def matmul_macs(a_shape: list[int], b_shape: list[int]) -> int:
    """Multiply-accumulates of A @ B with numpy broadcasting: every output element sums over K."""
    a = [1, *a_shape] if len(a_shape) == 1 else a_shape
    b = [*b_shape, 1] if len(b_shape) == 1 else b_shape
    batch = math.prod(max(x, y) for x, y in zip(_pad(a[:-2], b[:-2]), _pad(b[:-2], a[:-2]), strict=True))
    return batch * a[-2] * a[-1] * b[-1]


def peak_live_activation_bytes(
    graph: onnx.GraphProto, shapes: dict[str, tuple[int, list[int]]], weights: set[str]
) -> int:
    """Largest total size of intermediate tensors alive at once when nodes run in graph order.

    A tensor is alive from the node that produces it until its last consumer has run (graph outputs until the
    end); inputs count from the start. This is what a memory-planning runtime such as ONNX Runtime must hold
    per sample at minimum, and a good estimate of what it does hold.
    """
    last_use: dict[str, int] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            last_use[name] = index
    end = len(graph.node)
    for output in graph.output:
        last_use[output.name] = end

    def size(name: str) -> int:
        elem_type, dims = shapes.get(name, (0, []))
        return _numel(dims) * _elem_bytes(elem_type) if elem_type else 0

    live = {i.name for i in graph.input if i.name not in weights}
    current = sum(size(n) for n in live)
    peak = current
    for index, node in enumerate(graph.node):
        produced = [n for n in node.output if n]
        current += sum(size(n) for n in produced)
        live.update(produced)
        peak = max(peak, current)
        for name in [n for n in live if last_use.get(n, -1) <= index]:
            live.discard(name)
            current -= size(name)
    return peak


def _shapes_at_batch_one(model: onnx.ModelProto, input_shapes: dict[str, list[int]]) -> onnx.ModelProto:
    """A copy whose inputs have `input_shapes` (other open dims, the batch axis among them, become 1) and whose
    outputs' open first dim is 1, with shapes inferred throughout; an output dim whose size varies stays open."""
    pinned = onnx.ModelProto()
    pinned.CopyFrom(model)
    for value in pinned.graph.input:
        given = input_shapes.get(value.name)
        for index, dim in enumerate(value.type.tensor_type.shape.dim):
            if given is not None and index < len(given):
                dim.dim_value = given[index]
            elif not dim.HasField("dim_value"):
                dim.dim_value = 1
    for value in pinned.graph.output:
        dims = value.type.tensor_type.shape.dim
        if dims and not dims[0].HasField("dim_value"):
            dims[0].dim_value = 1
    del pinned.graph.value_info[:]
    return shape_inference.infer_shapes(pinned, data_prop=True)


def _known_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, list[int]]]:
    shapes: dict[str, tuple[int, list[int]]] = {}
    for value in (*graph.input, *graph.value_info, *graph.output):
        tensor = value.type.tensor_type
        if tensor.HasField("shape") and all(d.HasField("dim_value") for d in tensor.shape.dim):
            shapes[value.name] = (tensor.elem_type, [d.dim_value for d in tensor.shape.dim])
    for init in graph.initializer:
        shapes[init.name] = (init.data_type, list(init.dims))
    return shapes


def _node_macs(node: onnx.NodeProto, shapes: dict[str, tuple[int, list[int]]]) -> int:
    def shape(name: str) -> list[int] | None:
        known = shapes.get(name)
        return known[1] if known else None

    if node.op_type == "Conv":
        out, kernel = shape(node.output[0]), shape(node.input[1])
        if out is None or kernel is None:
            return 0  # a shape that depends on the data (after NonZero, say): not counted
        return conv_macs(out, kernel)
    if node.op_type in ("MatMul", "Gemm"):
        a, b = shape(node.input[0]), shape(node.input[1])
        if a is None or b is None:
            return 0
        attributes = {attr.name: helper.get_attribute_value(attr) for attr in node.attribute}
        if node.op_type == "Gemm":
            a = a[::-1] if attributes.get("transA") else a
            b = b[::-1] if attributes.get("transB") else b
        return matmul_macs(a, b)
    return 0


def _pad(dims: list[int], other: list[int]) -> list[int]:
    return [1] * (len(other) - len(dims)) + dims if len(dims) < len(other) else dims


def _numel(dims: list[int] | tuple[int, ...]) -> int:
    return math.prod(int(d) for d in dims)


def _elem_bytes(elem_type: int) -> int:
    return int(helper.tensor_dtype_to_np_dtype(elem_type).itemsize)


def _tensor_bytes(tensor: onnx.TensorProto) -> int:
    return _numel(tensor.dims) * _elem_bytes(tensor.data_type)

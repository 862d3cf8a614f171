"""A model's tensors as Triton will serve them, read from the ONNX file, so a user never types them.

The batch axis is the first dim of every input when all of them leave it open; a model whose inputs all
fix it has none (Triton's max_batch_size 0, full shapes in the config). Every other input dim must be fixed,
by the file or by an `--input name=dims` override; an output may keep a dynamic dim (-1 in the config).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from inferop_core.errors import InferopError
from inferop_core.tritonconfig import DYNAMIC_DIM, TENSOR_NAME_PATTERN, Datatype, TensorSpec

# ONNX element types Triton serves, by Triton's name (TensorProto.FLOAT -> "FP32", ...).
ONNX_DATATYPES: dict[int, Datatype] = {
    onnx.TensorProto.FLOAT: "FP32",
    onnx.TensorProto.FLOAT16: "FP16",
    onnx.TensorProto.DOUBLE: "FP64",
    onnx.TensorProto.INT64: "INT64",
    onnx.TensorProto.INT32: "INT32",
    onnx.TensorProto.INT8: "INT8",
    onnx.TensorProto.UINT8: "UINT8",
    onnx.TensorProto.BOOL: "BOOL",
}
NUMPY_DTYPES: dict[str, type[np.generic]] = {
    "FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
    "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
INPUT_FLAG = re.compile(r"^(?P<name>[^=]+)=(?P<dims>\d+(?:[,x]\d+)*)(?::(?P<datatype>[A-Za-z0-9]+))?$")


class SignatureError(InferopError, ValueError):
    """The model's tensors cannot be served as they are; the message names the tensor and why."""


@dataclass(frozen=True)
class InputFlag:
    """One `--input name=dims[:dtype]`: dims without the batch axis (the full shape for an unbatched model)."""

    name: str
    dims: tuple[int, ...]
    datatype: Datatype | None


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batched: bool  # the first dim of every input is an open batch axis
    notes: tuple[str, ...] = ()

    def shape(self, tensor: TensorSpec, batch: int) -> list[int]:
        """The tensor's full shape for `batch` samples (an unbatched model's shape is its dims)."""
        return [batch, *tensor.dims] if self.batched else list(tensor.dims)

    def input_shapes(self, batch: int) -> dict[str, list[int]]:
        """Every input's full shape for `batch` samples, by name."""
        return {tensor.name: self.shape(tensor, batch) for tensor in self.inputs}


def parse_input_flag(text: str) -> InputFlag:
    """`board=1,8,7` or `ids=16:INT64` (dims also as 1x8x7); errors quote the flag."""
    match = INPUT_FLAG.match(text.strip())
    if match is None:
        raise SignatureError(f"--input {text!r}: expected name=dims[:dtype], e.g. images=3,224,224 or ids=16:INT64")
    datatype = (match["datatype"] or "").upper() or None
    if datatype is not None and datatype not in NUMPY_DTYPES:
        raise SignatureError(f"--input {text!r}: dtype {datatype} is not one of {', '.join(NUMPY_DTYPES)}")
    dims = tuple(int(d) for d in re.split("[,x]", match["dims"]))
    if 0 in dims:
        raise SignatureError(f"--input {text!r}: a dim of 0 holds nothing")
    return InputFlag(match["name"], dims, datatype)  # type: ignore[arg-type]  # checked against NUMPY_DTYPES


def read_signature(model: onnx.ModelProto, overrides: dict[str, InputFlag] | None = None) -> Signature:
    """Inputs (without initializers) and outputs of `model`; refuse what Triton or a fixed shape cannot serve."""
    overrides = dict(overrides or {})
    graph = model.graph
    weights = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in weights]
    unknown = sorted(set(overrides) - {value.name for value in inputs})
    if unknown:
        raise SignatureError(f"--input {unknown}: no such input; the model's inputs are {[v.name for v in inputs]}")
    if not inputs:
        raise SignatureError("the model has no inputs")
    shapes = {value.name: _dims(value) for value in (*inputs, *graph.output)}
    open_batch = {value.name: bool(shapes[value.name]) and shapes[value.name][0] is None for value in inputs}
    batched = all(open_batch.values())
    if any(open_batch.values()) and not batched:
        fixed = [name for name, is_open in open_batch.items() if not is_open]
        raise SignatureError(
            f"inputs {fixed} fix their first dim while others leave it open: a batch axis must be open in every "
            "input (re-export with a dynamic first dim), or fixed in every one"
        )
    notes: list[str] = []
    if not batched:
        notes.append(
            "every input fixes its first dim, so the model has no batch axis: it is served with max_batch_size 0, "
            "each request runs alone and the dynamic batcher only queues; export it with a dynamic first dim "
            "to batch requests"
        )
    served_inputs = tuple(_input(value, shapes[value.name], batched, overrides.get(value.name)) for value in inputs)
    served_outputs = tuple(_output(value, shapes[value.name], batched) for value in graph.output)
    return Signature(served_inputs, served_outputs, batched, tuple(notes))


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    """The dims of a graph input or output, None where the file leaves one open (a name, or nothing)."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise SignatureError(f"tensor {value.name!r}: only tensors can be served (it is a sequence or a map)")
    if not tensor.HasField("shape"):
        raise SignatureError(f"tensor {value.name!r}: the file gives it no shape, not even its rank")
    return [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else None for d in tensor.shape.dim]


def _named(value: onnx.ValueInfoProto) -> str:
    if not re.fullmatch(TENSOR_NAME_PATTERN, value.name):
        raise SignatureError(
            f"tensor {value.name!r}: not a name Triton's config can carry (letters, digits, '_', '.', ':', '/', '-', "
            "not starting with a digit); rename it when exporting the model"
        )
    return value.name


def _datatype(value: onnx.ValueInfoProto) -> Datatype:
    elem = value.type.tensor_type.elem_type
    if elem not in ONNX_DATATYPES:
        name = helper.tensor_dtype_to_string(elem) if elem else "undefined"
        raise SignatureError(
            f"tensor {value.name!r}: element type {name} is not served here (one of {', '.join(NUMPY_DTYPES)})"
        )
    return ONNX_DATATYPES[elem]


def _input(value: onnx.ValueInfoProto, dims: list[int | None], batched: bool, flag: InputFlag | None) -> TensorSpec:
    _named(value)
    served = dims[1:] if batched else dims
    where = "besides the batch axis " if batched else ""
    if not served:
        raise SignatureError(
            f"input {value.name!r} has no dim {where}(shape {_show(dims)}): Triton needs at least one; reshape "
            "it in the model to [batch, 1]"
        )
    datatype = _datatype(value)
    if flag is not None:
        if len(flag.dims) != len(served):
            raise SignatureError(
                f"--input {value.name}: {len(flag.dims)} dims given, the model's input has {len(served)} {where}"
                f"(shape {_show(dims)})"
            )
        clashes = [
            i for i, (ours, theirs) in enumerate(zip(served, flag.dims, strict=True)) if ours not in (None, theirs)
        ]
        if clashes:
            raise SignatureError(f"--input {value.name}={_show(list(flag.dims))}: the model fixes {_show(served)}")
        if flag.datatype is not None and flag.datatype != datatype:
            raise SignatureError(f"--input {value.name}: dtype {flag.datatype} given, the model takes {datatype}")
        return TensorSpec(name=value.name, datatype=datatype, dims=flag.dims)
    if None in served:
        open_dims = [i + (1 if batched else 0) for i, d in enumerate(served) if d is None]
        raise SignatureError(
            f"input {value.name!r} has dynamic dims {open_dims} {where}(shape {_show(dims)}): warm-up and the "
            f"memory estimate need fixed ones; give them with --input {value.name}=<dims>"
        )
    return TensorSpec(name=value.name, datatype=datatype, dims=tuple(d for d in served if d is not None))


def _output(value: onnx.ValueInfoProto, dims: list[int | None], batched: bool) -> TensorSpec:
    _named(value)
    if batched and (not dims or dims[0] is not None):
        raise SignatureError(
            f"output {value.name!r} (shape {_show(dims)}) has no open first dim although the inputs batch: "
            "every output must keep the batch axis"
        )
    served = dims[1:] if batched else dims
    if not served:
        raise SignatureError(
            f"output {value.name!r} has no dim besides the batch axis (shape {_show(dims)}): Triton needs at "
            "least one; reshape it in the model to [batch, 1]"
        )
    return TensorSpec(
        name=value.name, datatype=_datatype(value), dims=tuple(DYNAMIC_DIM if d is None else d for d in served)
    )


def _show(dims: list[int | None] | tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def generated_inputs(signature: Signature, batch: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Inputs for any model: standard normal floats, integers and booleans in {0, 1} (within any vocabulary
    or embedding table), in the shapes the signature serves."""
    arrays = []
    for tensor in signature.inputs:
        shape = signature.shape(tensor, batch)
        dtype = NUMPY_DTYPES[tensor.datatype]
        if np.issubdtype(dtype, np.floating):
            arrays.append(rng.standard_normal(shape).astype(dtype))
        else:
            arrays.append(rng.integers(0, 2, size=shape).astype(dtype))
    return tuple(arrays)

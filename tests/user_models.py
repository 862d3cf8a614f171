"""Models a user brings, built here without downloads: ONNX files written with `onnx.helper`, and a module
factory for `inferop export torch`. Each stands for a case the exporter must serve or refuse."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
EXAMPLES = Path(__file__).resolve().parents[1] / "export" / "examples"


def _save(graph: onnx.GraphProto, path: Path, opset: int = OPSET) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.save_model(model, str(path))
    return path


def two_inputs_with_int64(path: Path) -> Path:
    """features FP32 [batch, 4] and ids INT64 [batch, 2] -> score FP32 [batch, 3]: the ids pick rows of a table."""
    rng = np.random.default_rng(0)
    table = numpy_helper.from_array(rng.standard_normal((5, 4)).astype(np.float32), "table")
    weight = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "weight")
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["rows"], axis=0),  # [batch, 2, 4]
        helper.make_node("ReduceSum", ["rows", "axes"], ["pooled"], keepdims=0),  # [batch, 4]
        helper.make_node("Add", ["features", "pooled"], ["mixed"]),
        helper.make_node("MatMul", ["mixed", "weight"], ["score"]),
    ]
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    graph = helper.make_graph(
        nodes,
        "two_inputs",
        [
            helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 2]),
        ],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", 3])],
        initializer=[table, weight, axes],
    )
    return _save(graph, path)


def fixed_batch_of_one(path: Path) -> Path:
    """x FP32 [1, 2, 4, 4] -> y FP32 [1, 3, 4, 4] (a 3x3 convolution): no batch axis to batch on."""
    kernel = numpy_helper.from_array(np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])],
        initializer=[kernel],
    )
    return _save(graph, path)


def dynamic_output_dim(path: Path) -> Path:
    """x FP32 [batch, 6] and k INT64 [batch, 1] -> head FP32 [batch, n]: the first min(k) + 1 columns, so the
    output's width depends on the data, not on any shape."""
    nodes = [
        helper.make_node("ReduceMin", ["k"], ["smallest"], keepdims=0),  # [] over the whole batch
        helper.make_node("Add", ["smallest", "one"], ["width"]),
        helper.make_node("Unsqueeze", ["width", "zero"], ["ends"]),
        helper.make_node("Slice", ["x", "zero", "ends", "one_axis"], ["head"]),
    ]
    constants = [
        numpy_helper.from_array(np.array(1, dtype=np.int64), "one"),
        numpy_helper.from_array(np.array([0], dtype=np.int64), "zero"),
        numpy_helper.from_array(np.array([1], dtype=np.int64), "one_axis"),
    ]
    graph = helper.make_graph(
        nodes,
        "dynamic_output",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6]),
            helper.make_tensor_value_info("k", TensorProto.INT64, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("head", TensorProto.FLOAT, ["batch", "n"])],
        initializer=constants,
    )
    return _save(graph, path)


def dynamic_input_dim(path: Path) -> Path:
    """tokens FP32 [batch, length] -> mean FP32 [batch, 1]: the length is open, so the user must fix it."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["tokens"], ["mean"], axes=[1], keepdims=1)],
        "dynamic_input",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "length"])],
        [helper.make_tensor_value_info("mean", TensorProto.FLOAT, ["batch", 1])],
    )
    return _save(graph, path)


def opset_from_the_future(path: Path) -> Path:
    """A valid graph stamped with an opset no released ONNX Runtime loads."""
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "future",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    return _save(graph, path, opset=40)


def upsampler(path: Path) -> Path:
    """image FP32 [batch, 1, 32, 32] -> features FP32 [batch, 8]: upsampled 16 times, then two convolutions of 32 and
    8 channels at 512x512 and a global average. Its weights are 10 KiB and its activations 64 MiB a sample: what an
    export holds at once grows with the samples it runs."""
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array((rng.standard_normal((32, 1, 3, 3)) * 0.5).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((8, 32, 3, 3)) * 0.1).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array([1, 1, 16, 16], np.float32), "scales"),
    ]
    nodes = [
        helper.make_node("Resize", ["image", "", "scales"], ["up"], mode="nearest"),
        helper.make_node("Conv", ["up", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["c2"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], name="conv2"),
        helper.make_node("GlobalAveragePool", ["c2"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["features"]),
    ]
    graph = helper.make_graph(
        nodes,
        "upsampler",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 1, 32, 32])],
        [helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 8])],
        weights,
    )
    return _save(graph, path)

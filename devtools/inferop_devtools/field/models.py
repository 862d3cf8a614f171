"""Models the field drills hold out from the memory model's fit, as a user brings them: shapes the fitted networks
do not have (several inputs, activations far above the weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def wide_activations(path: Path, channels: int = 64, side: int = 128) -> Path:
    """A user's ONNX file, written with onnx.helper: image FP32 [batch, 3, side, side] -> three 3x3 convolutions
    (3 -> channels -> channels -> 3, ReLU between) -> image FP32 of the same shape. Its weights are 38k
    parameters; each sample's live activations are two `channels` x side x side maps (8 MiB at the defaults),
    the opposite of Inception V3's ratio."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    shapes = {"w1": (channels, 3, 3, 3), "w2": (channels, channels, 3, 3), "w3": (3, channels, 3, 3)}
    weights = [
        numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32), name)
        for name, shape in shapes.items()
    ]
    pads = [1, 1, 1, 1]
    nodes = [
        helper.make_node("Conv", ["image", "w1"], ["a1"], pads=pads),
        helper.make_node("Relu", ["a1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2"], ["a2"], pads=pads),
        helper.make_node("Relu", ["a2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3"], ["restored"], pads=pads),
    ]
    graph = helper.make_graph(
        nodes,
        "wide_activations",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["batch", 3, side, side])],
        [helper.make_tensor_value_info("restored", TensorProto.FLOAT, ["batch", 3, side, side])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path))
    return path

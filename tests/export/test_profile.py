"""The ONNX-graph profile: multiply-accumulates, weight bytes and peak live activations, checked by hand."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from inferop_export.profile import ModelProfile, conv_macs, matmul_macs, profile_onnx


class TestConvMacs:
    @pytest.mark.parametrize(
        ("output", "kernel", "macs"),
        [
            ([1, 8, 6, 5], [8, 1, 3, 3], 8 * 30 * 1 * 9),
            ([1, 16, 10, 10], [16, 8, 3, 3], 16 * 100 * 8 * 9),
            ([1, 16, 10, 10], [16, 2, 3, 3], 16 * 100 * 2 * 9),  # groups=4: each output sees 8/4 inputs
            ([2, 4, 7], [4, 3, 5], 2 * 4 * 7 * 3 * 5),  # 1-d convolution, batch 2
            ([1, 64, 1, 1], [64, 32, 1, 1], 64 * 32),
        ],
    )
    def test_every_output_sums_over_its_kernel(self, output: list[int], kernel: list[int], macs: int) -> None:
        assert conv_macs(output, kernel) == macs


class TestMatmulMacs:
    @pytest.mark.parametrize(
        ("a", "b", "macs"),
        [
            ([2, 3], [3, 4], 2 * 3 * 4),
            ([3], [3], 3),  # vector dot product
            ([3], [3, 4], 3 * 4),
            ([2, 3], [3], 2 * 3),
            ([5, 2, 3], [3, 4], 5 * 2 * 3 * 4),  # B broadcast over A's batch
            ([5, 1, 2, 3], [4, 3, 6], 5 * 4 * 2 * 3 * 6),  # both broadcast
        ],
    )
    def test_every_output_sums_over_k(self, a: list[int], b: list[int], macs: int) -> None:
        assert matmul_macs(a, b) == macs


def analytic_profile(rows: int, cols: int, depth: int, hidden: int, moves: int) -> tuple[int, int]:
    """Multiply-accumulates and parameters of PolicyValueNet, from its definition."""
    cells, kernel = rows * cols, 9
    convolutions = [(1, hidden)] + [(hidden, hidden)] * (depth - 1) + [(hidden, 2), (hidden, 1)]
    linears = [(2 * cells, moves), (cells, 1)]
    macs = sum(cells * c_out * c_in * kernel for c_in, c_out in convolutions) + sum(i * o for i, o in linears)
    parameters = sum(c_out * c_in * kernel + c_out for c_in, c_out in convolutions) + sum(i * o + o for i, o in linears)
    return macs, parameters


SIZES = [
    {"rows": 6, "cols": 5, "depth": 2, "hidden": 8, "moves": 5},
    {"rows": 3, "cols": 4, "depth": 3, "hidden": 4, "moves": 12},
]


@pytest.fixture(scope="module", params=SIZES, ids=lambda s: "x".join(str(v) for v in s.values()))
def exported_conv_net(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net

    report = export_model(conv_net(**request.param), tmp_path_factory.mktemp("profile"), quiet=True)
    return request.param, Path(report.model_path)


class TestProfileOnnx:
    def test_macs_of_an_exported_policy_value_net(self, exported_conv_net: tuple[dict, Path]) -> None:
        sizes, path = exported_conv_net
        macs, _ = analytic_profile(**sizes)
        assert profile_onnx(onnx.load(str(path))).macs_per_sample == macs

    def test_weight_bytes_are_the_parameters_plus_the_graphs_constants(
        self, exported_conv_net: tuple[dict, Path]
    ) -> None:
        sizes, path = exported_conv_net
        _, parameters = analytic_profile(**sizes)
        model = onnx.load(str(path))
        float_weights = [i for i in model.graph.initializer if i.data_type == TensorProto.FLOAT]
        # Besides the fp32 parameters the exporter stores small int64 shape constants (the Flatten reshapes).
        constants = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type != TensorProto.FLOAT]
        assert sum(numpy_helper.to_array(i).size for i in float_weights) == parameters
        assert profile_onnx(model).weight_bytes == 4 * parameters + sum(c.nbytes for c in constants)

    def test_parameters_come_from_the_framework_when_given(self, exported_conv_net: tuple[dict, Path]) -> None:
        _, path = exported_conv_net
        assert profile_onnx(onnx.load(str(path)), parameters=123).parameters == 123

    def test_peak_live_activations_of_a_hand_built_graph(self) -> None:
        # x[N,8] -> a = Relu(x) -> b = Add(x, a) -> c = MatMul(b, W[8,2]) -> d = Cast<f64>(c) -> y = Relu(d)
        # Bytes per sample (fp32 = 4, double = 8): x 32, a 32, b 32, c 8, d 16, y 16.
        # Live after each node, in order: Relu x+a = 64; Add x+a+b = 96, then x and a die: 32;
        # MatMul b+c = 40, then b dies: 8; Cast c+d = 24, then c dies: 16; Relu d+y = 32. Peak: 96.
        # W (an initializer) is weight, not activation.
        weight = helper.make_tensor("W", TensorProto.FLOAT, [8, 2], [0.5] * 16)
        graph = helper.make_graph(
            [
                helper.make_node("Relu", ["x"], ["a"]),
                helper.make_node("Add", ["x", "a"], ["b"]),
                helper.make_node("MatMul", ["b", "W"], ["c"]),
                helper.make_node("Cast", ["c"], ["d"], to=TensorProto.DOUBLE),
                helper.make_node("Relu", ["d"], ["y"]),
            ],
            "tiny",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])],
            [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["N", 2])],
            initializer=[weight],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(model, full_check=True)
        assert profile_onnx(model) == ModelProfile(
            parameters=16, macs_per_sample=8 * 2, weight_bytes=16 * 4, activation_bytes_per_sample=96
        )

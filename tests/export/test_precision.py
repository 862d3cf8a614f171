"""Reduced precision at export: int8 by ONNX Runtime's static quantization behind an accuracy gate, on the tiny
conv net (real export, real quantization, real ONNX Runtime)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest

from inferop_core.agreement import Gate, GateResult
from inferop_core.cpu import cpu_int8_instructions, int8_verdict
from inferop_core.tritonconfig import TensorSpec
from inferop_export.exporter import VerificationError, export_model
from inferop_export.networks.conv_net import conv_net
from inferop_export.precision import (
    GATE_SAMPLES,
    MIN_COSINE,
    PRECISIONS,
    SENSITIVITY_SAMPLES,
    CalibrationInputs,
    GeneratedSamples,
    PrecisionError,
    average_pools_as_depthwise_convs,
    check_precision,
    noise_powers,
    noise_runs,
    prepared_for_int8,
    quantize_prepared,
    stated_gate,
)
from inferop_export.signature import Signature, read_signature
from inferop_export.sources import Inputs, OnnxFile
from tests.helpers import TINY

# A gate any int8 rendering of the tiny net passes, to follow a passing export to the end.
LENIENT = Gate(top1=("policy",), min_agreement=0.5, max_abs_diff={"value": 100.0})


def test_an_unknown_precision_names_the_choices() -> None:
    with pytest.raises(PrecisionError, match=r"--precision 'bf16': choose one of fp32, int8"):
        check_precision("bf16", LENIENT, "conv_net")


def test_a_model_of_the_user_s_own_needs_the_user_s_samples_for_int8(tmp_path: Path) -> None:
    source = OnnxFile("mine", tmp_path / "mine.onnx")
    check_precision("fp32", source.gate, source.name)
    with pytest.raises(PrecisionError, match="mine is calibrated and gated on your own samples: give --calibration"):
        export_model(source, tmp_path / "repo", quiet=True, precision="int8")
    assert not (tmp_path / "repo").exists()


def test_calibration_inputs_of_the_wrong_shape_name_both_shapes() -> None:
    signature = Signature((TensorSpec(name="board", dims=(1, 6, 5)),), (), batched=True)
    source = dataclasses.replace(conv_net(**TINY), make_input=lambda batch, rng: (np.zeros((batch, 1, 5, 6)),))
    with pytest.raises(PrecisionError, match=r"'board' has shape \[1, 1, 5, 6\]; the model takes \[1, 1, 6, 5\]"):
        CalibrationInputs(GeneratedSamples(source, signature, samples=4, seed=0), signature).get_next()


class TestStatedGate:
    OUTPUTS = (TensorSpec(name="logits", dims=(10,)), TensorSpec(name="embedding", dims=(16,)))

    def test_a_built_in_network_keeps_its_gate_and_a_flag_changes_one_setting(self) -> None:
        base = conv_net(**TINY).gate
        assert base is not None
        outputs = (TensorSpec(name="policy", dims=(5,)), TensorSpec(name="value", dims=(1,)))
        assert stated_gate(base, None, outputs, labelled=False, stated=()) == base
        assert stated_gate(base, None, outputs, False, ["agreement=0.95"]).min_agreement == 0.95

    def test_a_user_s_outputs_get_the_gate_of_their_kind(self) -> None:
        plain = stated_gate(None, None, self.OUTPUTS, labelled=False, stated=())
        assert plain == Gate(top1=(), min_cosine={"logits": MIN_COSINE, "embedding": MIN_COSINE})
        labelled = stated_gate(None, None, self.OUTPUTS, labelled=True, stated=())
        assert labelled.top1 == ("logits",) and set(labelled.min_cosine) == {"embedding"}
        stated = stated_gate(None, None, self.OUTPUTS, False, ["top1=embedding", "max-abs=0.5", "accuracy-drop=0"])
        assert stated == Gate(top1=("embedding",), max_abs_diff={"logits": 0.5}, max_accuracy_drop=0.0)

    def test_an_output_the_model_lacks_is_named(self) -> None:
        with pytest.raises(PrecisionError, match=r"--gate top1=scores: no output 'scores'; the outputs are \['logits'"):
            stated_gate(None, None, self.OUTPUTS, False, ["top1=scores"])


def test_a_gate_lists_every_shortfall_with_its_numbers() -> None:
    gate = Gate(top1=("policy",), max_abs_diff={"value": 0.02})
    result = GateResult("int8", 1000, {"policy": 0.954}, {"value": 0.2347}, gate)
    assert not result.passed
    assert result.failures == ["policy: top-1 agreement 95.4% < 99%", "value: max |diff| 0.2347 >= 0.02"]
    assert GateResult("int8", 1000, {"policy": 0.995}, {"value": 0.01}, gate).passed


def test_int8_that_keeps_the_gate_is_served_smaller_with_its_agreement(tmp_path: Path) -> None:
    fp32 = export_model(conv_net(**TINY), tmp_path / "fp32", quiet=True)
    report = export_model(
        dataclasses.replace(conv_net(**TINY), gate=LENIENT), tmp_path / "int8", quiet=True, precision="int8"
    )
    model = onnx.load(report.model_path)
    assert {"QuantizeLinear", "DequantizeLinear"} <= {node.op_type for node in model.graph.node}
    assert {t.data_type for t in model.graph.initializer} >= {onnx.TensorProto.INT8}
    assert report.profile.weight_bytes < fp32.profile.weight_bytes / 2
    assert report.profile.macs_per_sample == fp32.profile.macs_per_sample
    assert report.precision == "int8" and report.gate is not None and report.gate.samples == GATE_SAMPLES
    assert set(report.gate.agreement) == {"policy"} and 0.5 <= report.gate.agreement["policy"] <= 1
    # Served as fp32 was: the same tensors in and out, quantized inside.
    assert report.serving.inputs == fp32.serving.inputs and report.serving.outputs == fp32.serving.outputs
    assert Path(report.config_path).is_file()
    # Both measured here, and said against this CPU's int8 instructions.
    assert report.speedup is not None and report.speedup > 0 and fp32.speedup is None
    assert report.speed_verdict is not None and f"{report.speedup:.2f}x fp32" in report.speed_verdict
    assert ", ".join(cpu_int8_instructions()) in report.speed_verdict


class TestSpeedVerdict:
    def test_int8_that_runs_faster_than_fp32_by_enough_pays(self) -> None:
        assert int8_verdict(2.9, ["avx512_vnni"]).startswith("int8 pays on this CPU: 2.90x fp32")

    @pytest.mark.parametrize("instructions", [[], ["avx512_vnni"]])
    def test_int8_at_fp32_s_speed_does_not_pay_and_says_where_it_would(self, instructions: list[str]) -> None:
        verdict = int8_verdict(1.02, instructions)
        assert verdict.startswith("int8 does not pay on this CPU: 1.02x fp32")
        assert "serve fp32 here, or int8 on nodes whose CPUs have AVX-512 VNNI" in verdict
        assert ("none of AVX-512 VNNI" in verdict) == (not instructions)

    def test_the_kernel_s_flags_are_read(self, tmp_path: Path) -> None:
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f avx512_vnni\n\nflags : fpu amx_int8\n")
        assert cpu_int8_instructions(cpuinfo) == ["avx512_vnni", "amx_int8"]
        cpuinfo.write_text("flags : fpu sse2 avx2\n")
        assert cpu_int8_instructions(cpuinfo) == []


def test_int8_that_fails_the_gate_is_not_written_and_the_command_says_why(tmp_path: Path) -> None:
    strict = dataclasses.replace(conv_net(**TINY), gate=Gate(top1=("policy",), min_agreement=1.01))
    with pytest.raises(VerificationError, match=r"int8 fails its accuracy gate \(policy: top-1 agreement .*% < 101%\)"):
        export_model(strict, tmp_path / "repo", quiet=True, precision="int8")
    assert not (tmp_path / "repo" / "conv_net" / "1").exists()


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_command_reports_the_precision(precision: str, tmp_path: Path) -> None:
    sizes = [f"--{name}={value}" for name, value in TINY.items()]
    argv = [sys.executable, "-m", "inferop_core.cli", "export", "conv_net", *sizes, "--repo", str(tmp_path), "--json"]
    result = subprocess.run([*argv, "--precision", precision], capture_output=True, text=True, check=False)
    if precision == "fp32":
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["precision"] == "fp32"
    else:  # the network's real gate, which its random weights' near ties fail: the numbers say by how much
        assert result.returncode == 1, result.stdout + result.stderr
        assert "int8 fails its accuracy gate (policy: top-1 agreement" in result.stderr
        assert "on 1000 held-out inputs" in result.stderr
        assert not (tmp_path / "conv_net" / "1").exists()


def _pooling_model(path: Path) -> Path:
    """x -> Conv 3x3 (8) -> Relu -> AveragePool 3x3 (padding counted) -> Conv 1x1 (4) -> GlobalAveragePool
    -> logits, with seeded weights: the pattern of Inception V3's pool branches."""
    rng = np.random.default_rng(0)
    weights = [
        onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * scale, name)
        for name, shape, scale in (("w1", (8, 3, 3, 3), 0.3), ("w2", (4, 8, 1, 1), 0.5), ("shape", (2,), 0))
    ]
    weights[-1] = onnx.numpy_helper.from_array(np.array([-1, 4], dtype=np.int64), "shape")
    make = onnx.helper.make_node
    nodes = [
        make("Conv", ["x", "w1"], ["c1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        make("Relu", ["c1"], ["r1"]),
        make("AveragePool", ["r1"], ["p1"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
        make("Conv", ["p1", "w2"], ["c2"], kernel_shape=[1, 1]),
        make("GlobalAveragePool", ["c2"], ["g"]),
        make("Reshape", ["g", "shape"], ["logits"]),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "pooling",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 3, 16, 16])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["N", 4])],
        weights,
    )
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10), path)
    return path


def test_average_pools_become_the_depthwise_convs_they_equal() -> None:
    import onnxruntime as ort

    make = onnx.helper.make_node
    pools = {  # output -> (attributes, rewritten?)
        "padded": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, True),
        "strided": ({"kernel_shape": [2, 2], "strides": [2, 2]}, True),
        "padding_not_counted": ({"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, False),
        "rounded_up": ({"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, False),
    }
    graph = onnx.helper.make_graph(
        [make("AveragePool", ["x"], [name], name=name, **attrs) for name, (attrs, _) in pools.items()],
        "pools",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 5, 9, 9])],
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in pools],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)
    x = np.random.default_rng(1).standard_normal((2, 5, 9, 9)).astype(np.float32)
    before = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})

    assert average_pools_as_depthwise_convs(model) == 2
    onnx.checker.check_model(model)
    kinds = {
        node.output[0]: (node.op_type, {a.name: a.i for a in node.attribute if a.name == "group"})
        for node in model.graph.node
    }
    for name, (_, rewritten) in pools.items():
        assert kinds[name] == (("Conv", {"group": 5}) if rewritten else ("AveragePool", {})), name
    after = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for name, want, got in zip(pools, before, after, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-6, err_msg=name)


def test_int8_pools_on_the_int8_convolution_kernels(tmp_path: Path) -> None:
    import onnxruntime as ort

    source = OnnxFile("pooling", _pooling_model(tmp_path / "pooling.onnx"), gate=Gate(top1=("logits",)))
    report = export_model(source, tmp_path / "repo", quiet=True, precision="int8")
    assert report.gate is not None and report.gate.passed, report.gate
    model = onnx.load(report.model_path)
    assert "AveragePool" not in {node.op_type for node in model.graph.node}

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(report.model_path, options, providers=["CPUExecutionProvider"])
    kernels = [node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert kernels.count("QLinearConv") == 3 and "QLinearAveragePool" not in kernels, kernels


SIZES = {"a": 10, "b": 10, "c": 30}  # bytes a sample of each tensor
PAIRS = [("a", "a_dq"), ("b", "b"), ("c", "c_dq")]  # (fp32 tensor, int8 tensor)


class TestNoiseRuns:
    """The fallback's noise measure asks for at most a budget of tensors per run: a few pairs and samples at once."""

    def test_pairs_are_grouped_within_the_budget_and_a_large_one_runs_alone(self) -> None:
        # a and b: 20 bytes a side; c: 30 a side, over the 40 left.
        assert noise_runs(PAIRS, SIZES, activation=0, budget=40) == [(PAIRS[:2], 1), (PAIRS[2:], 1)]

    def test_a_run_takes_as_many_samples_as_the_budget_holds(self) -> None:
        assert noise_runs(PAIRS, SIZES, activation=0, budget=400) == [(PAIRS, 4)]
        assert noise_runs(PAIRS, SIZES, activation=0, budget=10**9) == [(PAIRS, SENSITIVITY_SAMPLES)]

    def test_what_the_model_computes_beside_the_tensors_counts_in_each_sample(self) -> None:
        # a and b with 20 bytes of activations beside: 60 a sample, one sample a run.
        assert noise_runs(PAIRS, SIZES, activation=20, budget=60) == [(PAIRS[:2], 1), (PAIRS[2:], 1)]
        assert noise_runs(PAIRS, SIZES, activation=20, budget=240) == [(PAIRS, 2)]

    def test_an_int8_tensor_read_twice_is_held_once_and_a_tensor_of_unknown_size_alone(self) -> None:
        pairs = [("a", "a_dq"), ("b", "a_dq"), ("d", "d")]
        assert noise_runs(pairs, SIZES, activation=0, budget=30) == [(pairs[:2], 1), (pairs[2:], 1)]


class RecordedSamples:
    """Generated samples that record the batch each run asked for."""

    def __init__(self, samples: GeneratedSamples) -> None:
        self.inner, self.asked = samples, list[int]()

    @property
    def origin(self) -> str:
        return self.inner.origin

    @property
    def samples(self) -> int:
        return self.inner.samples

    def batches(self, batch: int) -> Iterator[tuple[Inputs, np.ndarray | None]]:
        self.asked.append(batch)
        return self.inner.batches(batch)


def test_the_noise_measured_a_run_at_a_time_is_the_noise_of_all_samples_at_once(tmp_path: Path) -> None:
    """The measure, streamed one pair and one sample a run or taken whole, against the noise computed from every
    tensor of the first SENSITIVITY_SAMPLES samples held at once (what it computed before it was streamed)."""
    import onnxruntime as ort

    fp32 = _pooling_model(tmp_path / "pooling.onnx")
    source = OnnxFile("pooling", fp32)
    signature = read_signature(onnx.load(str(fp32)))
    calibration = GeneratedSamples(source, signature, samples=16, seed=0)
    validation = GeneratedSamples(source, signature, samples=2 * SENSITIVITY_SAMPLES, seed=1)
    with prepared_for_int8(fp32) as prepared:
        quantize_prepared(prepared, tmp_path / "int8.onnx", calibration, signature)
        fp32_model, int8_model = onnx.load(str(prepared)), onnx.load(str(tmp_path / "int8.onnx"))
    produced = {name for node in int8_model.graph.node for name in node.output}
    pairs = [
        (name, f"{name}_DequantizeLinear_Output" if f"{name}_DequantizeLinear_Output" in produced else name)
        for node in fp32_model.graph.node
        for name in node.output
        if name in produced
    ]
    assert len(pairs) >= 3

    def whole(model: onnx.ModelProto, names: list[str]) -> list[np.ndarray]:
        del model.graph.output[:]
        model.graph.output.extend(onnx.helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in names)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (inputs, _), *_ = validation.batches(SENSITIVITY_SAMPLES)
        return session.run(names, {"x": inputs[0]})

    reference = whole(onnx.ModelProto.FromString(fp32_model.SerializeToString()), [f for f, _ in pairs])
    compared = whole(onnx.ModelProto.FromString(int8_model.SerializeToString()), [q for _, q in pairs])
    expected = [float(np.sum((q.astype(np.float64) - f) ** 2) / np.sum(f.astype(np.float64) ** 2))
                for f, q in zip(reference, compared, strict=True)]  # fmt: skip
    assert min(expected) > 0

    for budget, asked in ((1, {1}), (10**12, {SENSITIVITY_SAMPLES})):
        recorded = RecordedSamples(validation)
        powers = noise_powers(fp32_model, int8_model, pairs, recorded, signature, budget)
        np.testing.assert_allclose([powers[pair] for pair in pairs], expected, rtol=1e-6)
        assert set(recorded.asked) == asked and len(recorded.asked) == (len(pairs) if budget == 1 else 1)

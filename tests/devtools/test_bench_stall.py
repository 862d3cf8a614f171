"""`make bench`'s stall section: how its goals are judged, the ablation's included."""

from __future__ import annotations

from typing import Any

from inferop_core.tritonconfig import ServingConfig, TensorSpec
from inferop_devtools.bench.stall import one_instance, stall_lines, stall_targets


def run(network: str, cpus: int, p99: float, band: int | None, rendering: str = "planned") -> dict[str, Any]:
    return {"network": network, "cpus": cpus, "beside": 0, "rendering": rendering, "instances": 2, "intra_op": 1,
            "throughput": 600.0, "p50_ms": 20.0, "p99_ms": p99, "max_ms": 510.0 if band else 40.0,
            "in_stall_band": band, "requests": 9000}  # fmt: skip


def test_a_tail_or_a_stall_in_a_planned_run_is_missed_and_the_ablation_must_find_the_stall() -> None:
    figures = {"seconds": 12, "callers": 16, "runs": [
        run("conv_net", 1, 50.0, 0), run("conv_net", 2, 70.0, 3), run("inception_v3", 2, 45.0, None),
        run("conv_net", 2, 40.0, 0, rendering="one instance"),
    ]}  # fmt: skip
    outcome = {target.name: (target.missed, target.not_applicable) for target in stall_targets(figures)}
    assert outcome["conv_net at 1 CPU(s), 0 beside: perf_analyzer p99 / p50"] == (False, None)  # 2.5 <= 3
    assert outcome["conv_net at 2 CPU(s), 0 beside: perf_analyzer p99 / p50"] == (True, None)  # 3.5 > 3
    assert outcome["conv_net at 2 CPU(s), 0 beside: answers in 480-700 ms"] == (True, None)
    assert outcome["inception_v3 at 2 CPU(s), 0 beside: perf_analyzer p99 / p50"] == (True, None)  # 2.25 > 2
    assert outcome["inception_v3 at 2 CPU(s), 0 beside: answers in 480-700 ms"][1] == "requests too large to export"
    # An ablation that found no stall had no power to show the mechanism: missed, not passed.
    ablation = "ablation, conv_net at 2 CPU(s) as one instance, 1 run(s): answers in 480-700 ms (the stall found)"
    assert outcome[ablation] == (True, None)
    figures["runs"].append({**run("conv_net", 1, 600.0, 16, rendering="one instance"), "beside": 1})
    found = {target.name: target.missed for target in stall_targets(figures)}
    both = "ablation, conv_net at 1 and 2 CPU(s) as one instance, 2 run(s): answers in 480-700 ms (the stall found)"
    assert found[both] is False  # any run finding it is enough
    lines = stall_lines(figures)
    assert any(line.split()[:4] == ["conv_net", "2", "0", "planned"] and line.split()[-1] == "3" for line in lines)


def test_the_ablation_is_one_instance_with_every_whole_cpu_s_thread() -> None:
    tensors = {"inputs": (TensorSpec(name="x", dims=(4,)),), "outputs": (TensorSpec(name="y", dims=(1,)),)}
    serving = ServingConfig(name="m", **tensors, instances=2, take_turns=True, intra_op_threads=1)
    ablated = one_instance(serving, 2.5)
    assert (ablated.instances, ablated.take_turns, ablated.intra_op_threads) == (1, False, 2)
    assert one_instance(serving, 0.5).intra_op_threads == 1

"""The peak estimate: every term by hand with round constants, each scales with what it should, saturated and
idle differ by the tensors in flight, and the explanation shows the arithmetic a user checks the memory limit
against. Whether the local runtime's constants predict real peaks is checked against the kernel's measurements:
tests/core/test_memory_measured.py."""

from __future__ import annotations

from dataclasses import replace

import pytest

from inferop_core.memory import (
    CONTAINER_RUNTIME,
    GPU_RUNTIME,
    LOCAL_RUNTIME,
    MiB,
    ModelCosts,
    RuntimeCosts,
    ServingShape,
    estimate_memory,
)
from inferop_core.quantity import format_bytes

# Round constants, so every term below can be checked by hand.
COSTS = RuntimeCosts(
    name="test",
    baseline_bytes=100 * MiB,
    instance_bytes=10 * MiB,
    weight_factor=2.0,
    activation_factor=1.5,
    buffer_factor=3.0,
    request_bytes=500,
    busy_instance_bytes=4000,
    measured="made up for the tests",
)
MODEL = ModelCosts(weight_bytes=100 * MiB, activation_bytes_per_sample=10 * MiB, io_bytes_per_sample=1000)
SHAPE = ServingShape(instances=2, max_batch_size=8, queue_bound=16)
INCEPTION = ModelCosts(
    weight_bytes=95269496,
    activation_bytes_per_sample=11063808,
    io_bytes_per_sample=(3 * 299 * 299 + 1000) * 4,
)
RUNTIMES = [pytest.param(costs, id=costs.name) for costs in (LOCAL_RUNTIME, CONTAINER_RUNTIME, GPU_RUNTIME, COSTS)]


class TestEstimateMemory:
    def test_every_term_by_hand(self) -> None:
        estimate = estimate_memory(MODEL, SHAPE, COSTS)
        assert estimate.baseline == 100 * MiB
        assert estimate.instances == 2 * 10 * MiB
        assert estimate.weights == 2 * 2.0 * 100 * MiB
        assert estimate.activations == 2 * 8 * 1.5 * 10 * MiB
        # queued + in execution, 3 copies of the tensors and 500 bytes of request each; 4000 bytes per busy instance
        assert estimate.in_flight == (16 + 2 * 8) * (1000 * 3.0 + 500) + 2 * 4000
        assert estimate.total == (100 + 20 + 400 + 240) * MiB + 120_000
        assert not estimate.unbounded

    def test_instances_scale_all_but_the_baseline(self) -> None:
        before = estimate_memory(MODEL, SHAPE, COSTS, saturated=False)
        after = estimate_memory(MODEL, replace(SHAPE, instances=3 * SHAPE.instances), COSTS, saturated=False)
        assert after.baseline == before.baseline  # the server is paid for once
        assert (after.instances, after.weights, after.activations) == (
            3 * before.instances,
            3 * before.weights,
            3 * before.activations,
        )

    def test_the_batch_scales_the_activations(self) -> None:
        before = estimate_memory(MODEL, SHAPE, COSTS, saturated=False)
        after = estimate_memory(MODEL, replace(SHAPE, max_batch_size=2 * SHAPE.max_batch_size), COSTS, saturated=False)
        assert (after.baseline, after.instances, after.weights) == (before.baseline, before.instances, before.weights)
        assert after.activations == 2 * before.activations

    def test_a_queued_request_holds_its_inputs_an_executing_one_its_outputs_too(self) -> None:
        model = replace(MODEL, input_bytes_per_sample=600)  # 400 bytes of outputs a sample
        estimate = estimate_memory(model, SHAPE, COSTS)
        assert estimate.in_flight == 16 * (600 * 3.0 + 500) + 2 * 8 * (1000 * 3.0 + 500) + 2 * 4000

    def test_each_busy_instance_adds_its_bytes_whatever_its_batch(self) -> None:
        one = estimate_memory(MODEL, ServingShape(1, 8, 16), COSTS)
        two = estimate_memory(MODEL, ServingShape(2, 8, 16), COSTS)
        assert two.in_flight - one.in_flight == 8 * (1000 * 3.0 + 500) + 4000  # its batch in execution, and itself
        wider = estimate_memory(MODEL, ServingShape(1, 32, 16), COSTS)
        assert wider.in_flight - one.in_flight == 24 * (1000 * 3.0 + 500)

    def test_each_queued_request_adds_its_tensors(self) -> None:
        short = estimate_memory(MODEL, ServingShape(2, 8, 16), COSTS)
        long = estimate_memory(MODEL, ServingShape(2, 8, 116), COSTS)
        assert long.total - short.total == 100 * (1000 * 3.0 + 500)  # 3 copies of 1000 bytes, 500 bytes of request

    @pytest.mark.parametrize("costs", RUNTIMES)
    @pytest.mark.parametrize("queue_bound", [0, 16, 1000])
    def test_saturated_and_idle_differ_exactly_by_the_tensors_in_flight(
        self, costs: RuntimeCosts, queue_bound: int
    ) -> None:
        shape = ServingShape(2, 8, queue_bound)
        saturated = estimate_memory(INCEPTION, shape, costs)
        idle = estimate_memory(INCEPTION, shape, costs, saturated=False)
        assert idle.in_flight == 0
        assert saturated.total - idle.total == saturated.in_flight
        assert (saturated.baseline, saturated.instances, saturated.weights, saturated.activations) == (
            idle.baseline,
            idle.instances,
            idle.weights,
            idle.activations,
        )

    def test_the_gpu_holds_no_queued_tensors(self) -> None:
        """Requests wait in host memory; the device holds the batches in the activation arena."""
        assert estimate_memory(INCEPTION, ServingShape(2, 8, 1000), GPU_RUNTIME).in_flight == 0

    def test_an_unbounded_queue_is_flagged(self) -> None:
        estimate = estimate_memory(MODEL, ServingShape(2, 8, None), COSTS)
        assert estimate.unbounded
        assert estimate.in_flight == 2 * 8 * (1000 * 3.0 + 500) + 2 * 4000  # only what is in execution can be counted
        assert "in-flight requests (queue unbounded)" in estimate.explain()

    def test_an_idle_unbounded_queue_is_not_flagged(self) -> None:
        estimate = estimate_memory(MODEL, ServingShape(2, 8, None), COSTS, saturated=False)
        assert not estimate.unbounded
        assert "unbounded" not in estimate.explain()

    def test_a_bounded_queue_is_not_flagged(self) -> None:
        assert "unbounded" not in estimate_memory(MODEL, SHAPE, COSTS).explain()


class TestExplain:
    def test_lists_every_term_and_the_total(self) -> None:
        estimate = estimate_memory(MODEL, SHAPE, COSTS)
        assert estimate.explain() == (
            "100Mi runtime + 20Mi instances + 400Mi weights + 240Mi activations + 117Ki in-flight requests = 760Mi"
        )

    @pytest.mark.parametrize("costs", RUNTIMES)
    def test_every_term_of_any_runtime_is_shown(self, costs: RuntimeCosts) -> None:
        estimate = estimate_memory(INCEPTION, ServingShape(2, 8, 32), costs)
        text = estimate.explain()
        terms = [
            (estimate.baseline, "runtime"),
            (estimate.instances, "instances"),
            (estimate.weights, "weights"),
            (estimate.activations, "activations"),
            (estimate.in_flight, "in-flight requests"),
        ]
        assert text.split(" = ")[0] == " + ".join(f"{format_bytes(size)} {name}" for size, name in terms)
        assert text.endswith(f" = {format_bytes(estimate.total)}")

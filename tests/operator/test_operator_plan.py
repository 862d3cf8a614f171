"""The plan: threads derived from the CPU budget, and specs that would oversubscribe or not fit refused."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from inferop_core.memory import CONTAINER_RUNTIME, GPU_RUNTIME, RuntimeCosts, stage_bytes
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_core.tritonconfig import parse_model_config, render_model_config
from inferop_operator.plan import MEMORY_MARGIN, Plan, Refusal, memory_limit, plan_service
from inferop_operator.settings import OperatorSettings
from inferop_operator.spec import parse_spec
from tests.specs import CLASSIFIER, EXAMPLES

MI = 2**20
BOARD_IO_BYTES = (1 * 8 * 7 + 7 + 1) * 4  # board in, policy and value out: FP32
BOARD_INPUT_BYTES = 1 * 8 * 7 * 4
IMAGE_IO_BYTES = (3 * 299 * 299 + 1000) * 4  # images in, logits out: FP32
IMAGE_INPUT_BYTES = 3 * 299 * 299 * 4
INCEPTION_PROFILE = {"weight_bytes": 95269496, "activation_bytes": 11063808}


def raw_spec(
    weight_bytes: int = 40, activation_bytes: int = 8, capacity: float | None = None, **sections: Any
) -> dict[str, Any]:
    """A valid spec with the given model cost and measured capacity and top-level `sections` replaced."""
    spec: dict[str, Any] = {
        "model": {
            "name": "conv_net",
            "storageUri": "hostpath:///models/conv_net",
            "profile": {
                "parameters": weight_bytes // 4,
                "macsPerSample": 1000,
                "weightBytes": weight_bytes,
                "activationBytesPerSample": activation_bytes,
            },
            "inputs": [{"name": "board", "dims": [1, 8, 7]}],
            "outputs": [{"name": "policy", "dims": [7]}, {"name": "value", "dims": [1]}],
        }
    }
    if capacity is not None:
        spec["model"]["profile"]["samplesPerCpuSecond"] = capacity
    spec.update(copy.deepcopy(sections))
    return spec


def image_spec(**sections: Any) -> dict[str, Any]:
    """Inception V3's profile and tensors: megabytes in flight per queued request."""
    raw = raw_spec(**INCEPTION_PROFILE, **sections)
    raw["model"]["inputs"] = [{"name": "images", "dims": [3, 299, 299]}]
    raw["model"]["outputs"] = [{"name": "logits", "dims": [1000]}]
    return raw


def in_flight_by_hand(
    io_bytes: int, input_bytes: int, instances: int, batch: int, queue: int, costs: RuntimeCosts = CONTAINER_RUNTIME
) -> float:
    """Queued requests hold their inputs; executing ones their inputs and outputs; each its request bytes too; and
    each instance, busy, its busy-instance bytes."""
    return (
        queue * (input_bytes * costs.buffer_factor + costs.request_bytes)
        + instances * batch * (io_bytes * costs.buffer_factor + costs.request_bytes)
        + instances * costs.busy_instance_bytes
    )


def peak_by_hand(
    weight_bytes: int,
    activation_bytes: int,
    io_bytes: int,
    instances: int,
    batch: int,
    queue: int,
    costs: RuntimeCosts = CONTAINER_RUNTIME,
    input_bytes: int = BOARD_INPUT_BYTES,
) -> int:
    """runtime + instances x (instance + weights) + activations x batch x instances + in-flight requests."""
    return (
        costs.baseline_bytes
        + instances * costs.instance_bytes
        + round(instances * weight_bytes * costs.weight_factor)
        + round(instances * batch * activation_bytes * costs.activation_factor)
        + round(in_flight_by_hand(io_bytes, input_bytes, instances, batch, queue, costs))
    )


def plan(raw: dict[str, Any]) -> Plan:
    return plan_service(parse_spec(raw))


def refusal(raw: dict[str, Any]) -> Refusal:
    with pytest.raises(Refusal) as error:
        plan(raw)
    return error.value


class TestThreads:
    @pytest.mark.parametrize(
        ("resources", "instances", "cpus", "source", "intra_op"),
        [
            ({"limits": {"cpu": "4"}, "requests": {"cpu": "2"}}, 2, 4.0, "limit", 2),  # the limit wins
            ({"requests": {"cpu": "3"}}, 1, 3.0, "request", 3),
            ({"limits": {"cpu": 6}}, 3, 6.0, "limit", 2),
            ({"limits": {"cpu": "8"}}, 3, 8.0, "limit", 2),  # floor(8 / 3)
            ({"limits": {"cpu": "500m"}}, 1, 0.5, "limit", 1),  # half a CPU still runs one thread
            ({"limits": {"cpu": "2500m"}}, 2, 2.5, "limit", 1),  # floor(2.5 / 2)
            ({"requests": {"cpu": "1.5"}}, 1, 1.5, "request", 1),
            ({"limits": {"memory": "1Gi"}}, 1, 1.0, "assumed", 1),
            ({}, 1, 1.0, "assumed", 1),
        ],
    )
    def test_default_threads_from_the_cpu_budget(
        self, resources: dict[str, Any], instances: int, cpus: float, source: str, intra_op: int
    ) -> None:
        result = plan(raw_spec(resources=resources, instances=instances))
        assert (result.threads.cpus, result.cpu_source) == (cpus, source)
        assert (result.threads.intra_op, result.threads.inter_op) == (intra_op, 1)
        assert (result.serving.intra_op_threads, result.serving.inter_op_threads) == (intra_op, 1)
        assert result.threads.threads <= max(1, int(cpus))

    def test_no_cpu_set_warns_that_one_is_assumed(self) -> None:
        result = plan(raw_spec())
        assert any("assumes 1 CPU" in w and "resources.limits.cpu" in w for w in result.warnings)

    def test_a_cpu_limit_needs_no_thread_warning(self) -> None:
        result = plan(raw_spec(capacity=1000.0, resources={"limits": {"cpu": "2", "memory": "1Gi"}}))
        assert result.warnings == []

    @pytest.mark.parametrize(
        ("resources", "threads", "intra_op", "take_turns"),
        [
            ({"limits": {"cpu": "2"}}, {}, 1, False),
            ({"limits": {"cpu": "4"}}, {}, 2, False),
            ({"limits": {"cpu": "3"}}, {}, 1, False),
            ({"limits": {"cpu": "1999m"}}, {}, 1, True),  # one whole CPU: both would run on it at once
            ({"limits": {"cpu": "500m"}}, {}, 1, True),
            ({"requests": {"cpu": "2"}}, {}, 1, False),
            ({}, {}, 1, True),
            ({"limits": {"cpu": "2"}}, {"intraOp": 2}, 2, True),  # two instances of two threads would oversubscribe
            ({"limits": {"cpu": "4"}}, {"intraOp": 2}, 2, False),
            ({"limits": {"cpu": "4"}}, {"interOp": 2}, 1, False),
        ],
    )
    def test_unset_instances_are_two_taking_turns_where_the_cpus_do_not_hold_both(
        self, resources: dict[str, Any], threads: dict[str, int], intra_op: int, take_turns: bool
    ) -> None:
        result = plan(raw_spec(capacity=1000.0, resources=resources, threads=threads))
        assert (result.threads.instances, result.threads.intra_op, result.threads.take_turns) == (
            2,
            intra_op,
            take_turns,
        )
        assert (result.serving.instances, result.serving.take_turns) == (2, take_turns)
        assert ("rate_limiter" in render_model_config(result.serving)) == take_turns
        assert not result.threads.oversubscribed
        assert not any("instances: 1" in w for w in result.warnings)

    @pytest.mark.parametrize(("cpus", "instead"), [("2", "or set 2"), ("1", "(2 here, taking turns)")])
    def test_one_instance_set_is_warned_of(self, cpus: str, instead: str) -> None:
        result = plan(raw_spec(capacity=1000.0, instances=1, resources={"limits": {"cpu": cpus}}))
        assert (result.threads.instances, result.serving.take_turns) == (1, False)
        (warning,) = [w for w in result.warnings if w.startswith("instances: 1:")]
        assert "500 ms" in warning and instead in warning

    def test_unset_instances_are_one_where_two_do_not_fit_in_memory(self) -> None:
        """A limit that holds one instance's peak but not two: served by one, with the reason, never refused."""
        big = {"weight_bytes": 300 * MI, "activation_bytes": MI}
        one = plan(raw_spec(**big, instances=1, resources={"limits": {"cpu": "2", "memory": "8Gi"}}))
        two = plan(raw_spec(**big, instances=2, resources={"limits": {"cpu": "2", "memory": "8Gi"}}))
        between = memory_limit(one.memory.required_bytes)
        assert parse_quantity(between) < two.memory.needed_bytes
        result = plan(raw_spec(**big, resources={"limits": {"cpu": "2", "memory": between}}))
        assert (result.threads.instances, result.threads.intra_op, result.serving.instances) == (1, 2, 1)
        assert result.memory.required_bytes == one.memory.required_bytes
        (warning,) = [w for w in result.warnings if w.startswith("one instance:")]
        assert "two would not fit" in warning and "resources.limits.memory" in warning
        assert not any(w.startswith("instances: 1") for w in result.warnings)  # not asked for: one warning, not two
        with pytest.raises(Refusal, match="instances <= 1"):
            plan_service(
                parse_spec(raw_spec(**big, instances=2, resources={"limits": {"cpu": "2", "memory": between}}))
            )

    def test_explicit_counts_are_kept(self) -> None:
        result = plan(raw_spec(resources={"limits": {"cpu": "8"}}, instances=2, threads={"intraOp": 3, "interOp": 2}))
        assert (result.threads.intra_op, result.threads.inter_op) == (3, 2)
        assert result.threads.threads == 2 * (3 + 2 - 1)
        assert (result.serving.intra_op_threads, result.serving.inter_op_threads) == (3, 2)

    def test_only_intra_op_set(self) -> None:
        result = plan(raw_spec(resources={"limits": {"cpu": "8"}}, threads={"intraOp": 5}))
        assert (result.threads.intra_op, result.threads.inter_op) == (5, 1)

    @pytest.mark.parametrize(
        ("cpu", "instances", "threads", "arithmetic", "intra_fix"),
        [
            (
                "4",
                2,
                {"intraOp": 4},
                "2 instance(s) x (4 intra-op + 1 inter-op - 1) = 8 threads on 4 CPU(s)",
                2,
            ),
            (
                "4",
                1,
                {"intraOp": 4, "interOp": 2},
                "1 instance(s) x (4 intra-op + 2 inter-op - 1) = 5 threads on 4 CPU(s)",
                4,
            ),
            (
                "2500m",
                1,
                {"intraOp": 3},
                "1 instance(s) x (3 intra-op + 1 inter-op - 1) = 3 threads on 2.5 CPU(s)",
                2,
            ),
        ],
    )
    def test_oversubscription_is_refused_with_the_arithmetic_and_a_fix(
        self, cpu: str, instances: int, threads: dict[str, int], arithmetic: str, intra_fix: int
    ) -> None:
        refused = refusal(raw_spec(resources={"limits": {"cpu": cpu}}, instances=instances, threads=threads))
        assert (refused.condition, refused.reason) == ("ThreadBudget", "Oversubscribed")
        assert arithmetic in refused.message
        assert f"threads.intraOp={intra_fix}" in refused.message
        assert "threads.allowOversubscription=true" in refused.message
        assert str(refused) == refused.message

    @pytest.mark.parametrize(
        ("cpu", "instances", "threads"),
        [
            ("2", 4, {"intraOp": 2}),  # the refused example: 4 x 2 threads on 2 CPUs
            ("2", 3, {}),
            ("4", 3, {"intraOp": 2, "interOp": 2}),
            ("1.5", 2, {"intraOp": 2}),
            ("8", 16, {"interOp": 3}),
            ("500m", 1, {"intraOp": 2}),
        ],
    )
    def test_every_suggested_fix_passes_on_its_own(self, cpu: str, instances: int, threads: dict[str, int]) -> None:
        raw = raw_spec(resources={"limits": {"cpu": cpu}}, instances=instances, threads=threads)
        fixes = refusal(raw).message.split(". Fix: ", 1)[1].split(", or ")
        assert fixes
        for fix in fixes:
            changed = copy.deepcopy(raw)
            if match := re.fullmatch(r"set threads\.intraOp=(\d+) and threads\.interOp=1", fix):
                changed["threads"] = {**threads, "intraOp": int(match.group(1)), "interOp": 1}
            elif match := re.fullmatch(r"lower instances to (\d+)", fix):
                changed["instances"] = int(match.group(1))
            elif match := re.fullmatch(r"raise the CPU limit to (\d+)", fix):
                changed["resources"] = {"limits": {"cpu": match.group(1)}}
            elif fix == "set threads.allowOversubscription=true to accept the slowdown":
                changed["threads"] = {**threads, "allowOversubscription": True}
            else:
                pytest.fail(f"not a fix a user can apply: {fix!r}")
            assert not plan(changed).threads.oversubscribed or fix.startswith("set threads.allowOversubscription"), fix

    def test_instances_beyond_the_cpus_are_refused_by_default(self) -> None:
        refused = refusal(raw_spec(resources={"limits": {"cpu": "2"}}, instances=3))
        assert refused.condition == "ThreadBudget"
        assert "3 instance(s) x (1 intra-op + 1 inter-op - 1) = 3 threads on 2 CPU(s)" in refused.message

    def test_oversubscription_allowed_by_the_opt_out_with_a_warning(self) -> None:
        result = plan(
            raw_spec(
                resources={"limits": {"cpu": "4"}},
                instances=2,
                threads={"intraOp": 4, "allowOversubscription": True},
            )
        )
        assert (result.threads.intra_op, result.threads.threads) == (4, 8)
        assert result.serving.intra_op_threads == 4
        warning = next(w for w in result.warnings if "threads.allowOversubscription" in w)
        assert "= 8 threads on 4 CPU(s)" in warning


def suggested_fixes(message: str) -> list[tuple[str, str]]:
    """The fixes of a MemoryFit refusal as (field, value): what a user would change."""
    patterns = {
        "maxBatchSize": r"batching\.maxBatchSize <= (\d+)",
        "instances": r"instances <= (\d+)",
        "memory": r"at least (\S+) of memory",
        "gpu.memory": r"at least (\S+) of GPU memory",
        "pipeline.maxImageBytes": r"pipeline\.maxImageBytes <= (\d+Mi)",
    }
    fixes = []
    for text in message.split(". Fix: ", 1)[1].split(" or "):
        matched = [(field, m.group(1)) for field, pattern in patterns.items() if (m := re.fullmatch(pattern, text))]
        assert len(matched) == 1, f"not a fix a user can apply: {text!r}"
        fixes += matched
    return fixes


def with_fix(raw: dict[str, Any], field: str, value: str | int) -> dict[str, Any]:
    raw = copy.deepcopy(raw)
    if field == "maxBatchSize":
        raw.setdefault("batching", {})["maxBatchSize"] = int(value)
    elif field == "instances":
        raw["instances"] = int(value)
    elif field == "memory":
        raw["resources"]["limits"]["memory"] = value
    else:
        raw["gpu"]["memory"] = value
    return raw


def still_refused(raw: dict[str, Any]) -> str | None:
    """None if the operator accepts `raw`, else its refusal (or why the spec is invalid)."""
    try:
        plan(raw)
    except (Refusal, ValueError) as error:
        return str(error)
    return None


class TestMemoryFit:
    # 100Mi weights and 10Mi of activations per sample, 2 instances at batch 32: more than 1Gi at its peak.
    TOO_BIG: ClassVar[dict[str, Any]] = {
        "weight_bytes": 100 * MI,
        "activation_bytes": 10 * MI,
        "instances": 2,
        "batching": {"maxBatchSize": 32},
    }
    # No capacity and no maxQueueSize: the queue bound is 2 rounds of batches.
    TOO_BIG_PEAK = peak_by_hand(100 * MI, 10 * MI, BOARD_IO_BYTES, instances=2, batch=32, queue=2 * 2 * 32)

    def test_required_bytes_by_hand(self) -> None:
        result = plan(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "4Gi"}}))
        assert result.memory.required_bytes == self.TOO_BIG_PEAK
        assert result.memory.available_bytes == 4 * 1024 * MI
        assert result.memory.fits

    def test_the_limit_is_compared_with_the_peak_and_its_margin(self) -> None:
        """A memory limit must hold the peak estimate with MEMORY_MARGIN, the limit memory_limit writes: a limit equal
        to the estimate was OOM-killed on the local cluster's node, the estimate being under the peak."""
        exact = memory_limit(self.TOO_BIG_PEAK)
        assert plan(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": exact}})).memory.fits
        for short in (parse_quantity(exact) - 1, self.TOO_BIG_PEAK):
            refused = refusal(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": f"{short}"}}))
            assert refused.condition == "MemoryFit"
            assert f"or at least {exact} of memory" in refused.message

    def test_refused_with_the_arithmetic(self) -> None:
        refused = refusal(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1Gi"}}))
        assert (refused.condition, refused.reason) == ("MemoryFit", "InsufficientMemory")
        in_flight = in_flight_by_hand(BOARD_IO_BYTES, BOARD_INPUT_BYTES, instances=2, batch=32, queue=128)
        terms = [
            f"{format_bytes(CONTAINER_RUNTIME.baseline_bytes)} runtime",
            f"{format_bytes(2 * CONTAINER_RUNTIME.instance_bytes)} instances",
            f"{format_bytes(2 * 100 * MI * CONTAINER_RUNTIME.weight_factor)} weights",
            f"{format_bytes(2 * 32 * 10 * MI * CONTAINER_RUNTIME.activation_factor)} activations",
            f"{format_bytes(in_flight)} in-flight requests",
        ]
        assert (
            f"peak estimate {' + '.join(terms)} = {format_bytes(self.TOO_BIG_PEAK)}, x {MEMORY_MARGIN} margin = "
            f"{format_bytes(parse_quantity(memory_limit(self.TOO_BIG_PEAK)))} against 1Gi of memory "
            f"(resources.limits.memory) ({CONTAINER_RUNTIME.assumed}). Fix: "
        ) in refused.message

    # Refused specs and the fixes each must be offered; every fix must pass on its own.
    REFUSED: ClassVar[list[Any]] = [
        pytest.param(
            raw_spec(**TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1310Mi"}}),
            ["maxBatchSize", "memory"],  # 1 instance at batch 32 is still too big
            id="batch or memory",
        ),
        pytest.param(
            raw_spec(**TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1966Mi"}}),
            ["maxBatchSize", "instances", "memory"],
            id="batch, instances or memory",
        ),
        pytest.param(
            raw_spec(**TOO_BIG, resources={"limits": {"cpu": "2", "memory": "512Mi"}}),
            ["memory"],  # the runtime alone takes the limit
            id="only memory",
        ),
        pytest.param(
            raw_spec(weight_bytes=600 * MI, resources={"limits": {"memory": "512Mi"}}),
            ["memory"],
            id="weights alone too big",
        ),
        pytest.param(
            raw_spec(weight_bytes=266 * MI, resources={"limits": {"cpu": "1", "memory": "512Mi"}}),
            ["memory"],  # a peak of 1007Mi: more than 1000Mi, less than 1Gi
            id="a peak just under 1Gi",
        ),
        pytest.param(
            raw_spec(
                **TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1Gi"}}, runtime={"memoryOverhead": "64Mi"}
            ),
            ["maxBatchSize", "instances", "memory"],
            id="measured runtime overhead",
        ),
        pytest.param(
            raw_spec(
                **TOO_BIG,
                resources={"limits": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": 1}},
                gpu={"memory": "1536Mi"},
            ),
            ["maxBatchSize", "instances", "gpu.memory"],
            id="gpu",
        ),
        pytest.param(
            image_spec(
                capacity=8.0,
                instances=4,
                batching={"maxBatchSize": 16},
                resources={"limits": {"cpu": "4", "memory": "2621Mi"}},
            ),
            ["maxBatchSize", "instances", "memory"],
            id="images, queue from the capacity",
        ),
        pytest.param(
            image_spec(instances=3, batching={"maxBatchSize": 32}, resources={"limits": {"cpu": "3", "memory": "3Gi"}}),
            ["maxBatchSize", "instances", "memory"],
            id="images, queue of unknown capacity",
        ),
        pytest.param(
            image_spec(
                instances=2,
                batching={"maxBatchSize": 32, "maxQueueSize": 256},
                resources={"limits": {"cpu": "2", "memory": "2621Mi"}},
            ),
            ["maxBatchSize", "instances", "memory"],
            id="images, queue from the spec",
        ),
    ]

    @pytest.mark.parametrize(("raw", "fields"), REFUSED)
    def test_every_suggested_fix_passes_on_its_own(self, raw: dict[str, Any], fields: list[str]) -> None:
        refused = refusal(raw)
        assert (refused.condition, refused.reason) == ("MemoryFit", "InsufficientMemory")
        fixes = suggested_fixes(refused.message)
        assert [field for field, _ in fixes] == fields
        failures = {f"{field} = {value}": still_refused(with_fix(raw, field, value)) for field, value in fixes}
        assert {fix: why for fix, why in failures.items() if why} == {}

    @pytest.mark.parametrize(("raw", "fields"), REFUSED)
    def test_the_suggested_limits_are_the_largest_that_fit(self, raw: dict[str, Any], fields: list[str]) -> None:
        """One more than a suggested batch size or instance count is refused: the fix gives up no more than it must."""
        for field, value in suggested_fixes(refusal(raw).message):
            if field in ("maxBatchSize", "instances"):
                assert refusal(with_fix(raw, field, int(value) + 1)).condition == "MemoryFit", field

    @pytest.mark.parametrize(("raw", "fields"), REFUSED)
    def test_more_memory_is_asked_for_no_less_than_the_peak(self, raw: dict[str, Any], fields: list[str]) -> None:
        (asked,) = [value for field, value in suggested_fixes(refusal(raw).message) if "memory" in field]
        unchecked = copy.deepcopy(raw)  # the same spec with nothing to check against: planned, with its peak
        unchecked.pop("gpu", None)
        unchecked["resources"]["limits"].pop("memory")
        peak = plan(unchecked).memory.required_bytes
        assert parse_quantity(asked) >= peak, f"asks for {asked} ({parse_quantity(asked):.0f} bytes), needs {peak}"

    def test_gpu_is_checked_against_gpu_memory(self) -> None:
        result = plan(
            raw_spec(
                **self.TOO_BIG,
                resources={"limits": {"cpu": "2", "memory": "256Mi", "nvidia.com/gpu": 1}},
                gpu={"memory": "16Gi"},
            )
        )
        assert result.memory.available_bytes == 16 * 2**30  # not the 256Mi host memory limit
        assert "gpu.memory" in result.memory.against
        assert result.serving.device == "gpu"

    def test_each_gpu_instance_gets_its_share_of_the_device_as_gpu_mem_limit(self) -> None:
        result = plan(
            raw_spec(
                instances=3,
                resources={"limits": {"cpu": "3", "memory": "1Gi", "nvidia.com/gpu": 1}},
                gpu={"memory": "16Gi"},
            )
        )
        share = (16 * 2**30 - GPU_RUNTIME.baseline_bytes) // 3
        assert result.serving.gpu_memory_limit_bytes == share
        assert 3 * share + GPU_RUNTIME.baseline_bytes <= 16 * 2**30  # together they cannot exhaust the device
        parameters = parse_model_config(render_model_config(result.serving)).parameters
        assert parameters["gpu_mem_limit"].string_value == str(share)

    def test_without_gpu_memory_the_limit_is_one_instances_estimate_with_the_margin(self) -> None:
        result = plan(
            raw_spec(
                weight_bytes=100 * MI,
                activation_bytes=MI,
                batching={"maxBatchSize": 8},
                resources={"limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}},
            )
        )
        one = GPU_RUNTIME.instance_bytes + 100 * MI * GPU_RUNTIME.weight_factor + 8 * MI * GPU_RUNTIME.activation_factor
        assert result.serving.gpu_memory_limit_bytes == pytest.approx(one * MEMORY_MARGIN, abs=1)

    def test_cpu_instances_get_no_gpu_memory_limit(self) -> None:
        assert plan(raw_spec(resources={"limits": {"cpu": "1"}})).serving.gpu_memory_limit_bytes is None

    def test_gpu_refusal_names_gpu_memory(self) -> None:
        refused = refusal(
            raw_spec(
                **self.TOO_BIG,
                resources={"limits": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": 1}},
                gpu={"memory": "512Mi"},
            )
        )
        peak = peak_by_hand(100 * MI, 10 * MI, BOARD_IO_BYTES, instances=2, batch=32, queue=128, costs=GPU_RUNTIME)
        assert refused.condition == "MemoryFit"
        assert "0B in-flight requests" in refused.message  # queued requests wait in host memory
        assert f"= {format_bytes(peak)} against 512Mi of GPU memory (gpu.memory)" in refused.message
        assert "of GPU memory" in refused.message.split("Fix: ")[1]

    def test_gpu_without_gpu_memory_is_not_checked(self) -> None:
        result = plan(
            raw_spec(
                weight_bytes=100 * 2**30,  # would never fit the host memory limit below
                resources={"limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": 1}},
            )
        )
        assert result.memory.available_bytes is None
        assert not result.memory.against.startswith("of ")
        assert any(w.startswith("memory fit not checked") and "gpu.memory" in w for w in result.warnings)

    def test_gpu_memory_is_ignored_without_a_gpu_limit(self) -> None:
        result = plan(raw_spec(resources={"limits": {"cpu": "1", "memory": "1Gi"}}, gpu={"memory": "1Mi"}))
        assert result.memory.available_bytes == 2**30
        assert result.serving.device == "cpu"

    def test_no_memory_limit_is_not_checked(self) -> None:
        result = plan(raw_spec(weight_bytes=100 * 2**30, resources={"limits": {"cpu": "1"}}))
        assert result.memory.available_bytes is None
        assert any("resources.limits.memory is not set" in w for w in result.warnings)


class TestRuntimeOverhead:
    @pytest.mark.parametrize(
        ("resources", "gpu", "runtime"),
        [
            ({"limits": {"cpu": "2", "memory": "5Gi"}}, None, CONTAINER_RUNTIME),
            ({"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}}, {"memory": "16Gi"}, GPU_RUNTIME),
        ],
        ids=["cpu", "gpu"],
    )
    @pytest.mark.parametrize("overhead", ["64Mi", "2Gi", 0])
    def test_the_spec_overhead_replaces_the_baseline(
        self, resources: dict[str, Any], gpu: dict[str, str] | None, runtime: RuntimeCosts, overhead: str | int
    ) -> None:
        sections: dict[str, Any] = {"resources": resources, **({"gpu": gpu} if gpu else {})}
        default = plan(raw_spec(**TestMemoryFit.TOO_BIG, **sections)).memory.required_bytes
        measured = plan(raw_spec(**TestMemoryFit.TOO_BIG, runtime={"memoryOverhead": overhead}, **sections))
        assert measured.memory.required_bytes - default == parse_quantity(overhead) - runtime.baseline_bytes
        assert f"{format_bytes(parse_quantity(overhead))} runtime" in measured.memory.explain()

    def test_an_assumed_baseline_is_said_to_be_one(self) -> None:
        """The container's baseline was never measured: every message that shows the estimate says so, until the
        operator's setting or the spec replaces it."""
        raw = raw_spec(**TestMemoryFit.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "4Gi"}})
        default = plan_service(parse_spec(raw), OperatorSettings().runtime_costs()).memory.explain()
        assert default.endswith(
            "(the runtime's 512Mi is assumed, not measured for this image: set "
            "runtime.memoryOverhead or the operator's INFEROP_RUNTIME_MEMORY_OVERHEAD)"
        )
        set_by_operator = OperatorSettings(runtime_memory_overhead="600Mi").runtime_costs()
        assert "assumed" not in plan_service(parse_spec(raw), set_by_operator).memory.explain()
        raw["runtime"] = {"memoryOverhead": "600Mi"}
        assert "assumed" not in plan_service(parse_spec(raw), OperatorSettings().runtime_costs()).memory.explain()

    def test_a_gpu_spec_says_its_constants_are_defaults(self) -> None:
        raw = raw_spec(resources={"limits": {"cpu": "2", "nvidia.com/gpu": "1"}}, gpu={"memory": "16Gi"})
        assert "GPU constants are defaults, not measured" in plan_service(parse_spec(raw)).memory.explain()

    def test_the_operator_setting_replaces_the_baseline(self) -> None:
        spec = parse_spec(raw_spec(**TestMemoryFit.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "4Gi"}}))
        costs = OperatorSettings(runtime_memory_overhead="1Gi").runtime_costs()
        default = plan_service(spec).memory.required_bytes
        assert plan_service(spec, costs).memory.required_bytes - default == 2**30 - CONTAINER_RUNTIME.baseline_bytes

    def test_the_spec_overhead_wins_over_the_operator_setting(self) -> None:
        raw = raw_spec(**TestMemoryFit.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "4Gi"}})
        costs = OperatorSettings(runtime_memory_overhead="1Gi").runtime_costs()
        own = plan_service(parse_spec({**raw, "runtime": {"memoryOverhead": "100Mi"}}), costs)
        assert own.memory.estimate.baseline == 100 * MI

    def test_a_measured_overhead_lets_a_spec_fit(self) -> None:
        raw = raw_spec(**TestMemoryFit.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1966Mi"}})
        assert refusal(raw).condition == "MemoryFit"  # with the default 512Mi for the runtime
        assert plan({**raw, "runtime": {"memoryOverhead": "128Mi"}}).memory.fits


class TestQueueBound:
    LIMITS: ClassVar[dict[str, Any]] = {"limits": {"cpu": "1", "memory": "1Gi"}}

    def test_derived_from_the_capacity(self) -> None:
        # Inception on one CPU: 10 samples/s x 0.95 served x 10 s x 0.5 = 47.
        result = plan(
            raw_spec(
                capacity=10.0, resources=self.LIMITS, batching={"maxBatchSize": 8}, timeouts={"requestSeconds": 10}
            )
        )
        assert (result.queue.size, result.queue.source, result.queue.capacity) == (47, "capacity", 10.0)
        assert result.serving.max_queue_size == 47
        config = parse_model_config(render_model_config(result.serving))
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 47
        assert result.warnings == []

    def test_the_capacity_is_the_pods(self) -> None:
        # 4 CPUs, 2 instances x 2 intra-op threads: 32 samples/s x 0.95 x 10 s x 0.5 = 152.
        result = plan(raw_spec(capacity=8.0, instances=2, resources={"limits": {"cpu": "4", "memory": "1Gi"}}))
        assert (result.threads.intra_op, result.queue.capacity) == (2, 32.0)
        assert result.serving.max_queue_size == 152

    def test_the_spec_value_wins(self) -> None:
        result = plan(raw_spec(capacity=8.0, resources=self.LIMITS, batching={"maxQueueSize": 5}))
        assert (result.serving.max_queue_size, result.queue.source) == (5, "spec")
        assert result.warnings == []

    def test_unknown_capacity_warns(self) -> None:
        result = plan(raw_spec(instances=1, resources=self.LIMITS, batching={"maxBatchSize": 8}))
        assert (result.serving.max_queue_size, result.queue.source) == (2 * 8, "unknown capacity")
        (warning,) = [w for w in result.warnings if not w.startswith("instances: 1:")]
        assert "capacity unknown" in warning
        assert "model.profile.samplesPerCpuSecond" in warning
        assert "batching.maxQueueSize" in warning

    @pytest.mark.parametrize(
        "sections",
        [
            {"capacity": 8.0},
            {"capacity": 8.0, "batching": {"maxQueueSize": 500}},
            {"batching": {"maxBatchSize": 4}},
        ],
        ids=["capacity", "spec", "unknown capacity"],
    )
    def test_the_memory_estimate_holds_the_queue_the_config_bounds(self, sections: dict[str, Any]) -> None:
        result = plan(image_spec(instances=2, resources={"limits": {"cpu": "2", "memory": "8Gi"}}, **sections))
        assert result.serving.max_queue_size is not None
        expected = in_flight_by_hand(
            IMAGE_IO_BYTES, IMAGE_INPUT_BYTES, 2, result.serving.max_batch_size, result.serving.max_queue_size
        )
        assert result.memory.estimate.in_flight == round(expected)
        assert not result.memory.estimate.unbounded


class TestServingConfig:
    def test_carries_batching_and_timeouts(self) -> None:
        result = plan(
            raw_spec(
                resources={"limits": {"cpu": "4"}},
                instances=2,
                batching={"maxBatchSize": 16, "maxQueueDelayMicroseconds": 750, "maxQueueSize": 5},
                timeouts={"requestSeconds": 2.5},
            )
        )
        serving = result.serving
        assert serving.name == "conv_net"
        assert [t.name for t in serving.inputs] == ["board"]
        assert [t.name for t in serving.outputs] == ["policy", "value"]
        assert serving.inputs[0].dims == (1, 8, 7)
        assert (serving.max_batch_size, serving.max_queue_delay_microseconds, serving.max_queue_size) == (
            16,
            750,
            5,
        )
        assert serving.request_timeout_microseconds == 2_500_000
        assert (serving.instances, serving.device) == (2, "cpu")

    @pytest.mark.parametrize(("seconds", "microseconds"), [(10, 10_000_000), (0.001, 1000), (0.25, 250_000)])
    def test_timeout_in_microseconds(self, seconds: float, microseconds: int) -> None:
        assert plan(raw_spec(timeouts={"requestSeconds": seconds})).serving.request_timeout_microseconds == microseconds

    @pytest.mark.parametrize(("gpus", "device"), [(1, "gpu"), ("2", "gpu"), (0, "cpu")])
    def test_instance_kind_follows_the_gpu_limit(self, gpus: int | str, device: str) -> None:
        result = plan(raw_spec(resources={"limits": {"cpu": "1", "nvidia.com/gpu": gpus}}, gpu={"memory": "16Gi"}))
        assert result.serving.device == device

    def test_label_file_reaches_the_config(self) -> None:
        raw = raw_spec()
        raw["model"]["outputs"] = [{"name": "logits", "dims": [1000], "labelFilename": "labels.txt"}]
        assert plan(raw).serving.outputs[0].label_filename == "labels.txt"


def _manifests(folder: Path) -> list[Any]:
    paths = sorted(folder.glob("*.yaml"))
    assert paths, f"no examples in {folder}"
    return [pytest.param(path, id=path.name) for path in paths]


class TestExamples:
    @pytest.mark.parametrize("path", _manifests(EXAMPLES))
    def test_examples_are_planned_without_warnings(self, path: Path) -> None:
        result = plan(yaml.safe_load(path.read_text())["spec"])
        assert result.memory.fits
        assert not result.threads.oversubscribed
        assert result.warnings == []

    @pytest.mark.parametrize("path", _manifests(EXAMPLES / "refused"))
    def test_refused_examples_are_refused(self, path: Path) -> None:
        condition = refusal(yaml.safe_load(path.read_text())["spec"]).condition
        expected = {"out-of-memory.yaml": "MemoryFit", "oversubscribed.yaml": "ThreadBudget"}
        assert condition == expected.get(path.name, condition)
        assert condition in ("ThreadBudget", "MemoryFit")

    def test_out_of_memory_example_numbers(self) -> None:
        raw = yaml.safe_load((EXAMPLES / "refused" / "out-of-memory.yaml").read_text())["spec"]
        refused = refusal(raw)
        # 4 instances at batch 64; no capacity and no maxQueueSize: 2 rounds of 4 x 64 queued.
        peak = peak_by_hand(
            **INCEPTION_PROFILE,
            io_bytes=IMAGE_IO_BYTES,
            instances=4,
            batch=64,
            queue=2 * 4 * 64,
            input_bytes=IMAGE_INPUT_BYTES,
        )
        assert f"= {format_bytes(peak)}, x {MEMORY_MARGIN} margin = " in refused.message
        assert [field for field, _ in suggested_fixes(refused.message)] == ["maxBatchSize", "instances", "memory"]
        assert ("instances", "1") in suggested_fixes(refused.message)

    def test_out_of_memory_example_comment_is_true(self) -> None:
        text = (EXAMPLES / "refused" / "out-of-memory.yaml").read_text()
        said = re.search(r"needs about ([\d.]+) GiB", text)
        assert said is not None
        required = plan({**yaml.safe_load(text)["spec"], "resources": {"limits": {"cpu": "4"}}}).memory.required_bytes
        assert float(said.group(1)) == round(required / 2**30, 1)
        fixes = refusal(yaml.safe_load(text)["spec"]).message.split("Fix: ")[1]
        assert f"# The operator suggests: {fixes}\n" in text


class TestPipeline:
    """An image pipeline's stages take their CPUs out of the model's budget, and its configs come from the plan."""

    @staticmethod
    def pipeline_spec(cpus: str, **pipeline: Any) -> dict[str, Any]:
        return raw_spec(
            model={**CLASSIFIER, "profile": {**CLASSIFIER["profile"], "samplesPerCpuSecond": 100}},
            resources={"limits": {"cpu": cpus}},
            pipeline=pipeline,
        )

    def test_the_model_is_planned_on_the_cpus_the_stages_leave(self) -> None:
        planned = plan(self.pipeline_spec("4", imagesPerCpuSecond=100))  # half of each image's work is decoding
        assert planned.stages is not None and (planned.stages.stage_cpus, planned.stages.pre_instances) == (2, 2)
        assert planned.threads.cpus == 2 and planned.threads.threads == 2
        assert planned.queue.capacity == pytest.approx(200)  # the model's two CPUs answer for the pod
        assert planned.pipeline is not None and planned.pipeline.pre_instances == 2
        assert planned.pipeline.model.name == "inception_v3_model"
        assert planned.pipeline.model.max_queue_size == planned.queue.size == planned.serving.max_queue_size

    def test_cheap_decoding_leaves_the_model_every_cpu(self) -> None:
        planned = plan(self.pipeline_spec("2", imagesPerCpuSecond=2000))
        assert planned.stages is not None and planned.stages.stage_cpus == 0 and planned.threads.cpus == 2

    def test_an_unknown_decoding_cost_is_a_warning(self) -> None:
        planned = plan(self.pipeline_spec("2"))
        assert any("imagesPerCpuSecond" in warning for warning in planned.warnings)

    def test_too_many_decoding_instances_are_refused(self) -> None:
        refused = refusal(self.pipeline_spec("2", imagesPerCpuSecond=2000, preInstances=4))
        assert refused.condition == "ThreadBudget" and "lower pipeline.preInstances to 1" in refused.message

    def test_a_refusal_s_cpu_limit_keeps_the_stages_cpus(self) -> None:
        """Half of each image's work is the stages': 2 instances of 2 threads need 4 CPUs for the model, the pod 8."""
        refused = refusal(
            {**self.pipeline_spec("4", imagesPerCpuSecond=100), "instances": 2, "threads": {"intraOp": 2}}
        )
        assert refused.condition == "ThreadBudget"
        assert "raise the CPU limit to 8 (4 of them for the pipeline's stages)" in refused.message
        fixed = {**self.pipeline_spec("8", imagesPerCpuSecond=100), "instances": 2, "threads": {"intraOp": 2}}
        assert plan(fixed).threads.threads == 4

    def test_without_a_pipeline_nothing_changes(self) -> None:
        planned = plan(raw_spec(model=CLASSIFIER, resources={"limits": {"cpu": "4"}}))
        assert (planned.stages, planned.pipeline, planned.threads.cpus) == (None, None, 4)

    def test_the_memory_fit_counts_the_stages_and_says_how_small_the_images_must_be(self) -> None:
        """Each stage a process, each decoding instance the largest picture, every request in the pipeline the
        largest image (inferop_core.memory.stage_bytes); a limit that holds the model alone is refused with the
        largest maxImageBytes that fits."""
        spec = self.pipeline_spec("2", imagesPerCpuSecond=100, maxImageBytes="4Mi", maxImagePixels=1_000_000)
        planned = plan(spec)
        assert planned.stages is not None and planned.memory.estimate.stages == stage_bytes(
            planned.stages.pre_instances, 1, 1_000_000, 4 * 2**20, planned.queue.size,
            planned.threads.instances * planned.serving.max_batch_size, CONTAINER_RUNTIME,
        )  # fmt: skip
        assert " pipeline stages = " in planned.memory.explain()
        alone = plan(raw_spec(model=CLASSIFIER, resources={"limits": {"cpu": "2"}})).memory.needed_bytes
        limit = alone + 2 * (planned.memory.needed_bytes - alone) // 3
        refused = refusal({**spec, "resources": {"limits": {"cpu": "2", "memory": str(limit)}}})
        assert refused.condition == "MemoryFit"
        (fix,) = [value for field, value in suggested_fixes(refused.message) if field == "pipeline.maxImageBytes"]
        mib = int(fix.removesuffix("Mi"))
        assert 1 <= mib < 4
        smaller = {**spec["pipeline"], "maxImageBytes": fix}
        assert plan({**spec, "pipeline": smaller, "resources": {"limits": {"cpu": "2", "memory": str(limit)}}})

"""The plan: threads derived from the CPU budget, and specs that would oversubscribe or not fit refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from inferop_operator.plan import Plan, Refusal, plan_service
from inferop_operator.spec import parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "operator" / "examples"
MI = 2**20


def raw_spec(weight_bytes: int = 40, activation_bytes: int = 8, **sections: Any) -> dict[str, Any]:
    """A valid spec with the given model cost and top-level `sections` replaced."""
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
    spec.update(copy.deepcopy(sections))
    return spec


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
        result = plan(raw_spec(resources={"limits": {"cpu": "2", "memory": "1Gi"}}))
        assert result.warnings == []

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


class TestMemoryFit:
    # 100Mi weights x 2 instances + 10Mi activations x batch 32 x 2 instances = 200Mi + 640Mi = 840Mi.
    TOO_BIG: ClassVar[dict[str, Any]] = {
        "weight_bytes": 100 * MI,
        "activation_bytes": 10 * MI,
        "instances": 2,
        "batching": {"maxBatchSize": 32},
    }

    def test_required_bytes_by_hand(self) -> None:
        result = plan(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "1Gi"}}))
        assert result.memory.required_bytes == 840 * MI
        assert result.memory.available_bytes == 1024 * MI
        assert result.memory.fits

    def test_refused_with_sizes_and_what_would_fit(self) -> None:
        refused = refusal(raw_spec(**self.TOO_BIG, resources={"limits": {"cpu": "2", "memory": "512Mi"}}))
        assert (refused.condition, refused.reason) == ("MemoryFit", "InsufficientMemory")
        assert (
            "100Mi weights x 2 instance(s) + 10Mi activations x batch 32 x 2 instance(s) = 840Mi "
            "against 512Mi of memory (resources.limits.memory)"
        ) in refused.message
        # batch: floor((512Mi - 2 x 100Mi) / (10Mi x 2)) = floor(312 / 20) = 15
        assert "batching.maxBatchSize <= 15" in refused.message
        # instances: floor(512Mi / (100Mi + 10Mi x 32)) = floor(512 / 420) = 1
        assert "instances <= 1" in refused.message
        assert "at least 840Mi of memory" in refused.message

    @pytest.mark.parametrize(
        ("change", "fits"),
        [
            ({"batching": {"maxBatchSize": 15}}, True),  # 200Mi + 10Mi x 15 x 2 = 500Mi
            ({"batching": {"maxBatchSize": 16}}, False),  # 200Mi + 10Mi x 16 x 2 = 520Mi
            ({"instances": 1}, True),  # 100Mi + 10Mi x 32 = 420Mi
            ({"resources": {"limits": {"cpu": "2", "memory": "840Mi"}}}, True),
        ],
    )
    def test_the_suggested_fixes_are_exact(self, change: dict[str, Any], fits: bool) -> None:
        raw = raw_spec(**{**self.TOO_BIG, "resources": {"limits": {"cpu": "2", "memory": "512Mi"}}, **change})
        if fits:
            assert plan(raw).memory.fits
        else:
            assert refusal(raw).condition == "MemoryFit"

    def test_weights_alone_too_big_suggests_only_more_memory(self) -> None:
        refused = refusal(raw_spec(weight_bytes=600 * MI, resources={"limits": {"memory": "512Mi"}}))
        assert "maxBatchSize" not in refused.message
        assert "instances <=" not in refused.message
        assert "Fix: at least 600Mi of memory" in refused.message  # 600Mi + 8 bytes x batch 8

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

    def test_gpu_refusal_names_gpu_memory(self) -> None:
        refused = refusal(
            raw_spec(
                **self.TOO_BIG,
                resources={"limits": {"cpu": "2", "memory": "16Gi", "nvidia.com/gpu": 1}},
                gpu={"memory": "512Mi"},
            )
        )
        assert refused.condition == "MemoryFit"
        assert "840Mi against 512Mi of GPU memory (gpu.memory)" in refused.message
        assert "batching.maxBatchSize <= 15" in refused.message
        assert "at least 840Mi of GPU memory" in refused.message

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
        refused = refusal(yaml.safe_load((EXAMPLES / "refused" / "out-of-memory.yaml").read_text())["spec"])
        # 95269496 x 4 + 11063808 x 64 x 4 = 3213412832 bytes = 2.99Gi against 1Gi
        assert "= 2.99Gi against 1Gi" in refused.message
        # floor((1Gi - 95269496 x 4) / (11063808 x 4)) = floor(692663840 / 44255232) = 15
        assert "batching.maxBatchSize <= 15" in refused.message
        # floor(1Gi / (95269496 + 11063808 x 64)) = floor(1073741824 / 803353208) = 1
        assert "instances <= 1" in refused.message

"""`inferop export --manifest`: the InferenceService it writes is the exported spec, accepted and planned as it is."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_core.memory import CONTAINER_RUNTIME
from inferop_core.processing import Processing
from inferop_core.quantity import parse_quantity
from inferop_core.tritonconfig import ServingConfig, parse_model_config, render_model_config
from inferop_export.manifest import build_manifest, write_manifest
from inferop_operator.identity import API_VERSION
from inferop_operator.plan import MEMORY_MARGIN, plan_service
from inferop_operator.spec import InferenceServiceSpec, SpecError, parse_spec

BOARD = {"name": "board", "dims": [1, 8, 7]}
POLICY = {"name": "policy", "dims": [7]}
VALUE = {"name": "value", "dims": [1]}
IMAGES = {"name": "images", "dims": [3, 299, 299]}
LOGITS = {"name": "logits", "dims": [1000], "labelFilename": "labels.txt"}
CONV_NET_PROFILE = {
    "parameters": 1333843,
    "macsPerSample": 74576712,
    "weightBytes": 5335404,
    "activationBytesPerSample": 57344,
    "samplesPerCpuSecond": 20_000.0,
}
INCEPTION_PROFILE = {
    "parameters": 27161264,
    "macsPerSample": 5713216096,
    "weightBytes": 95269496,
    "activationBytesPerSample": 11063808,
    "samplesPerCpuSecond": 8.0,
}
WIDE_PROFILE = {
    "parameters": 2**29,
    "macsPerSample": 10**9,
    "weightBytes": 2 * 2**30,
    "activationBytesPerSample": 64 * 2**20,
    "samplesPerCpuSecond": 100.0,
}


def exported(
    name: str, uri: str, inputs: list[Any], outputs: list[Any], profile: dict[str, Any], cpus: int = 4, **serving: Any
) -> InferenceServiceSpec:
    """The spec `inferop export` plans for a model on a machine with `cpus` CPUs: what a manifest starts from."""
    model = {"name": name, "storageUri": uri, "profile": profile, "inputs": inputs, "outputs": outputs}
    return parse_spec({**serving, "model": model, "resources": {"limits": {"cpu": cpus}}})


# conv net, threads derived from 1 CPU; its queue bound derived from the capacity.
CONV_NET = exported("conv_net", "hostpath:///models/conv_net", [BOARD], [POLICY, VALUE], CONV_NET_PROFILE, cpus=1)
INCEPTION = exported(
    "inception_v3",
    "pvc://models/inception_v3",
    [IMAGES],
    [LOGITS],
    INCEPTION_PROFILE,
    instances=2,
    threads={"intraOp": 2, "interOp": 1},
    batching={"maxBatchSize": 8, "maxQueueDelayMicroseconds": 5000, "maxQueueSize": 32},  # --max-queue-size
    timeouts={"requestSeconds": 2.5},
)
# 3 instances x (2 + 2 - 1) threads on a big machine.
WIDE = exported(
    "Wide.Model",
    "oci://registry.example/wide:1",
    [BOARD],
    [VALUE],
    WIDE_PROFILE,
    cpus=12,
    instances=3,
    threads={"intraOp": 2, "interOp": 2},
    batching={"maxBatchSize": 64},
)
CASES = [pytest.param(CONV_NET, id="conv-net"), pytest.param(INCEPTION, id="inception"), pytest.param(WIDE, id="wide")]


def peak(serving: ServingConfig, spec: InferenceServiceSpec) -> int:
    """The pod's peak in NVIDIA's container with its queue full, by hand from the runtime's constants."""
    costs, n, batch = CONTAINER_RUNTIME, serving.instances, serving.max_batch_size
    profile = spec.model.profile
    io = sum(t.bytes_per_sample for t in (*serving.inputs, *serving.outputs))
    inputs = sum(t.bytes_per_sample for t in serving.inputs)  # what a queued request holds
    assert serving.max_queue_size is not None
    return (
        costs.baseline_bytes
        + n * costs.instance_bytes
        + round(n * profile.weight_bytes * costs.weight_factor)
        + round(n * batch * profile.activation_bytes_per_sample * costs.activation_factor)
        + round(
            serving.max_queue_size * (inputs * costs.buffer_factor + costs.request_bytes)
            + n * batch * (io * costs.buffer_factor + costs.request_bytes)
            + n * costs.busy_instance_bytes
        )
    )


class TestBuildManifest:
    @pytest.mark.parametrize("exported_spec", CASES)
    def test_accepted_and_planned_by_the_operator(self, exported_spec: InferenceServiceSpec) -> None:
        plan = plan_service(parse_spec(build_manifest(exported_spec)["spec"]))
        exported_plan = plan_service(exported_spec)
        assert plan.warnings == []
        assert plan.memory.fits
        assert not plan.threads.oversubscribed
        assert (plan.threads.intra_op, plan.threads.inter_op) == (
            exported_plan.threads.intra_op,
            exported_plan.threads.inter_op,
        )
        assert plan.cpu_source == "limit"

    @pytest.mark.parametrize("exported_spec", CASES)
    def test_operator_renders_the_exported_config(self, exported_spec: InferenceServiceSpec) -> None:
        """The config.pbtxt the operator mounts is the one export wrote next to the model, queue bound included
        (derived by both from the measured capacity, or given)."""
        exported_config = plan_service(exported_spec).serving
        plan = plan_service(parse_spec(build_manifest(exported_spec)["spec"]))
        assert plan.serving == exported_config
        assert render_model_config(plan.serving) == render_model_config(exported_config)

    @pytest.mark.parametrize("exported_spec", CASES)
    def test_the_spec_is_dumped_by_alias(self, exported_spec: InferenceServiceSpec) -> None:
        """One schema: the manifest is the spec model's own camelCase dump, profile and tensors included."""
        written = build_manifest(exported_spec)["spec"]
        assert written["model"] == exported_spec.model.model_dump(by_alias=True, exclude_none=True)
        assert parse_spec(written).model == exported_spec.model

    def test_an_unmeasured_capacity_is_left_out(self) -> None:
        profile = {k: v for k, v in INCEPTION_PROFILE.items() if k != "samplesPerCpuSecond"}
        unmeasured = exported("inception_v3", "pvc://models/inception_v3", [IMAGES], [LOGITS], profile)
        assert "samplesPerCpuSecond" not in build_manifest(unmeasured)["spec"]["model"]["profile"]

    def test_the_queue_bound_is_written_only_when_given(self) -> None:
        assert "maxQueueSize" not in build_manifest(CONV_NET)["spec"]["batching"]
        assert build_manifest(INCEPTION)["spec"]["batching"]["maxQueueSize"] == 32

    @pytest.mark.parametrize("exported_spec", CASES)
    def test_memory_limit_is_the_operators_peak_with_a_margin(self, exported_spec: InferenceServiceSpec) -> None:
        spec = build_manifest(exported_spec)["spec"]
        limit = parse_quantity(spec["resources"]["limits"]["memory"])
        serving = plan_service(parse_spec(spec)).serving
        assert plan_service(parse_spec(spec)).memory.required_bytes == peak(serving, exported_spec)
        assert limit >= peak(serving, exported_spec) * MEMORY_MARGIN
        assert limit < peak(serving, exported_spec) * MEMORY_MARGIN + 2**20  # rounded up to whole Mi
        assert spec["resources"]["requests"] == spec["resources"]["limits"]  # Guaranteed QoS: measured is held

    def test_inception_numbers(self) -> None:
        spec = build_manifest(INCEPTION)["spec"]
        serving = plan_service(parse_spec(spec)).serving
        memory = f"{math.ceil(peak(serving, INCEPTION) * MEMORY_MARGIN / 2**20)}Mi"
        assert spec["resources"]["limits"] == {"cpu": "4", "memory": memory}  # 2 x (2 + 1 - 1) CPUs
        assert spec["instances"] == 2
        assert spec["threads"] == {"intraOp": 2, "interOp": 1, "allowOversubscription": False}
        assert spec["batching"] == {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 5000, "maxQueueSize": 32}
        assert spec["timeouts"] == {"requestSeconds": 2.5, "startupSeconds": 300}
        assert spec["model"]["outputs"] == [
            {"name": "logits", "datatype": "FP32", "dims": [1000], "labelFilename": "labels.txt"}
        ]
        assert spec["model"]["storageUri"] == "pvc://models/inception_v3"

    @pytest.mark.parametrize(
        ("exported_spec", "cpus"), [(CONV_NET, "1"), (INCEPTION, "4"), (WIDE, "9")]
    )  # instances x (intra + inter - 1)
    def test_cpus_cover_every_thread(self, exported_spec: InferenceServiceSpec, cpus: str) -> None:
        spec = build_manifest(exported_spec)["spec"]
        assert spec["resources"]["limits"]["cpu"] == spec["resources"]["requests"]["cpu"] == cpus

    def test_resource_names(self) -> None:
        manifest = build_manifest(CONV_NET)
        assert manifest["apiVersion"] == API_VERSION
        assert manifest["kind"] == "InferenceService"
        assert manifest["metadata"] == {"name": "conv-net"}
        assert build_manifest(WIDE)["metadata"]["name"] == "wide.model"
        assert build_manifest(CONV_NET, name="board")["metadata"]["name"] == "board"

    def test_weights_and_processing_reach_the_config_the_operator_renders(self) -> None:
        declared = {"weights": "random (seed 0)", "processing": Processing(kind="policyValue")}
        model = CONV_NET.model.model_copy(update=declared)
        spec = build_manifest(
            parse_spec({**CONV_NET.model_dump(by_alias=True), "model": model.model_dump(by_alias=True)})
        )
        assert spec["spec"]["model"]["weights"] == "random (seed 0)"
        rendered = parse_model_config(render_model_config(plan_service(parse_spec(spec["spec"])).serving))
        assert rendered.parameters["inferop_weights"].string_value == "random (seed 0)"
        assert rendered.parameters["inferop_processing"].string_value == '{"kind":"policyValue"}'
        assert "weights" not in build_manifest(CONV_NET)["spec"]["model"]

    def test_a_gpu_export_keeps_its_gpu(self) -> None:
        gpu = exported("conv_net", "hostpath:///models/conv_net", [BOARD], [POLICY, VALUE], CONV_NET_PROFILE, cpus=1)
        gpu = parse_spec(
            gpu.model_dump(by_alias=True, exclude_none=True)
            | {"resources": {"limits": {"cpu": 1, "nvidia.com/gpu": 1}}, "gpu": {"memory": "16Gi"}}
        )
        spec = build_manifest(gpu)["spec"]
        assert spec["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert spec["gpu"] == {"memory": "16Gi"}
        plan = plan_service(parse_spec(spec))
        assert plan.memory.available_bytes == 16 * 2**30 and "gpu.memory" in plan.memory.against  # the device
        assert "nvidia.com/gpu" not in build_manifest(CONV_NET)["spec"]["resources"]["limits"]

    def test_the_model_comes_first(self) -> None:
        assert next(iter(build_manifest(CONV_NET)["spec"])) == "model"

    def test_bad_storage_uri_is_refused(self) -> None:
        with pytest.raises(SpecError, match=r"spec\.model\.storageUri"):
            exported("conv_net", "gs://bucket/conv_net", [BOARD], [VALUE], CONV_NET_PROFILE)


class TestWriteManifest:
    def test_written_file_applies_as_is(self, tmp_path: Path) -> None:
        path = write_manifest(CONV_NET, tmp_path / "out" / "conv-net.yaml")
        text = path.read_text()
        assert text.startswith("# Written by `inferop export` for conv_net (5.09Mi of weights)")
        loaded: dict[str, Any] = yaml.safe_load(text)
        assert loaded == build_manifest(CONV_NET)
        assert plan_service(parse_spec(loaded["spec"])).serving == plan_service(CONV_NET).serving


def test_instances_are_planned_for_the_cpus_the_manifest_asks_for() -> None:
    """Exported on 2 CPUs (two instances derived), asked for 1: two that take turns, left derived, since two set
    would execute at once and the operator would refuse them."""
    spec = exported("conv_net", "hostpath:///models/conv_net", [BOARD], [POLICY, VALUE], CONV_NET_PROFILE, cpus=2)
    assert build_manifest(spec)["spec"]["instances"] == 2
    one = build_manifest(spec, cpus="1")["spec"]
    assert "instances" not in one
    assert (one["threads"]["intraOp"], one["resources"]["limits"]["cpu"]) == (1, "1")
    served = plan_service(parse_spec(one)).serving
    assert (served.instances, served.take_turns) == (2, True)

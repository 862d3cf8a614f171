"""`inferop export --manifest`: the InferenceService it writes is accepted and planned as it is."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop.memory import CONTAINER_RUNTIME
from inferop.quantity import parse_quantity
from inferop.tritonconfig import ServingConfig, TensorSpec, parse_model_config, render_model_config
from inferop_export.manifest import MEMORY_MARGIN, build_manifest, write_manifest
from inferop_export.profile import ModelProfile
from inferop_operator.plan import plan_service
from inferop_operator.spec import SpecError, parse_spec

BOARD = TensorSpec(name="board", dims=(1, 8, 7))
POLICY = TensorSpec(name="policy", dims=(7,))
VALUE = TensorSpec(name="value", dims=(1,))
IMAGES = TensorSpec(name="images", dims=(3, 299, 299))
LOGITS = TensorSpec(name="logits", dims=(1000,), label_filename="labels.txt")

# Each served config carries the queue bound export writes next to the model; each profile the capacity it measured.
# conv net, 1 CPU: 20000 samples/s x 10 s x 0.5 = 100000, less 3 rounds of 1 x 8, capped at 1024.
CONV_NET = ServingConfig(name="conv_net", inputs=(BOARD,), outputs=(POLICY, VALUE), max_queue_size=1024)
CONV_NET_PROFILE = ModelProfile(
    parameters=1333843,
    macs_per_sample=74576712,
    weight_bytes=5335404,
    activation_bytes_per_sample=57344,
    samples_per_cpu_second=20_000.0,
)
INCEPTION = ServingConfig(
    name="inception_v3",
    inputs=(IMAGES,),
    outputs=(LOGITS,),
    max_batch_size=8,
    instances=2,
    max_queue_delay_microseconds=5000,
    max_queue_size=32,  # given with --max-queue-size
    request_timeout_microseconds=2_500_000,
    intra_op_threads=2,
    inter_op_threads=1,
)
INCEPTION_PROFILE = ModelProfile(
    parameters=27161264,
    macs_per_sample=5713216096,
    weight_bytes=95269496,
    activation_bytes_per_sample=11063808,
    samples_per_cpu_second=8.0,
)
# 3 instances x 2 intra-op threads busy: 100 x 6 samples/s x 10 s x 0.5 = 3000, less 3 rounds of 3 x 64, capped at 1024.
WIDE = ServingConfig(
    name="Wide.Model",
    inputs=(BOARD,),
    outputs=(VALUE,),
    max_batch_size=64,
    instances=3,
    max_queue_size=1024,
    intra_op_threads=2,
    inter_op_threads=2,
)
WIDE_PROFILE = ModelProfile(
    parameters=2**29,
    macs_per_sample=10**9,
    weight_bytes=2 * 2**30,
    activation_bytes_per_sample=64 * 2**20,
    samples_per_cpu_second=100.0,
)

CASES = [
    pytest.param(CONV_NET, CONV_NET_PROFILE, "hostpath:///models/conv_net", None, id="conv-net"),
    pytest.param(INCEPTION, INCEPTION_PROFILE, "pvc://models/inception_v3", 32, id="inception"),
    pytest.param(WIDE, WIDE_PROFILE, "oci://registry.example/wide:1", None, id="wide"),
]


def peak(serving: ServingConfig, profile: ModelProfile) -> int:
    """The pod's peak in NVIDIA's container with its queue full, by hand from the runtime's constants."""
    costs, n, batch = CONTAINER_RUNTIME, serving.instances, serving.max_batch_size
    io = sum(t.bytes_per_sample for t in (*serving.inputs, *serving.outputs))
    assert serving.max_queue_size is not None
    return (
        costs.baseline_bytes
        + n * costs.instance_bytes
        + round(n * profile.weight_bytes * costs.weight_factor)
        + round(n * batch * profile.activation_bytes_per_sample * costs.activation_factor)
        + round((serving.max_queue_size + n * batch) * (io * costs.buffer_factor + costs.request_bytes))
    )


class TestBuildManifest:
    @pytest.mark.parametrize(("serving", "profile", "uri", "queue"), CASES)
    def test_accepted_and_planned_by_the_operator(
        self, serving: ServingConfig, profile: ModelProfile, uri: str, queue: int | None
    ) -> None:
        manifest = build_manifest(serving, profile, uri, queue_size=queue)
        plan = plan_service(parse_spec(manifest["spec"]))
        assert plan.warnings == []
        assert plan.memory.fits
        assert not plan.threads.oversubscribed
        assert (plan.threads.intra_op, plan.threads.inter_op) == (
            serving.intra_op_threads,
            serving.inter_op_threads,
        )
        assert plan.cpu_source == "limit"

    @pytest.mark.parametrize(("serving", "profile", "uri", "queue"), CASES)
    def test_operator_renders_the_exported_config(
        self, serving: ServingConfig, profile: ModelProfile, uri: str, queue: int | None
    ) -> None:
        """The config.pbtxt the operator mounts is the one export wrote next to the model, queue bound included
        (derived by both from the measured capacity, or given)."""
        plan = plan_service(parse_spec(build_manifest(serving, profile, uri, queue_size=queue)["spec"]))
        assert plan.serving == serving
        assert render_model_config(plan.serving) == render_model_config(serving)

    @pytest.mark.parametrize(("serving", "profile", "uri", "queue"), CASES)
    def test_profile_in_camel_case(
        self, serving: ServingConfig, profile: ModelProfile, uri: str, queue: int | None
    ) -> None:
        written = build_manifest(serving, profile, uri, queue_size=queue)["spec"]["model"]["profile"]
        assert written == {
            "parameters": profile.parameters,
            "macsPerSample": profile.macs_per_sample,
            "weightBytes": profile.weight_bytes,
            "activationBytesPerSample": profile.activation_bytes_per_sample,
            "samplesPerCpuSecond": profile.samples_per_cpu_second,
        }

    def test_an_unmeasured_capacity_is_left_out(self) -> None:
        unmeasured = dataclasses.replace(INCEPTION_PROFILE, samples_per_cpu_second=None)
        written = build_manifest(INCEPTION, unmeasured, "pvc://models/inception_v3", queue_size=32)["spec"]
        assert "samplesPerCpuSecond" not in written["model"]["profile"]

    @pytest.mark.parametrize(("queue", "batching"), [(None, {}), (32, {"maxQueueSize": 32})])
    def test_the_queue_bound_is_written_only_when_given(self, queue: int | None, batching: dict[str, int]) -> None:
        spec = build_manifest(INCEPTION, INCEPTION_PROFILE, "pvc://models/inception_v3", queue_size=queue)["spec"]
        assert spec["batching"] == {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 5000, **batching}

    @pytest.mark.parametrize(("serving", "profile", "uri", "queue"), CASES)
    def test_memory_limit_is_the_operators_peak_with_a_margin(
        self, serving: ServingConfig, profile: ModelProfile, uri: str, queue: int | None
    ) -> None:
        spec = build_manifest(serving, profile, uri, queue_size=queue)["spec"]
        limit = parse_quantity(spec["resources"]["limits"]["memory"])
        assert plan_service(parse_spec(spec)).memory.required_bytes == peak(serving, profile)
        assert limit >= peak(serving, profile) * MEMORY_MARGIN
        assert limit < peak(serving, profile) * MEMORY_MARGIN + 2**20  # rounded up to whole Mi
        assert spec["resources"]["requests"] == spec["resources"]["limits"]  # Guaranteed QoS: measured is held

    def test_inception_numbers(self) -> None:
        spec = build_manifest(INCEPTION, INCEPTION_PROFILE, "pvc://models/inception_v3", queue_size=32)["spec"]
        memory = f"{math.ceil(peak(INCEPTION, INCEPTION_PROFILE) * MEMORY_MARGIN / 2**20)}Mi"
        assert spec["resources"]["limits"] == {"cpu": "4", "memory": memory}  # 2 x (2 + 1 - 1) CPUs
        assert spec["instances"] == 2
        assert spec["threads"] == {"intraOp": 2, "interOp": 1}
        assert spec["batching"] == {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 5000, "maxQueueSize": 32}
        assert spec["timeouts"] == {"requestSeconds": 2.5}
        assert spec["model"]["outputs"] == [
            {"name": "logits", "datatype": "FP32", "dims": [1000], "labelFilename": "labels.txt"}
        ]
        assert spec["model"]["storageUri"] == "pvc://models/inception_v3"

    @pytest.mark.parametrize(
        ("serving", "cpus"), [(CONV_NET, "1"), (INCEPTION, "4"), (WIDE, "9")]
    )  # instances x (intra + inter - 1)
    def test_cpus_cover_every_thread(self, serving: ServingConfig, cpus: str) -> None:
        spec = build_manifest(serving, CONV_NET_PROFILE, "hostpath:///m")["spec"]
        assert spec["resources"]["limits"]["cpu"] == spec["resources"]["requests"]["cpu"] == cpus

    def test_resource_names(self) -> None:
        manifest = build_manifest(CONV_NET, CONV_NET_PROFILE, "hostpath:///models/conv_net")
        assert manifest["apiVersion"] == "inferop.dev/v1alpha1"
        assert manifest["kind"] == "InferenceService"
        assert manifest["metadata"] == {"name": "conv-net"}
        assert build_manifest(WIDE, WIDE_PROFILE, "hostpath:///m")["metadata"]["name"] == "wide.model"
        assert build_manifest(CONV_NET, CONV_NET_PROFILE, "hostpath:///m", name="board")["metadata"]["name"] == "board"

    def test_weights_reach_the_config_the_operator_renders(self) -> None:
        served = CONV_NET.model_copy(update={"weights": "random (seed 0)"})
        spec = build_manifest(served, CONV_NET_PROFILE, "hostpath:///m")["spec"]
        assert spec["model"]["weights"] == "random (seed 0)"
        rendered = parse_model_config(render_model_config(plan_service(parse_spec(spec)).serving))
        assert rendered.parameters["inferop_weights"].string_value == "random (seed 0)"
        assert "weights" not in build_manifest(CONV_NET, CONV_NET_PROFILE, "hostpath:///m")["spec"]["model"]

    def test_bad_storage_uri_is_refused_before_writing(self) -> None:
        with pytest.raises(SpecError, match=r"spec\.model\.storageUri"):
            build_manifest(CONV_NET, CONV_NET_PROFILE, "s3://bucket/conv_net")


class TestWriteManifest:
    def test_written_file_applies_as_is(self, tmp_path: Path) -> None:
        path = write_manifest(
            CONV_NET, CONV_NET_PROFILE, "hostpath:///models/conv_net", tmp_path / "out" / "conv-net.yaml"
        )
        text = path.read_text()
        assert text.startswith("# Written by `inferop export` for conv_net (5.09Mi of weights)")
        loaded: dict[str, Any] = yaml.safe_load(text)
        assert loaded == build_manifest(CONV_NET, CONV_NET_PROFILE, "hostpath:///models/conv_net")
        assert plan_service(parse_spec(loaded["spec"])).serving == CONV_NET

    def test_a_given_queue_bound_is_written(self, tmp_path: Path) -> None:
        uri = "pvc://models/inception_v3"
        path = write_manifest(INCEPTION, INCEPTION_PROFILE, uri, tmp_path / "inception.yaml", queue_size=32)
        loaded: dict[str, Any] = yaml.safe_load(path.read_text())
        assert loaded["spec"]["batching"]["maxQueueSize"] == 32
        assert plan_service(parse_spec(loaded["spec"])).serving == INCEPTION

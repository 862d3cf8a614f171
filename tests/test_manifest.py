"""`inferop export --manifest`: the InferenceService it writes is accepted and planned as it is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop.quantity import parse_quantity
from inferop.tritonconfig import ServingConfig, TensorSpec, render_model_config
from inferop_export.manifest import RUNTIME_HEADROOM_BYTES, build_manifest, write_manifest
from inferop_export.profile import ModelProfile
from inferop_operator.plan import plan_service
from inferop_operator.spec import SpecError, parse_spec

BOARD = TensorSpec(name="board", dims=(1, 8, 7))
POLICY = TensorSpec(name="policy", dims=(7,))
VALUE = TensorSpec(name="value", dims=(1,))
IMAGES = TensorSpec(name="images", dims=(3, 299, 299))
LOGITS = TensorSpec(name="logits", dims=(1000,), label_filename="labels.txt")

CONV_NET = ServingConfig(name="conv_net", inputs=(BOARD,), outputs=(POLICY, VALUE))
CONV_NET_PROFILE = ModelProfile(
    parameters=1333843, macs_per_sample=74576712, weight_bytes=5335404, activation_bytes_per_sample=57344
)
INCEPTION = ServingConfig(
    name="inception_v3",
    inputs=(IMAGES,),
    outputs=(LOGITS,),
    max_batch_size=8,
    instances=2,
    max_queue_delay_microseconds=5000,
    max_queue_size=32,
    request_timeout_microseconds=2_500_000,
    intra_op_threads=2,
    inter_op_threads=1,
)
INCEPTION_PROFILE = ModelProfile(
    parameters=27161264,
    macs_per_sample=5713216096,
    weight_bytes=95269496,
    activation_bytes_per_sample=11063808,
)
WIDE = ServingConfig(
    name="Wide.Model",
    inputs=(BOARD,),
    outputs=(VALUE,),
    max_batch_size=64,
    instances=3,
    intra_op_threads=2,
    inter_op_threads=2,
)
WIDE_PROFILE = ModelProfile(
    parameters=2**29, macs_per_sample=10**9, weight_bytes=2 * 2**30, activation_bytes_per_sample=64 * 2**20
)

CASES = [
    pytest.param(CONV_NET, CONV_NET_PROFILE, "hostpath:///models/conv_net", id="conv-net"),
    pytest.param(INCEPTION, INCEPTION_PROFILE, "pvc://models/inception_v3", id="inception"),
    pytest.param(WIDE, WIDE_PROFILE, "oci://registry.example/wide:1", id="wide"),
]


def estimate(serving: ServingConfig, profile: ModelProfile) -> int:
    """weights x instances + activations x batch x instances, by hand."""
    return (
        profile.weight_bytes * serving.instances
        + profile.activation_bytes_per_sample * serving.max_batch_size * serving.instances
    )


class TestBuildManifest:
    @pytest.mark.parametrize(("serving", "profile", "uri"), CASES)
    def test_accepted_and_planned_by_the_operator(
        self, serving: ServingConfig, profile: ModelProfile, uri: str
    ) -> None:
        manifest = build_manifest(serving, profile, uri)
        plan = plan_service(parse_spec(manifest["spec"]))
        assert plan.warnings == []
        assert plan.memory.fits
        assert not plan.threads.oversubscribed
        assert (plan.threads.intra_op, plan.threads.inter_op) == (
            serving.intra_op_threads,
            serving.inter_op_threads,
        )
        assert plan.cpu_source == "limit"

    @pytest.mark.parametrize(("serving", "profile", "uri"), CASES)
    def test_operator_renders_the_exported_config(
        self, serving: ServingConfig, profile: ModelProfile, uri: str
    ) -> None:
        """The config.pbtxt the operator mounts is the one export wrote next to the model."""
        plan = plan_service(parse_spec(build_manifest(serving, profile, uri)["spec"]))
        assert plan.serving == serving
        assert render_model_config(plan.serving) == render_model_config(serving)

    @pytest.mark.parametrize(("serving", "profile", "uri"), CASES)
    def test_profile_in_camel_case(self, serving: ServingConfig, profile: ModelProfile, uri: str) -> None:
        written = build_manifest(serving, profile, uri)["spec"]["model"]["profile"]
        assert written == {
            "parameters": profile.parameters,
            "macsPerSample": profile.macs_per_sample,
            "weightBytes": profile.weight_bytes,
            "activationBytesPerSample": profile.activation_bytes_per_sample,
        }

    @pytest.mark.parametrize(("serving", "profile", "uri"), CASES)
    def test_memory_limit_above_the_estimate(self, serving: ServingConfig, profile: ModelProfile, uri: str) -> None:
        resources = build_manifest(serving, profile, uri)["spec"]["resources"]
        limit = parse_quantity(resources["limits"]["memory"])
        assert limit >= estimate(serving, profile) + RUNTIME_HEADROOM_BYTES
        assert limit < estimate(serving, profile) + RUNTIME_HEADROOM_BYTES + 2**20  # rounded up to whole Mi
        assert resources["requests"] == resources["limits"]  # Guaranteed QoS: what is measured is what is held

    def test_inception_numbers(self) -> None:
        spec = build_manifest(INCEPTION, INCEPTION_PROFILE, "pvc://models/inception_v3")["spec"]
        # 95269496 x 2 + 11063808 x 8 x 2 = 367559920 bytes; + 1Gi = 1441301744 bytes = 1374.5Mi -> 1375Mi
        assert spec["resources"]["limits"] == {"cpu": "4", "memory": "1375Mi"}  # 2 x (2 + 1 - 1) CPUs
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

"""The InferenceService spec: defaults a user may leave out; errors name the field and what is allowed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_core.threads import plan_threads
from inferop_operator.identity import API_VERSION
from inferop_operator.spec import InferenceServiceSpec, SpecError, parse_spec
from tests.specs import CLASSIFIER, EXAMPLES, MODEL, raw_spec


def with_model(**fields: Any) -> dict[str, Any]:
    spec = raw_spec()
    spec["model"].update(fields)
    return spec


def spec_error(raw: dict[str, Any]) -> str:
    with pytest.raises(SpecError) as error:
        parse_spec(raw)
    return str(error.value)


class TestDefaults:
    def test_minimal_spec_is_filled_in(self) -> None:
        spec = parse_spec(raw_spec())
        assert spec.replicas == 1
        assert spec.instances is None  # derived by the plan from the CPU budget
        assert spec.runtime.image is None
        assert (spec.resources.requests, spec.resources.limits) == ({}, {})
        assert (spec.threads.intra_op, spec.threads.inter_op, spec.threads.allow_oversubscription) == (
            None,
            None,
            False,
        )
        assert spec.batching.max_batch_size == 8
        assert spec.batching.max_queue_delay_microseconds == 2000
        assert spec.batching.max_queue_size is None  # derived by the plan from the measured capacity
        assert spec.model.profile.samples_per_cpu_second is None
        assert spec.runtime.memory_overhead is None  # the operator's setting applies
        assert spec.runtime.cpu_scheduling == "batch"
        assert spec.timeouts.request_seconds == 10.0
        assert spec.timeouts.startup_seconds == 300
        assert spec.autoscaling is None
        assert spec.gpu is None
        assert spec.model.inputs[0].datatype == "FP32"
        assert spec.model.outputs[0].label_filename is None

    def test_autoscaling_defaults(self) -> None:
        autoscaling = parse_spec(raw_spec(autoscaling={"maxReplicas": 3, "target": 70})).autoscaling
        assert autoscaling is not None
        assert (
            autoscaling.min_replicas,
            autoscaling.max_replicas,
            autoscaling.metric,
            autoscaling.target,
        ) == (
            1,
            3,
            "cpu",
            70,
        )

    def test_partial_section_keeps_other_defaults(self) -> None:
        spec = parse_spec(raw_spec(batching={"maxBatchSize": 32}))
        assert (spec.batching.max_batch_size, spec.batching.max_queue_delay_microseconds) == (32, 2000)
        assert spec.batching.max_queue_size is None

    def test_camel_case_fields_are_read(self) -> None:
        spec = parse_spec(
            raw_spec(
                threads={"intraOp": 3, "interOp": 2, "allowOversubscription": True},
                timeouts={"requestSeconds": 2.5, "startupSeconds": 60},
            )
        )
        assert (spec.threads.intra_op, spec.threads.inter_op, spec.threads.allow_oversubscription) == (
            3,
            2,
            True,
        )
        assert (spec.timeouts.request_seconds, spec.timeouts.startup_seconds) == (2.5, 60)
        assert spec.model.profile.activation_bytes_per_sample == 8

    @pytest.mark.parametrize(
        ("resources", "uses_gpu"),
        [
            ({}, False),
            ({"limits": {"nvidia.com/gpu": 1}}, True),
            ({"limits": {"nvidia.com/gpu": "2"}}, True),
            ({"limits": {"nvidia.com/gpu": 0}}, False),
            ({"requests": {"cpu": "2"}}, False),
        ],
    )
    def test_gpu_is_used_when_the_gpu_limit_is_positive(self, resources: dict[str, Any], uses_gpu: bool) -> None:
        assert parse_spec(raw_spec(resources=resources)).uses_gpu is uses_gpu

    @pytest.mark.parametrize(
        "uri",
        [
            "pvc://models",
            "pvc://models/inception_v3",
            "hostpath:///m",
            "oci://ghcr.io/x/m:1",
            "s3://models/team/inception_v3",
            "https://example.com/inception_v3.tar.gz",
        ],
    )
    def test_every_storage_scheme_is_accepted(self, uri: str) -> None:
        assert parse_spec(with_model(storageUri=uri)).model.storage_uri == uri


class TestErrors:
    def test_unknown_storage_scheme_names_it_and_the_allowed_ones(self) -> None:
        message = spec_error(with_model(storageUri="gs://bucket/conv_net"))
        assert message.startswith("spec.model.storageUri: ")
        assert "'gs'" in message
        for allowed in ("pvc://", "hostpath://", "oci://", "s3://", "https://"):
            assert allowed in message

    @pytest.mark.parametrize(
        ("model", "named"),
        [
            ({"storageUri": "s3://Models/x"}, "storageUri 's3://Models/x': bucket 'Models' must be"),
            ({"storageUri": "https://example.com/models/x/"}, "must be a tarball"),
            ({"storageUri": "pvc://models", "storage": {"attempts": 2}}, "storage is for s3:// and https:// models"),
            ({"storageUri": "s3://models/x", "storage": {"maxSize": "0"}}, "storage.maxSize: '0' must be at least"),
            ({"storageUri": "s3://models/x", "storage": {"endpoint": "minio:9000"}}, "spec.model.storage.endpoint"),
            ({"storageUri": "s3://models/x", "sha256": "ABC"}, "spec.model.sha256"),
        ],
    )
    def test_object_storage_mistakes_name_the_field(self, model: dict[str, Any], named: str) -> None:
        assert named in spec_error(with_model(**model))

    @pytest.mark.parametrize("uri", ["pvc:///models/conv_net", "pvc://Models/x", "pvc://-claim"])
    def test_pvc_without_a_claim_name(self, uri: str) -> None:
        message = spec_error(with_model(storageUri=uri))
        assert message.startswith("spec.model: ")
        assert "storageUri" in message
        assert "pvc://<claim-name>[/path]" in message

    def test_hostpath_must_be_absolute(self) -> None:
        message = spec_error(with_model(storageUri="hostpath://models/conv_net"))
        assert "storageUri" in message
        assert "hostpath:///absolute/path" in message

    def test_max_replicas_below_min_replicas(self) -> None:
        message = spec_error(raw_spec(autoscaling={"minReplicas": 3, "maxReplicas": 2, "target": 50}))
        assert message == "spec.autoscaling: maxReplicas (2) must be >= minReplicas (3)"

    @pytest.mark.parametrize(
        ("raw", "path"),
        [
            (raw_spec(replicaz=2), "spec.replicaz"),
            (raw_spec(batching={"maxBatch": 4}), "spec.batching.maxBatch"),
            (with_model(storage_uri="hostpath:///m"), "spec.model.storage_uri"),  # the wire form is camelCase
        ],
    )
    def test_unknown_field(self, raw: dict[str, Any], path: str) -> None:
        assert f"{path}: unknown field" in spec_error(raw)

    @pytest.mark.parametrize(
        ("agreement", "message"),
        [
            ({"tolerance": 0}, "spec.rollout.agreement.tolerance: Input should be greater than 0"),
            ({"minAgreement": 1}, "spec.rollout.agreement.minAgreement: Input should be less than 1"),
            ({"nearTieEpsilon": -1e-4}, "spec.rollout.agreement.nearTieEpsilon: Input should be greater than 0"),
            (
                {"minAgreement": 0.5, "tolerance": 0.6},
                "spec.rollout.agreement: tolerance (0.6) must be below minAgreement (0.5)",
            ),
            (
                {"maxSamples": 500},
                "spec.rollout.agreement: maxSamples (500) cannot decide at minAgreement 0.99 and tolerance 0.01: an "
                "identical model needs 591 inputs",
            ),
            ({"samples": 64}, "spec.rollout.agreement.samples: unknown field"),
        ],
    )
    def test_agreement_settings_name_the_field(self, agreement: dict[str, Any], message: str) -> None:
        assert spec_error(raw_spec(rollout={"agreement": agreement})) == message

    @pytest.mark.parametrize(
        ("analysis", "message"),
        [
            ({"maxP99Ratio": 1}, "spec.rollout.analysis.maxP99Ratio: Input should be greater than 1"),
            ({"maxP99Ratio": 0.8}, "spec.rollout.analysis.maxP99Ratio: Input should be greater than 1"),
            ({"maxP99Ratio": 101}, "spec.rollout.analysis.maxP99Ratio: Input should be less than or equal to 100"),
        ],
    )
    def test_the_p99_ratio_is_above_one(self, analysis: dict[str, Any], message: str) -> None:
        assert spec_error(raw_spec(rollout={"analysis": analysis})) == message

    @pytest.mark.parametrize(
        ("rollout", "message"),
        [
            (
                {"pauses": [{"atWeight": 30}]},
                "spec.rollout: pauses[0].atWeight 30 is not one of steps [5, 25, 50, 100]",
            ),
            (
                {"pauses": [{"atWeight": 25}, {"atWeight": 25, "seconds": 60}]},
                "spec.rollout: pauses hold at the weights [25, 25]: at most one pause a step",
            ),
            ({"pauses": [{"atWeight": 25, "seconds": 0}]}, "spec.rollout.pauses.0.seconds: Input should be greater"),
            ({"endStep": "step 2"}, "spec.rollout.endStep: String should match pattern"),
        ],
    )
    def test_pauses_and_end_step_name_what_is_wrong(self, rollout: dict[str, Any], message: str) -> None:
        assert spec_error(raw_spec(rollout=rollout)).startswith(message)

    def test_the_p99_ratio_defaults_to_one_and_a_half(self) -> None:
        rollout = parse_spec(raw_spec(rollout={})).rollout
        assert rollout is not None and rollout.analysis.max_p99_ratio == 1.5

    def test_too_few_samples_for_the_stated_error_rates(self) -> None:
        # 600 decide an identical model, but a candidate at the threshold is often undecided there.
        message = spec_error(raw_spec(rollout={"agreement": {"maxSamples": 600}}))
        assert message.startswith("spec: rollout.agreement.maxSamples: 600 inputs leave the check's error rates at")
        assert "above the 1% stated; give more, or a larger tolerance" in message

    @pytest.mark.parametrize("value", ["2Gb", "lots", "-"])
    def test_bad_quantity_names_the_resource(self, value: str) -> None:
        message = spec_error(raw_spec(resources={"limits": {"memory": value}}))
        assert "resources.limits.memory" in message
        assert repr(value) in message

    def test_bad_gpu_memory_names_it(self) -> None:
        message = spec_error(raw_spec(gpu={"memory": "sixteen"}))
        assert "gpu.memory" in message
        assert "spec.spec" not in message

    @pytest.mark.parametrize("cpu", ["0", "-1", "-500m"])
    def test_cpu_must_be_positive(self, cpu: str) -> None:
        """The thread budget is derived from it: zero or negative CPUs are an invalid spec, not a crash."""
        message = spec_error(raw_spec(resources={"limits": {"cpu": cpu}}))
        assert "resources.limits.cpu" in message

    def test_cpu_scheduling_lists_the_allowed_values(self) -> None:
        message = spec_error(raw_spec(runtime={"cpuScheduling": "fifo"}))
        assert message == "spec.runtime.cpuScheduling: Input should be 'batch' or 'normal'"

    @pytest.mark.parametrize(
        ("env", "said"),
        [
            ([{"name": "A", "value": "1"}, {"name": "OMP_NUM_THREADS", "value": "8"}],
             "spec.runtime.env: env[1].name OMP_NUM_THREADS is derived from spec.threads.intraOp; set that instead"),
            ([{"name": "A", "value": ""}, {"name": "A", "value": "2"}],
             "spec.runtime.env: env[1].name A is given twice"),
            ([{"name": "A"}], "spec.runtime.env.0.value: Field required"),
            ([{"name": "1A", "value": ""}], "spec.runtime.env.0.name: String should match pattern"),
            ([{"name": "A", "value": 1}], "spec.runtime.env.0.value: Input should be a valid string"),
        ],
    )  # fmt: skip
    def test_environment_variables_are_named_once_and_leave_the_derived_ones(
        self, env: list[dict[str, Any]], said: str
    ) -> None:
        assert spec_error(raw_spec(runtime={"env": env})).startswith(said)

    def test_metric_lists_the_allowed_values(self) -> None:
        message = spec_error(raw_spec(autoscaling={"maxReplicas": 3, "metric": "gpuUtilisation", "target": 50}))
        assert message == "spec.autoscaling.metric: Input should be 'cpu', 'queueTime' or 'pendingRequests'"

    @pytest.mark.parametrize(
        ("raw", "path"),
        [
            (raw_spec(batching={"maxBatchSize": -1}), "spec.batching.maxBatchSize"),
            (raw_spec(batching={"maxQueueSize": 0}), "spec.batching.maxQueueSize"),
            (raw_spec(runtime={"memoryOverhead": "-1Gi"}), "spec.runtime.memoryOverhead"),
            (raw_spec(runtime={"memoryOverhead": "lots"}), "spec.runtime.memoryOverhead"),
            (
                with_model(profile={**MODEL["profile"], "samplesPerCpuSecond": 0}),
                "spec.model.profile.samplesPerCpuSecond",
            ),
            (raw_spec(threads={"intraOp": 0}), "spec.threads.intraOp"),
            (raw_spec(instances=0), "spec.instances"),
            (raw_spec(timeouts={"requestSeconds": 0}), "spec.timeouts.requestSeconds"),
            (raw_spec(timeouts={"startupSeconds": 1}), "spec.timeouts.startupSeconds"),
            (raw_spec(autoscaling={"target": 50}), "spec.autoscaling.maxReplicas"),
            (with_model(name="conv net"), "spec.model.name"),
            (with_model(inputs=[]), "spec.model.inputs"),
            (with_model(inputs=[{"name": "board", "dims": [1, -2]}]), "spec.model.inputs.0.dims.1"),
            (with_model(inputs=[{"name": "board", "dims": [1, 0]}]), "spec.model.inputs.0.dims"),
            (with_model(inputs=[{"name": "board", "dims": [1, -1]}]), "spec.model"),
            (with_model(outputs=[{"name": "board", "dims": [1]}]), "spec.model"),
            (
                with_model(outputs=[{"name": "p", "datatype": "FP8", "dims": [7]}]),
                "spec.model.outputs.0.datatype",
            ),
        ],
    )
    def test_out_of_range_names_the_camel_case_path(self, raw: dict[str, Any], path: str) -> None:
        assert spec_error(raw).startswith(f"{path}: ")

    def test_missing_profile(self) -> None:
        raw = raw_spec()
        del raw["model"]["profile"]
        assert spec_error(raw) == "spec.model.profile: Field required"

    def test_every_problem_is_listed(self) -> None:
        message = spec_error(raw_spec(batching={"maxBatchSize": -1}, instances=0))
        assert "spec.batching.maxBatchSize" in message
        assert "spec.instances" in message

    @pytest.mark.parametrize("raw", [None, {}])
    def test_empty_spec_asks_for_the_model(self, raw: Any) -> None:
        assert spec_error(raw) == "spec.model: Field required"

    def test_is_a_value_error(self) -> None:
        assert issubclass(SpecError, ValueError)


def _manifests(folder: Path) -> list[Any]:
    paths = sorted(folder.glob("*.yaml"))
    assert paths, f"no examples in {folder}"
    return [pytest.param(path, id=path.name) for path in paths]


class TestExamples:
    @pytest.mark.parametrize("path", _manifests(EXAMPLES) + _manifests(EXAMPLES / "refused"))
    def test_accepted_examples_parse(self, path: Path) -> None:
        manifest = yaml.safe_load(path.read_text())
        assert manifest["kind"] == "InferenceService"
        assert manifest["apiVersion"] == API_VERSION
        assert isinstance(parse_spec(manifest["spec"]), InferenceServiceSpec)

    @pytest.mark.parametrize("path", _manifests(EXAMPLES / "invalid"))
    def test_invalid_examples_are_rejected(self, path: Path) -> None:
        with pytest.raises(SpecError, match=r"^spec\."):
            parse_spec(yaml.safe_load(path.read_text())["spec"])


class TestPipeline:
    def test_defaults_and_the_members_config(self) -> None:
        spec = parse_spec(raw_spec(model=CLASSIFIER, pipeline={}))
        assert spec.pipeline is not None
        assert (spec.pipeline.top_k, spec.pipeline.max_image_bytes_count) == (5, 8 * 2**20)
        model = spec.serving_config(plan_threads(2, None), 40)
        pipeline = spec.pipeline_config(model, pre_instances=2)
        assert pipeline is not None and pipeline.name == "inception_v3"
        assert pipeline.model.name == "inception_v3_model" and pipeline.model.max_queue_size == 40
        assert pipeline.pre_instances == 2 and pipeline.members["post"] == "inception_v3_post"
        assert parse_spec(raw_spec(model=CLASSIFIER)).pipeline_config(model, 1) is None

    @pytest.mark.parametrize(
        ("model", "pipeline", "message"),
        [
            (MODEL, {}, "pipeline: model 'conv_net': an image pipeline needs processing kind imageClassification"),
            ({**CLASSIFIER, "outputs": [{"name": "logits", "dims": [1000]}]}, {}, "with labels"),
            ({**CLASSIFIER, "inputs": [{"name": "images", "dims": [3, 299, 224]}]}, {}, "one input of 3 x N x N"),
            (CLASSIFIER, {"topK": 1001}, "spec.pipeline.topK: Input should be less than or equal to 1000"),
            ({**CLASSIFIER, "outputs": [{"name": "logits", "dims": [3], "labelFilename": "l"}]}, {"topK": 5}, "topK 5"),
            (CLASSIFIER, {"maxImageBytes": "0"}, "spec.pipeline.maxImageBytes: '0' must be at least one byte"),
            (CLASSIFIER, {"maxImageBytes": "lots"}, "spec.pipeline.maxImageBytes"),
            (CLASSIFIER, {"input": "audio"}, "spec.pipeline.input: Input should be 'image'"),
            (CLASSIFIER, {"preInstances": 0}, "spec.pipeline.preInstances"),
            (CLASSIFIER, {"imagesPerCpuSecond": 0}, "spec.pipeline.imagesPerCpuSecond"),
        ],
    )
    def test_mistakes_name_the_field(self, model: dict[str, Any], pipeline: dict[str, Any], message: str) -> None:
        assert message in spec_error(raw_spec(model=model, pipeline=pipeline))

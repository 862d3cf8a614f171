"""The config.pbtxt renderer: what a user sets is what Triton reads, and bad settings name their field."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2 as mc

from inferop_core.tritonconfig import (
    ONNX_PLATFORM,
    WEIGHTS_PARAMETER,
    ServingConfig,
    TensorSpec,
    build_model_config,
    parse_model_config,
    random_weights,
    read_serving_config,
    render_model_config,
    weights_are_random,
)

BOARD = TensorSpec(name="board", dims=(1, 8, 7))
POLICY = TensorSpec(name="policy", dims=(7,))
VALUE = TensorSpec(name="value", dims=(1,))
IMAGES = TensorSpec(name="images", dims=(3, 299, 299))
LOGITS = TensorSpec(name="logits", dims=(1000,), label_filename="labels.txt")

SPECS = {
    "board model, defaults": ServingConfig(name="conv_net", inputs=(BOARD,), outputs=(POLICY, VALUE)),
    "image model on GPU": ServingConfig(
        name="inception_v3",
        inputs=(IMAGES,),
        outputs=(LOGITS,),
        max_batch_size=32,
        instances=3,
        device="gpu",
        max_queue_delay_microseconds=750,
        max_queue_size=5,
        request_timeout_microseconds=250_000,
        intra_op_threads=4,
        inter_op_threads=2,
        gpu_memory_limit_bytes=3 * 2**30,
    ),
    "batch of one": ServingConfig(
        name="single", inputs=(BOARD,), outputs=(VALUE,), max_batch_size=1, max_queue_delay_microseconds=0
    ),
}


def rendered(cfg: ServingConfig) -> mc.ModelConfig:
    """What Triton reads: the config.pbtxt text parsed back."""
    return parse_model_config(render_model_config(cfg))


@pytest.mark.parametrize("cfg", SPECS.values(), ids=SPECS.keys())
class TestRenderModelConfig:
    def test_is_an_onnx_runtime_model_with_its_batch_limit(self, cfg: ServingConfig) -> None:
        config = rendered(cfg)
        assert config.name == cfg.name
        assert config.platform == ONNX_PLATFORM
        assert config.max_batch_size == cfg.max_batch_size

    def test_tensors_keep_names_types_and_dims(self, cfg: ServingConfig) -> None:
        config = rendered(cfg)
        for specs, tensors in ((cfg.inputs, config.input), (cfg.outputs, config.output)):
            assert [(t.name, list(t.dims)) for t in tensors] == [(s.name, list(s.dims)) for s in specs]
            assert all(t.data_type == mc.TYPE_FP32 for t in tensors)

    def test_label_file_only_on_the_labelled_output(self, cfg: ServingConfig) -> None:
        config = rendered(cfg)
        assert [o.label_filename for o in config.output] == [s.label_filename or "" for s in cfg.outputs]

    def test_instance_group_count_and_kind(self, cfg: ServingConfig) -> None:
        (group,) = rendered(cfg).instance_group
        assert group.count == cfg.instances
        expected = mc.ModelInstanceGroup.KIND_GPU if cfg.device == "gpu" else mc.ModelInstanceGroup.KIND_CPU
        assert group.kind == expected

    @pytest.mark.parametrize(("instances", "take_turns", "executing"), [(1, False, 1), (2, False, 2), (2, True, 1)])
    def test_instances_taking_turns_execute_one_at_a_time(
        self, cfg: ServingConfig, instances: int, take_turns: bool, executing: int
    ) -> None:
        assert cfg.model_copy(update={"instances": instances, "take_turns": take_turns}).executing == executing

    def test_dynamic_batching_and_bounded_rejecting_queue(self, cfg: ServingConfig) -> None:
        batching = rendered(cfg).dynamic_batching
        assert batching.max_queue_delay_microseconds == cfg.max_queue_delay_microseconds
        policy = batching.default_queue_policy
        assert policy.timeout_action == mc.ModelQueuePolicy.REJECT
        assert policy.default_timeout_microseconds == cfg.request_timeout_microseconds
        assert policy.allow_timeout_override is True
        assert policy.max_queue_size == cfg.max_queue_size

    def test_thread_counts_as_onnx_runtime_parameters(self, cfg: ServingConfig) -> None:
        parameters = rendered(cfg).parameters
        assert parameters["intra_op_thread_count"].string_value == str(cfg.intra_op_threads)
        assert parameters["inter_op_thread_count"].string_value == str(cfg.inter_op_threads)
        # The ONNX Runtime backend uses the inter-op pool only in parallel execution mode.
        assert parameters["execution_mode"].string_value == ("1" if cfg.inter_op_threads > 1 else "0")

    def test_warmup_at_batch_one_and_max_with_the_real_input_dims(self, cfg: ServingConfig) -> None:
        warmups = rendered(cfg).model_warmup
        assert sorted(w.batch_size for w in warmups) == sorted({1, cfg.max_batch_size})
        for warmup in warmups:
            assert set(warmup.inputs) == {s.name for s in cfg.inputs}
            for spec in cfg.inputs:
                data = warmup.inputs[spec.name]
                assert list(data.dims) == list(spec.dims)
                assert data.data_type == mc.TYPE_FP32
                assert data.random_data

    def test_text_is_the_built_message(self, cfg: ServingConfig) -> None:
        assert rendered(cfg) == build_model_config(cfg)


class TestUnsetSettings:
    """None leaves a setting out of config.pbtxt, so the backend's or Triton's own default applies."""

    @staticmethod
    def config(**changes: Any) -> ServingConfig:
        return ServingConfig(name="m", inputs=(BOARD,), outputs=(POLICY, VALUE), **changes)

    def test_unset_thread_counts_are_left_to_the_backend(self) -> None:
        cfg = self.config(intra_op_threads=None, inter_op_threads=None)
        parameters = rendered(cfg).parameters
        for name in ("intra_op_thread_count", "inter_op_thread_count", "execution_mode"):
            assert name not in parameters
            assert name not in render_model_config(cfg)

    def test_only_the_unset_count_is_left_out(self) -> None:
        parameters = rendered(self.config(intra_op_threads=None, inter_op_threads=2)).parameters
        assert "intra_op_thread_count" not in parameters
        assert parameters["inter_op_thread_count"].string_value == "2"
        assert parameters["execution_mode"].string_value == "1"
        parameters = rendered(self.config(intra_op_threads=3, inter_op_threads=None)).parameters
        assert parameters["intra_op_thread_count"].string_value == "3"
        assert "inter_op_thread_count" not in parameters

    def test_no_queue_bound_and_no_timeout_is_tritons_default_policy(self) -> None:
        cfg = self.config(max_queue_size=None, request_timeout_microseconds=None)
        batching = rendered(cfg).dynamic_batching
        assert not batching.HasField("default_queue_policy")  # unbounded, and requests wait forever
        assert "default_queue_policy" not in render_model_config(cfg)
        assert batching.max_queue_delay_microseconds == cfg.max_queue_delay_microseconds

    def test_a_queue_bound_without_a_timeout(self) -> None:
        policy = rendered(self.config(max_queue_size=24, request_timeout_microseconds=None)).dynamic_batching
        assert policy.default_queue_policy.max_queue_size == 24
        assert policy.default_queue_policy.default_timeout_microseconds == 0  # no timeout
        assert not policy.default_queue_policy.allow_timeout_override

    def test_a_timeout_without_a_queue_bound(self) -> None:
        policy = rendered(self.config(max_queue_size=None, request_timeout_microseconds=500_000)).dynamic_batching
        assert policy.default_queue_policy.max_queue_size == 0  # unbounded
        assert policy.default_queue_policy.default_timeout_microseconds == 500_000
        assert policy.default_queue_policy.timeout_action == mc.ModelQueuePolicy.REJECT


class TestMemoryPattern:
    @pytest.mark.parametrize("cfg", SPECS.values(), ids=SPECS.keys())
    def test_off_by_default(self, cfg: ServingConfig) -> None:
        assert rendered(cfg).parameters["enable_mem_pattern"].string_value == "0"

    def test_left_to_onnx_runtime_when_asked_for(self) -> None:
        cfg = ServingConfig(name="m", inputs=(BOARD,), outputs=(VALUE,), memory_pattern=True)
        assert "enable_mem_pattern" not in rendered(cfg).parameters


class TestWeights:
    """Where the weights came from travels in the config, where Triton's model-config endpoint shows it."""

    @pytest.mark.parametrize("weights", [random_weights(0), random_weights(12), "inception_v3.pth, sha256 0123abcd"])
    def test_written_as_a_parameter(self, weights: str) -> None:
        cfg = ServingConfig(name="m", inputs=(BOARD,), outputs=(VALUE,), weights=weights)
        assert rendered(cfg).parameters[WEIGHTS_PARAMETER].string_value == weights

    @pytest.mark.parametrize("cfg", SPECS.values(), ids=SPECS.keys())
    def test_unknown_weights_are_not_written(self, cfg: ServingConfig) -> None:
        assert WEIGHTS_PARAMETER not in rendered(cfg).parameters

    @pytest.mark.parametrize(
        ("weights", "random"),
        [
            (random_weights(0), True),
            (random_weights(-7), True),
            ("random (seed 0).pth, sha256 0123abcd", False),  # a file whose name starts like random weights
            ("inception_v3.pth, sha256 0123abcd", False),
            ("random", False),
        ],
    )
    def test_random_weights_are_recognised(self, weights: str, random: bool) -> None:
        assert weights_are_random(weights) is random


class TestModelsUsersBring:
    """What a user's model may be: several inputs of other types, no batch axis, an output whose size varies."""

    IDS = TensorSpec(name="ids", datatype="INT64", dims=(16,))
    MASK = TensorSpec(name="mask", datatype="BOOL", dims=(16,))

    def test_integer_and_boolean_inputs_warm_up_on_zeros_floats_on_random_data(self) -> None:
        cfg = ServingConfig(name="m", inputs=(BOARD, self.IDS, self.MASK), outputs=(VALUE,))
        for warmup in rendered(cfg).model_warmup:
            assert warmup.inputs["board"].random_data and not warmup.inputs["board"].zero_data
            # Random integers would index past an embedding table and fail the model's load.
            assert warmup.inputs["ids"].zero_data and not warmup.inputs["ids"].random_data
            assert warmup.inputs["mask"].zero_data

    def test_without_a_batch_axis_one_request_warms_up_and_dims_are_the_full_shape(self) -> None:
        full = TensorSpec(name="x", dims=(1, 2, 4, 4))
        config = rendered(ServingConfig(name="m", inputs=(full,), outputs=(VALUE,), max_batch_size=0))
        assert config.max_batch_size == 0
        assert list(config.input[0].dims) == [1, 2, 4, 4]
        assert [w.batch_size for w in config.model_warmup] == [1]
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 64  # still bounded

    def test_an_output_dim_may_vary(self) -> None:
        head = TensorSpec(name="head", dims=(-1,))
        assert list(rendered(ServingConfig(name="m", inputs=(BOARD,), outputs=(head,))).output[0].dims) == [-1]
        assert head.bytes_per_sample == 4  # counted as 1; export measures what it really is

    def test_an_input_dim_may_not_vary(self) -> None:
        with pytest.raises(ValidationError, match=r"inputs \['tokens'\] have a dynamic dim"):
            ServingConfig(name="m", inputs=(TensorSpec(name="tokens", dims=(-1,)),), outputs=(VALUE,))

    def test_the_declared_processing_is_written_as_json(self) -> None:
        from inferop_core.processing import PROCESSING_PARAMETER, Processing

        processing = Processing(kind="policyValue")
        cfg = ServingConfig(name="m", inputs=(BOARD,), outputs=(VALUE,), processing=processing)
        text = rendered(cfg).parameters[PROCESSING_PARAMETER].string_value
        assert Processing.from_parameter(text) == processing
        assert PROCESSING_PARAMETER not in rendered(cfg.model_copy(update={"processing": None})).parameters


class TestTensorSpec:
    @pytest.mark.parametrize(
        ("spec", "size"),
        [
            (BOARD, 1 * 8 * 7 * 4),
            (IMAGES, 3 * 299 * 299 * 4),
            (TensorSpec(name="ids", datatype="INT64", dims=(128,)), 128 * 8),
            (TensorSpec(name="half", datatype="FP16", dims=(2, 3)), 6 * 2),
            (TensorSpec(name="mask", datatype="BOOL", dims=(10,)), 10),
        ],
    )
    def test_bytes_per_sample(self, spec: TensorSpec, size: int) -> None:
        assert spec.bytes_per_sample == size


class TestServingConfigValidation:
    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"max_batch_size": -1}, "max_batch_size"),
            ({"instances": 0}, "instances"),
            ({"device": "tpu"}, "device"),
            ({"intra_op_threads": 0}, "intra_op_threads"),
            ({"max_queue_size": 0}, "max_queue_size"),
            ({"request_timeout_microseconds": 0}, "request_timeout_microseconds"),
            ({"name": "has space"}, "name"),
            ({"outputs": ()}, "outputs"),
            ({"max_batch_sise": 8}, "max_batch_sise"),
        ],
    )
    def test_error_names_the_field(self, changes: dict[str, Any], field: str) -> None:
        settings: dict[str, Any] = {"name": "m", "inputs": (BOARD,), "outputs": (VALUE,), **changes}
        with pytest.raises(ValidationError) as error:
            ServingConfig(**settings)
        assert field in str(error.value)

    def test_duplicate_tensor_names_are_named(self) -> None:
        with pytest.raises(ValidationError, match=r"distinct.*'board'"):
            ServingConfig(name="m", inputs=(BOARD,), outputs=(TensorSpec(name="board", dims=(1,)),))

    def test_dims_with_zero_name_the_tensor_and_dims(self) -> None:
        with pytest.raises(ValidationError, match=r"tensor 'board'.*dim.*\[1, 0, 7\]"):
            TensorSpec(name="board", dims=(1, 0, 7))

    def test_empty_dims_are_refused(self) -> None:
        with pytest.raises(ValidationError, match="dims"):
            TensorSpec(name="board", dims=())


class TestParseModelConfig:
    def test_a_misspelt_field_is_named(self) -> None:
        with pytest.raises(text_format.ParseError, match="max_batch_sise"):
            parse_model_config('name: "m"\nmax_batch_sise: 8\n')


@pytest.mark.parametrize("cfg", SPECS.values(), ids=SPECS.keys())
def test_gpu_instances_get_the_cuda_arena_options_where_the_backend_keeps_them(cfg: ServingConfig) -> None:
    """Top-level parameters, not the `cuda` execution accelerator: the backend overwrites the accelerator's memory
    options with its defaults whenever the config has a parameters section, and ours always has one."""
    parameters = {key: value.string_value for key, value in rendered(cfg).parameters.items()}
    if cfg.device == "gpu":
        assert parameters["arena_extend_strategy"] == "1"  # kSameAsRequested
        assert parameters["gpu_mem_limit"] == str(cfg.gpu_memory_limit_bytes)
    else:
        assert "arena_extend_strategy" not in parameters and "gpu_mem_limit" not in parameters


def test_a_gpu_memory_limit_needs_gpu_instances() -> None:
    with pytest.raises(ValidationError, match="gpu_memory_limit_bytes applies to GPU instances only"):
        ServingConfig(name="m", inputs=(BOARD,), outputs=(VALUE,), gpu_memory_limit_bytes=2**30)


@pytest.mark.parametrize("cfg", SPECS.values(), ids=SPECS.keys())
def test_a_rendered_config_reads_back_into_its_settings(cfg: ServingConfig) -> None:
    assert read_serving_config(rendered(cfg)) == cfg

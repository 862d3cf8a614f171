"""The config.pbtxt renderer: what a user sets is what Triton reads, and bad settings name their field."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2 as mc

from inferop.tritonconfig import (
    ONNX_PLATFORM,
    ServingConfig,
    TensorSpec,
    build_model_config,
    parse_model_config,
    render_model_config,
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


class TestServingConfigValidation:
    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"max_batch_size": 0}, "max_batch_size"),
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

"""The one renderer of Triton's `config.pbtxt`, shared by export, the operator and local serving.

The config is built as Triton's own `ModelConfig` protobuf and written in protobuf text format, so every
field name is checked against Triton's schema rather than trusted to a string template.
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Literal

from google.protobuf import text_format
from pydantic import BaseModel, ConfigDict, Field, model_validator

from inferop_core.errors import InferopError
from inferop_core.processing import PROCESSING_PARAMETER, Processing
from inferop_core.threads import THREAD_ENV


def load_model_config_protobuf() -> ModuleType:
    """Triton's `model_config_pb2` without the gRPC client around it: importing `tritonclient.grpc` loads grpc
    and numpy (53 MB resident), which the operator, rendering configs only, would carry for its whole life.

    Registered under its own name, so a later `import tritonclient.grpc` finds this module and protobuf sees
    the schema once."""
    name = "tritonclient.grpc.model_config_pb2"
    if name not in sys.modules:
        package = importlib.util.find_spec("tritonclient.grpc")
        assert package and package.submodule_search_locations, "tritonclient[grpc] is installed"
        source = Path(next(iter(package.submodule_search_locations))) / "model_config_pb2.py"
        spec = importlib.util.spec_from_file_location(name, source)
        assert spec and spec.loader
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[name]


if TYPE_CHECKING:
    from tritonclient.grpc import model_config_pb2 as mc
else:
    mc = load_model_config_protobuf()

ONNX_PLATFORM = "onnxruntime_onnx"
MODEL_FILENAME = "model.onnx"
# The validation set inferop export records beside the model (its --validation inputs): a rollout's agreement check
# sends it first.
VALIDATION_FILENAME = "validation.npz"
# Where the served weights came from, as a config parameter so that any caller can read it from Triton's
# model-config endpoint next to the labels it is about to show. Triton's ONNX Runtime backend looks up only the
# parameter names it knows (`src/onnxruntime.cc`), as does `inferop/serving/model.py`, so it changes nothing served.
WEIGHTS_PARAMETER = "inferop_weights"
# The model file's SHA-256 as export wrote it, read back by a fetch from object storage to refuse a changed file.
MODEL_SHA256_PARAMETER = "inferop_model_sha256"
SHA256_PATTERN = r"^[0-9a-f]{64}$"

# Triton's tensor datatypes (as the V2 protocol spells them) that ONNX models served here use.
Datatype = Literal["FP32", "FP16", "BF16", "FP64", "INT64", "INT32", "INT8", "UINT8", "BOOL"]
DATATYPE_BYTES: dict[str, int] = {
    "FP32": 4, "FP16": 2, "BF16": 2, "FP64": 8, "INT64": 8, "INT32": 4, "INT8": 1, "UINT8": 1, "BOOL": 1
}  # fmt: skip
# Tensor names as ONNX exporters write them and Triton's config and HTTP/JSON protocol carry them unescaped.
TENSOR_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.:/-]*$"
# Triton's spelling of a dim whose size each response decides (an output only: inputs are fixed here).
DYNAMIC_DIM = -1


class TensorSpec(BaseModel):
    """One model input or output; `dims` exclude the batch axis, as Triton's config does (a model without a
    batch axis, max_batch_size 0, has its full shape here). An output's dim may be -1: its size varies."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, max_length=256, pattern=TENSOR_NAME_PATTERN)
    datatype: Datatype = "FP32"
    dims: tuple[int, ...] = Field(min_length=1)
    label_filename: str | None = Field(
        default=None, description="class names, one a line, for Triton's classification extension (outputs only)"
    )

    @property
    def dynamic(self) -> bool:
        return DYNAMIC_DIM in self.dims

    @property
    def bytes_per_sample(self) -> int:
        """Bytes of one sample; a dynamic dim counts as 1 (the profile's measured ioBytesPerSample is better)."""
        return math.prod(max(d, 1) for d in self.dims) * DATATYPE_BYTES[self.datatype]

    @model_validator(mode="after")
    def _positive_dims(self) -> TensorSpec:
        if any(d < 1 and d != DYNAMIC_DIM for d in self.dims):
            raise ValueError(f"tensor {self.name!r}: every dim must be >= 1, or -1 if dynamic (got {list(self.dims)})")
        return self


# Instances that take turns each need this resource's one unit. Every tritonserver inferop starts runs the rate limiter
# (RATE_LIMIT_ARG); with no resource given on the command line Triton makes available the most any instance needs, 1.
# Instances that need no resource are not limited.
EXECUTION_RESOURCE = "inferop_execution"
RATE_LIMIT_ARG = "--rate-limit=execution_count"


class ServingConfig(BaseModel):
    """Everything that goes into one model's `config.pbtxt`: the single source for all three renderings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    inputs: tuple[TensorSpec, ...] = Field(min_length=1)
    outputs: tuple[TensorSpec, ...] = Field(min_length=1)
    max_batch_size: int = Field(default=8, ge=0, le=4096, description="0: the model has no batch axis")
    instances: int = Field(default=1, ge=1, le=256)
    take_turns: bool = Field(
        default=False,
        description=(
            f"the instances execute one at a time: each needs the one unit of the rate limiter's resource "
            f"{EXECUTION_RESOURCE!r} (the server runs with {RATE_LIMIT_ARG}), so the others hold the next batches "
            "without taking CPU from the one executing"
        ),
    )
    device: Literal["cpu", "gpu"] = "cpu"
    max_queue_delay_microseconds: int = Field(default=2000, ge=0)
    max_queue_size: int | None = Field(
        default=64,
        ge=1,
        description="bounded queue: requests beyond it are rejected; None: unbounded (Triton's default)",
    )
    request_timeout_microseconds: int | None = Field(
        default=10_000_000,
        ge=1,
        description="time a request may wait in the queue before it is rejected; None: forever (Triton's default)",
    )
    intra_op_threads: int | None = Field(
        default=1, ge=1, description="None: not written, so the backend's default (ONNX Runtime: a thread per core)"
    )
    inter_op_threads: int | None = Field(default=1, ge=1, description="None: the backend's default")
    weights: str | None = Field(
        default=None,
        min_length=1,
        description=(
            f"where the weights came from, written as the parameter {WEIGHTS_PARAMETER!r}: `random_weights(seed)` "
            "or a file's name and digest; None: not written (unknown)"
        ),
    )
    processing: Processing | None = Field(
        default=None,
        description=f"how callers make inputs and read outputs, written as the parameter {PROCESSING_PARAMETER!r}",
    )
    model_sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description=f"the model file's SHA-256, written as the parameter {MODEL_SHA256_PARAMETER!r}; None: not written",
    )
    gpu_memory_limit_bytes: int | None = Field(
        default=None,
        ge=1,
        description=(
            "GPU instances: the most device memory each instance's ONNX Runtime CUDA arena may take (the backend's "
            "gpu_mem_limit), so an allocation beyond it fails one request instead of exhausting the device"
        ),
    )
    memory_pattern: bool = Field(
        default=False,
        description=(
            "ONNX Runtime's memory pattern: it plans and keeps an allocation per input shape, and with dynamic "
            "batching every batch size is a new shape, so memory grows with the variety of traffic (measured: "
            "+60% of Inception V3's peak at maxBatchSize 8). Off unless asked for; True is ONNX Runtime's default."
        ),
    )

    @model_validator(mode="after")
    def _distinct_tensor_names(self) -> ServingConfig:
        names = [t.name for t in (*self.inputs, *self.outputs)]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"tensor names must be distinct; repeated: {duplicates}")
        dynamic = [t.name for t in self.inputs if t.dynamic]
        if dynamic:
            raise ValueError(f"inputs {dynamic} have a dynamic dim: warm-up and the memory estimate need fixed ones")
        if self.gpu_memory_limit_bytes is not None and self.device != "gpu":
            raise ValueError("gpu_memory_limit_bytes applies to GPU instances only (device 'gpu')")
        return self

    @property
    def executing(self) -> int:
        """Instances that compute at once: one where they take turns."""
        return 1 if self.take_turns else self.instances

    @property
    def warmup_batch_sizes(self) -> tuple[int, ...]:
        """Warm up at batch 1 and at the largest batch, so the first real requests and the memory peak
        are both paid for at load time, not by a caller (a model without a batch axis: one request)."""
        return tuple(sorted({1, max(self.max_batch_size, 1)}))


def build_model_config(cfg: ServingConfig) -> mc.ModelConfig:
    """The Triton `ModelConfig` message for an ONNX model served by ONNX Runtime."""
    config = mc.ModelConfig(name=cfg.name, platform=ONNX_PLATFORM, max_batch_size=cfg.max_batch_size)
    for spec in cfg.inputs:
        config.input.add(name=spec.name, data_type=_triton_type(spec.datatype), dims=list(spec.dims))
    for spec in cfg.outputs:
        output = config.output.add(name=spec.name, data_type=_triton_type(spec.datatype), dims=list(spec.dims))
        if spec.label_filename:
            output.label_filename = spec.label_filename
    kind = mc.ModelInstanceGroup.KIND_GPU if cfg.device == "gpu" else mc.ModelInstanceGroup.KIND_CPU
    group = config.instance_group.add(count=cfg.instances, kind=kind)
    if cfg.take_turns:
        group.rate_limiter.resources.add(name=EXECUTION_RESOURCE, count=1)

    config.dynamic_batching.max_queue_delay_microseconds = cfg.max_queue_delay_microseconds
    _queue_policy(config, cfg)

    # The ONNX Runtime backend's own parameter names; our local python-backend model reads the same ones.
    # An unset count is left out, so the backend picks ONNX Runtime's default.
    if cfg.intra_op_threads is not None:
        config.parameters["intra_op_thread_count"].string_value = str(cfg.intra_op_threads)
    if cfg.inter_op_threads is not None:
        config.parameters["inter_op_thread_count"].string_value = str(cfg.inter_op_threads)
        # The backend runs operators one at a time, ignoring the inter-op pool, unless execution_mode is 1.
        config.parameters["execution_mode"].string_value = "1" if cfg.inter_op_threads > 1 else "0"
    if not cfg.memory_pattern:
        config.parameters["enable_mem_pattern"].string_value = "0"
    if cfg.device == "gpu":
        # The CUDA provider's options as top-level parameters: the backend reads these after any
        # `gpu_execution_accelerator` options and, with a parameters section present, overwrites the absent ones
        # with its defaults (no memory limit, an arena growing in powers of two), so only here do they hold.
        # kSameAsRequested: the arena grows by what is asked, not to the next power of two, so the estimate holds.
        config.parameters["arena_extend_strategy"].string_value = "1"
        if cfg.gpu_memory_limit_bytes is not None:
            config.parameters["gpu_mem_limit"].string_value = str(cfg.gpu_memory_limit_bytes)
    if cfg.weights is not None:
        config.parameters[WEIGHTS_PARAMETER].string_value = cfg.weights
    if cfg.processing is not None:
        config.parameters[PROCESSING_PARAMETER].string_value = cfg.processing.to_parameter()
    if cfg.model_sha256 is not None:
        config.parameters[MODEL_SHA256_PARAMETER].string_value = cfg.model_sha256

    for batch in cfg.warmup_batch_sizes:
        warmup = config.model_warmup.add(name=f"warmup_batch_{batch}", batch_size=batch)
        for spec in cfg.inputs:
            data = warmup.inputs[spec.name]
            data.data_type = _triton_type(spec.datatype)
            data.dims.extend(spec.dims)
            # Random integers would index past any embedding table or vocabulary: integer inputs get zeros.
            if spec.datatype.startswith("FP") or spec.datatype == "BF16":
                data.random_data = True
            else:
                data.zero_data = True
    return config


# An image classifier behind a pipeline: callers send JPEG or PNG bytes to the ensemble, which runs the stages of
# PIPELINE_BACKEND (a python-based backend: Triton's python backend running inferop/serving/pipeline.py, which the
# image holds as backends/inferop_pipeline/model.py) around the model. Each stage reads its tensors' names from its
# config and its settings from the parameters below.
ENSEMBLE_PLATFORM = "ensemble"
PIPELINE_BACKEND = "inferop_pipeline"
STAGE_PARAMETER = "inferop_stage"
PIPELINE_PARAMETER = "inferop_pipeline"
IMAGE_INPUT = "IMAGE"
PIXELS = "PIXELS"
SCORES = "SCORES"
LABELS_OUTPUT = "LABELS"
PROBABILITIES_OUTPUT = "PROBABILITIES"
PIPELINE_MEMBERS = ("pre", "model", "post")  # in the order the ensemble runs them

# Each stage runs one thread (the plan counts one a decoding instance). Triton's python stub imports numpy, which starts
# OpenBLAS with the container's thread variables (the model's intra-op count), before the stage's code runs; so each
# stage's directory holds its own stub, which Triton's python backend runs in place of the backend's
# (<model directory>/triton_python_backend_stub): it sets every variable to one and hands over to the backend's stub,
# whose directory Triton passes as the sixth argument. Triton first runs a stub without arguments and takes any exit
# status but the 1 of its own for a missing execute bit, which it then tries to set (Triton 2.51's stub_launcher.cc):
# this one answers 1 there too.
STAGE_STUB = "triton_python_backend_stub"
STAGE_STUB_SCRIPT = f"""#!/bin/sh
# inferop: an image pipeline's stage runs one thread in every math library, whatever the model's count.
[ "$#" -gt 0 ] || exit 1
export {" ".join(f"{variable}=1" for variable in THREAD_ENV)}
exec "$6/{STAGE_STUB}" "$@"
"""


# What a pipeline refuses unless its spec says otherwise; inferop/serving/pipeline.py, which cannot import this module
# in Triton's python stub, holds the same numbers (tests/runtime/test_pipeline.py checks that they agree).
DEFAULT_TOP_K = 5
# One top-k instance keeps up with any model: it reads a row of scores (microseconds an image).
TOP_K_INSTANCES = 1
# A 24-megapixel camera's photograph (6000 x 4000) is a JPEG of 4-8 MB at usual qualities; every byte and pixel allowed
# is memory the plan sets aside for each request and each decoding instance (inferop_core.memory.stage_bytes).
DEFAULT_MAX_IMAGE_BYTES = 8 * 2**20
DEFAULT_MAX_IMAGE_PIXELS = 25_000_000


def check_image_classifier(
    name: str,
    processing: Processing | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
    top_k: int,
) -> None:
    """Raise ValueError naming what is missing where a model cannot sit behind an image pipeline: its declared
    preprocessing (processing kind imageClassification), one input of 3 x N x N, and a first output of one score a
    class with its labels, at least `top_k` of them."""
    if processing is None or processing.kind != "imageClassification":
        kind = "none" if processing is None else processing.kind
        raise ValueError(f"model {name!r}: an image pipeline needs processing kind imageClassification ({kind})")
    image = inputs[0]
    if len(inputs) != 1 or len(image.dims) != 3 or image.dims[0] != 3 or image.dims[1] != image.dims[2]:
        shapes = [(t.name, list(t.dims)) for t in inputs]
        raise ValueError(f"model {name!r}: an image pipeline needs one input of 3 x N x N, not {shapes}")
    scores = outputs[0]
    if scores.label_filename is None or len(scores.dims) != 1 or scores.dynamic:
        raise ValueError(
            f"model {name!r}: an image pipeline needs a first output of one score a class, with labels "
            f"({scores.name} {list(scores.dims)}, labels {scores.label_filename})"
        )
    if top_k > scores.dims[0]:
        raise ValueError(f"topK {top_k}: the model has {scores.dims[0]} classes")


class PipelineConfig(BaseModel):
    """What an image pipeline's configs are made of: the model's own (`model`, named `<name>_model`) and the stages'
    settings. The preprocessing is the model's declared processing, never restated."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="the ensemble's: what callers use")
    model: ServingConfig
    top_k: int = Field(default=DEFAULT_TOP_K, ge=1)
    max_image_bytes: int = Field(default=DEFAULT_MAX_IMAGE_BYTES, ge=1)
    max_image_pixels: int = Field(default=DEFAULT_MAX_IMAGE_PIXELS, ge=1)
    pre_instances: int = Field(default=1, ge=1, le=256)
    post_instances: int = Field(default=TOP_K_INSTANCES, ge=1, le=256)

    @model_validator(mode="after")
    def _an_image_classifier(self) -> PipelineConfig:
        model = self.model
        check_image_classifier(model.name, model.processing, model.inputs, model.outputs, self.top_k)
        if model.name != member_name(self.name, "model"):
            raise ValueError(f"the model of pipeline {self.name!r} is named {member_name(self.name, 'model')!r}")
        return self

    @property
    def members(self) -> dict[str, str]:
        """Each member's model name, in the order the ensemble runs them."""
        return pipeline_members(self.name)

    def stage_settings(self, stage: str) -> dict[str, object]:
        """What a stage of inferop/serving/pipeline.py reads from its config (PIPELINE_PARAMETER)."""
        if stage == "post":
            return {"topK": self.top_k, "labelsFile": self.model.outputs[0].label_filename}
        processing = self.model.processing
        assert processing is not None
        return {
            "size": self.model.inputs[0].dims[-1],
            "resizeRatio": processing.resize_ratio,
            "mean": processing.mean,
            "std": processing.std,
            "maxImageBytes": self.max_image_bytes,
            "maxImagePixels": self.max_image_pixels,
        }


def member_name(pipeline: str, stage: str) -> str:
    return f"{pipeline}_{stage}"


def pipeline_members(pipeline: str) -> dict[str, str]:
    """The model names of the members of the pipeline whose ensemble is named `pipeline`, by stage."""
    return {stage: member_name(pipeline, stage) for stage in PIPELINE_MEMBERS}


def build_pipeline_configs(cfg: PipelineConfig) -> dict[str, mc.ModelConfig]:
    """The configs of the pipeline's models by name: the stages, the model and the ensemble that callers use."""
    model, scores = cfg.model, cfg.model.outputs[0]
    image = model.inputs[0]
    configs = {model.name: build_model_config(model)}
    tensors: dict[str, tuple[list[tuple[str, str, list[int]]], ...]] = {
        "pre": ([(IMAGE_INPUT, "STRING", [1])], [(PIXELS, image.datatype, list(image.dims))]),
        "post": (
            [(SCORES, scores.datatype, list(scores.dims))],
            [(LABELS_OUTPUT, "STRING", [cfg.top_k]), (PROBABILITIES_OUTPUT, "FP32", [cfg.top_k])],
        ),
    }
    for stage, (inputs, outputs) in tensors.items():
        name = cfg.members[stage]
        config = mc.ModelConfig(name=name, backend=PIPELINE_BACKEND, max_batch_size=model.max_batch_size)
        for tensor, datatype, dims in inputs:
            config.input.add(name=tensor, data_type=_triton_type(datatype), dims=dims)
        for tensor, datatype, dims in outputs:
            config.output.add(name=tensor, data_type=_triton_type(datatype), dims=dims)
        config.instance_group.add(
            count=cfg.pre_instances if stage == "pre" else cfg.post_instances, kind=mc.ModelInstanceGroup.KIND_CPU
        )
        config.dynamic_batching.max_queue_delay_microseconds = 0  # a stage takes requests one by one: never wait
        _queue_policy(config, model)
        config.parameters[STAGE_PARAMETER].string_value = stage
        config.parameters[PIPELINE_PARAMETER].string_value = json.dumps(cfg.stage_settings(stage), sort_keys=True)
        configs[name] = config

    ensemble = mc.ModelConfig(name=cfg.name, platform=ENSEMBLE_PLATFORM, max_batch_size=model.max_batch_size)
    ensemble.input.add(name=IMAGE_INPUT, data_type=_triton_type("STRING"), dims=[1])
    ensemble.output.add(name=LABELS_OUTPUT, data_type=_triton_type("STRING"), dims=[cfg.top_k])
    ensemble.output.add(name=PROBABILITIES_OUTPUT, data_type=_triton_type("FP32"), dims=[cfg.top_k])
    steps = ensemble.ensemble_scheduling.step
    steps.add(
        model_name=cfg.members["pre"],
        model_version=-1,
        input_map={IMAGE_INPUT: IMAGE_INPUT},
        output_map={PIXELS: "pixels"},
    )
    steps.add(
        model_name=model.name, model_version=-1, input_map={image.name: "pixels"}, output_map={scores.name: "scores"}
    )
    steps.add(
        model_name=cfg.members["post"],
        model_version=-1,
        input_map={SCORES: "scores"},
        output_map={LABELS_OUTPUT: LABELS_OUTPUT, PROBABILITIES_OUTPUT: PROBABILITIES_OUTPUT},
    )
    configs[cfg.name] = ensemble
    return configs


def _queue_policy(config: mc.ModelConfig, model: ServingConfig) -> None:
    """The model's queue bound and timeout, for the model and for each stage of its pipeline. Unset fields leave
    Triton's defaults: an unbounded queue whose requests wait forever."""
    policy = config.dynamic_batching.default_queue_policy
    if model.request_timeout_microseconds is not None:
        policy.timeout_action = mc.ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = model.request_timeout_microseconds
        policy.allow_timeout_override = True
    if model.max_queue_size is not None:
        policy.max_queue_size = model.max_queue_size


def random_weights(seed: int) -> str:
    """The provenance of seeded random weights, as `ServingConfig.weights` records it."""
    return f"random (seed {seed})"


def weights_are_random(weights: str) -> bool:
    """Whether a recorded provenance is `random_weights(...)`: the outputs mean nothing about the task."""
    return re.fullmatch(r"random \(seed -?\d+\)", weights) is not None


def render_model_config(cfg: ServingConfig) -> str:
    """`config.pbtxt` text for `cfg`."""
    return text_format.MessageToString(build_model_config(cfg))


def parse_model_config(text: str) -> mc.ModelConfig:
    """Parse `config.pbtxt` text; a typo in a field name is an error that names it."""
    return text_format.Parse(text, mc.ModelConfig())


def to_text(config: mc.ModelConfig) -> str:
    return text_format.MessageToString(config)


class ConfigNotRenderable(InferopError, ValueError):
    """A config.pbtxt holds settings the renderer does not write: re-rendering it would drop them."""


def read_serving_config(config: mc.ModelConfig) -> ServingConfig:
    """The `ServingConfig` that renders `config`, so that a tool changing one setting (tune) re-renders the rest
    unchanged. A config edited by hand beyond what the renderer writes is refused with the fields that differ,
    rather than silently losing them."""
    parameters = {key: value.string_value for key, value in config.parameters.items()}
    groups = list(config.instance_group)
    batching = config.dynamic_batching
    policy = batching.default_queue_policy
    serving = ServingConfig(
        name=config.name,
        inputs=tuple(_read_tensor(tensor) for tensor in config.input),
        outputs=tuple(_read_tensor(tensor) for tensor in config.output),
        max_batch_size=config.max_batch_size,
        instances=sum(group.count or 1 for group in groups) or 1,
        take_turns=any(
            resource.name == EXECUTION_RESOURCE for group in groups for resource in group.rate_limiter.resources
        ),
        device="gpu" if any(group.kind == mc.ModelInstanceGroup.KIND_GPU for group in groups) else "cpu",
        max_queue_delay_microseconds=batching.max_queue_delay_microseconds,
        max_queue_size=policy.max_queue_size or None,
        request_timeout_microseconds=policy.default_timeout_microseconds or None,
        intra_op_threads=_count(parameters.get("intra_op_thread_count")),
        inter_op_threads=_count(parameters.get("inter_op_thread_count")),
        weights=parameters.get(WEIGHTS_PARAMETER),
        processing=Processing.from_parameter(parameters[PROCESSING_PARAMETER])
        if PROCESSING_PARAMETER in parameters
        else None,
        model_sha256=parameters.get(MODEL_SHA256_PARAMETER),
        memory_pattern=parameters.get("enable_mem_pattern", "1") not in ("0", "false"),
        gpu_memory_limit_bytes=_count(parameters.get("gpu_mem_limit")),
    )
    rendered = build_model_config(serving)
    if rendered != config:
        differing = [
            field.name
            for field in config.DESCRIPTOR.fields
            if getattr(config, field.name) != getattr(rendered, field.name)
        ]
        raise ConfigNotRenderable(
            f"model {config.name!r}: config.pbtxt was edited beyond what inferop renders ({', '.join(differing)}: "
            "not as its other settings render them); export the model again, or change those settings through "
            "the spec"
        )
    return serving


def _read_tensor(tensor: mc.ModelInput | mc.ModelOutput) -> TensorSpec:
    datatype = mc.DataType.Name(tensor.data_type).removeprefix("TYPE_")
    label = getattr(tensor, "label_filename", "") or None
    return TensorSpec(name=tensor.name, datatype=datatype, dims=tuple(tensor.dims), label_filename=label)


def _count(text: str | None) -> int | None:
    return int(text) if text else None


def _triton_type(datatype: str) -> int:
    return int(mc.DataType.Value(f"TYPE_{datatype}"))

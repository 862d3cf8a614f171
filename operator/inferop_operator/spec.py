"""The InferenceService spec: one typed model, parsed once at the edge; the CRD schema is generated from it.

Field names are the API contract (camelCase on the wire). Every field carries a description, which the
generated CRD schema turns into `kubectl explain` text.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from inferop.quantity import QUANTITY_PATTERN, parse_quantity
from inferop.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop.tritonconfig import Datatype, TensorSpec

GROUP = "inferop.dev"
VERSION = "v1alpha1"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SHORT_NAME = "infsvc"
STORAGE_SCHEMES = ("pvc", "hostpath", "oci")
GPU_RESOURCE = "nvidia.com/gpu"

# A Kubernetes quantity: an integer or a string such as "500m", "2Gi", "1.5".
Quantity = Annotated[
    int | str,
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]


class SpecError(ValueError):
    """An invalid InferenceService spec; `str()` names every offending field and what is allowed."""


class Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        populate_by_name=True,
        alias_generator=AliasGenerator(validation_alias=to_camel, serialization_alias=to_camel),
    )


class Profile(Section):
    """The model's cost, as `inferop export` reports it; the memory-fit check is computed from it."""

    parameters: int = Field(ge=0, description="Trainable parameters.")
    macs_per_sample: int = Field(ge=0, description="Multiply-accumulates for one sample.")
    weight_bytes: int = Field(ge=0, description="Bytes of weights each model instance loads.")
    activation_bytes_per_sample: int = Field(
        ge=0, description="Peak bytes of intermediate tensors alive at once for one sample."
    )
    samples_per_cpu_second: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Capacity measured by inferop export: samples one CPU runs per second at the largest batch "
            "(ONNX Runtime, one thread). The default queue bound is derived from it; unset means unknown "
            "capacity (see batching.maxQueueSize)."
        ),
    )


class Tensor(Section):
    """A model input or output as Triton's config declares it; dims exclude the batch axis."""

    name: str = Field(min_length=1, description="Tensor name in the model.")
    datatype: Datatype = Field(default="FP32", description="Element type.")
    dims: list[Annotated[int, Field(ge=1)]] = Field(min_length=1, description="Shape without the batch axis.")
    label_filename: str | None = Field(
        default=None, description="File in the model directory with one class name a line (outputs only)."
    )

    def as_tensor_spec(self) -> TensorSpec:
        return TensorSpec(
            name=self.name, datatype=self.datatype, dims=tuple(self.dims), label_filename=self.label_filename
        )


class Model(Section):
    """What to serve and where it is stored."""

    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-zA-Z0-9_.-]+$", description="Triton model name (the URL path)."
    )
    storage_uri: str = Field(
        pattern=r"^(pvc|hostpath|oci)://.+$",
        description=(
            "Where the model directory (<version>/model.onnx, label files) is stored: pvc://claim/path, "
            "hostpath:///absolute/path (single-node clusters such as kind), or oci://image (a model image "
            "holding the model directory at /model). It is mounted read-only; nothing is written to it."
        ),
    )
    profile: Profile = Field(description="Cost of the model as reported by inferop export.")
    weights: str | None = Field(
        default=None,
        max_length=256,
        description=(
            "Where the weights came from, as inferop export records it: 'random (seed N)', or a weights file's "
            "name and SHA-256 prefix. Written into the served config (parameter inferop_weights), where "
            "`inferop infer` reads it and says when answers come from random weights."
        ),
    )
    inputs: list[Tensor] = Field(min_length=1, description="Model inputs.")
    outputs: list[Tensor] = Field(min_length=1, description="Model outputs.")

    @field_validator("storage_uri", mode="before")
    @classmethod
    def _scheme(cls, value: Any) -> Any:
        scheme = str(value).partition("://")[0] if "://" in str(value) else ""
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"{value!r} has an unknown scheme {scheme!r}: expected pvc://claim/path, hostpath:///path or oci://image"
            )
        return value

    @model_validator(mode="after")
    def _storage(self) -> Model:
        scheme, _, rest = self.storage_uri.partition("://")
        if scheme == "pvc" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?", rest):
            raise ValueError(f"storageUri {self.storage_uri!r}: expected pvc://<claim-name>[/path]")
        if scheme == "hostpath" and not rest.startswith("/"):
            raise ValueError(f"storageUri {self.storage_uri!r}: expected hostpath:///absolute/path")
        return self


class Runtime(Section):
    """The serving container."""

    image: str | None = Field(default=None, description="Triton image; default from the operator's settings.")
    memory_overhead: Quantity | None = Field(
        default=None,
        description=(
            "Memory the Triton process takes before any model is loaded, for the memory-fit check; default "
            "from the operator's setting INFEROP_RUNTIME_MEMORY_OVERHEAD. Measure your image and set it here."
        ),
    )
    cpu_scheduling: CpuScheduling = Field(
        default=DEFAULT_CPU_SCHEDULING,
        description=(
            "Linux scheduling policy of tritonserver. batch (SCHED_BATCH, through `chrt` in the image): a woken "
            "thread does not preempt the running one, so Triton's batcher starts the next batch as soon as an "
            "instance finishes even while the queue is full; under normal it can idle up to 500 ms per batch "
            "under overload. Use normal for an image without chrt."
        ),
    )

    @field_validator("memory_overhead")
    @classmethod
    def _overhead(cls, value: int | str | None) -> int | str | None:
        if value is not None and parse_quantity(value, "runtime.memoryOverhead") < 0:
            raise ValueError(f"{value!r} must not be negative")
        return value


class Resources(Section):
    """Standard container resources, copied to the Triton container as they are."""

    requests: dict[str, Quantity] = Field(default_factory=dict, description="Resource requests.")
    limits: dict[str, Quantity] = Field(default_factory=dict, description="Resource limits (nvidia.com/gpu too).")

    @model_validator(mode="after")
    def _quantities(self) -> Resources:
        for kind, values in (("requests", self.requests), ("limits", self.limits)):
            for resource, value in values.items():
                field = f"resources.{kind}.{resource}"
                amount = parse_quantity(value, field)
                if amount < 0:
                    raise ValueError(f"{field}: {value!r} must not be negative")
                if resource == "cpu" and amount == 0:
                    raise ValueError(f"{field}: must be above 0, the thread budget is derived from it")
        return self


class Threads(Section):
    """ONNX Runtime thread pools of each model instance; unset counts are derived from the CPU budget."""

    intra_op: int | None = Field(default=None, ge=1, le=256, description="Threads inside one operator.")
    inter_op: int | None = Field(default=None, ge=1, le=256, description="Operators run in parallel.")
    allow_oversubscription: bool = Field(
        default=False, description="Accept instances x (intraOp + interOp - 1) above the CPUs (slower)."
    )


class Batching(Section):
    """Triton's dynamic batcher and its bounded queue."""

    max_batch_size: int = Field(default=8, ge=1, le=4096, description="Largest batch the model runs.")
    max_queue_delay_microseconds: int = Field(
        default=2000, ge=0, le=10_000_000, description="How long a request may wait for others to batch with."
    )
    max_queue_size: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description=(
            "Requests queued per model before new ones are rejected. Unset: derived by Little's law so that an "
            "accepted request is answered within half of timeouts.requestSeconds: capacity x requestSeconds / 2 "
            "less three rounds of batches (instances x maxBatchSize each), at most 1024, capacity being "
            "model.profile.samplesPerCpuSecond x the CPUs the threads use; requests are taken as one sample "
            "each. With no measured capacity: 2 x maxBatchSize x instances, and the status warns."
        ),
    )


class Timeouts(Section):
    """Every wait has an end."""

    request_seconds: float = Field(
        default=10.0, gt=0, le=3600, description="Queue time after which a request is rejected (HTTP 503)."
    )
    startup_seconds: int = Field(
        default=300, ge=5, le=7200, description="Budget for loading models before the pod is restarted."
    )


class Autoscaling(Section):
    """A HorizontalPodAutoscaler on the Triton Deployment; it then owns the replica count."""

    min_replicas: int = Field(default=1, ge=1, description="Fewest replicas.")
    max_replicas: int = Field(ge=1, description="Most replicas.")
    metric: Literal["cpu", "queueTime", "pendingRequests"] = Field(
        default="cpu",
        description=(
            "cpu: CPU utilisation percent of requests; queueTime: Triton's queue microseconds per second "
            "(Pods metric nv_inference_queue_duration_us); pendingRequests: Triton's queued requests "
            "(Pods metric nv_inference_pending_request_count). Pods metrics need a metrics adapter."
        ),
    )
    target: int = Field(ge=1, description="Target value per pod (percent for cpu).")

    @model_validator(mode="after")
    def _range(self) -> Autoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) must be >= minReplicas ({self.min_replicas})")
        return self


class Gpu(Section):
    """GPU facts the memory-fit check needs."""

    memory: Quantity = Field(description="Device memory available to one pod, e.g. 16Gi.")


class InferenceServiceSpec(Section):
    """A model served by NVIDIA Triton that cannot oversubscribe its CPUs, predictably fits in memory,
    times out instead of hanging, and scales on load."""

    model: Model = Field(description="The model to serve.")
    runtime: Runtime = Field(default_factory=Runtime, description="The serving container.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Pods, when autoscaling is not set.")
    resources: Resources = Field(default_factory=Resources, description="Triton container resources.")
    instances: int = Field(default=1, ge=1, le=256, description="Triton model instances per pod.")
    threads: Threads = Field(default_factory=Threads, description="ONNX Runtime threads per instance.")
    batching: Batching = Field(default_factory=Batching, description="Dynamic batching.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Request and start-up timeouts.")
    autoscaling: Autoscaling | None = Field(default=None, description="Scale on load with an HPA.")
    gpu: Gpu | None = Field(default=None, description="GPU memory for the memory-fit check.")

    @property
    def uses_gpu(self) -> bool:
        return parse_quantity(self.resources.limits.get(GPU_RESOURCE, 0), GPU_RESOURCE) > 0

    @model_validator(mode="after")
    def _gpu_memory(self) -> InferenceServiceSpec:
        if self.gpu is not None:
            parse_quantity(self.gpu.memory, "gpu.memory")
        return self


def parse_spec(raw: dict[str, Any] | Any) -> InferenceServiceSpec:
    """Validate a raw spec; errors list each field by its camelCase path with what was wrong."""
    try:
        return InferenceServiceSpec.model_validate(dict(raw or {}))
    except ValidationError as error:
        raise SpecError(format_errors(error)) from None


def format_errors(error: ValidationError) -> str:
    problems = []
    for item in error.errors():
        path = ".".join(["spec", *(str(part) for part in item["loc"])])
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        problems.append(f"{path}: {message}")
    return "; ".join(problems)

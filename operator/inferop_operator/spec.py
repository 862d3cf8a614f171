"""The InferenceService spec: one typed model, parsed once at the edge; the CRD schema is generated from it.

Field names are the API contract (camelCase on the wire). Every field carries a description, which the
generated CRD schema turns into `kubectl explain` text.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AliasGenerator, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from inferop_core.capacity import QUEUE_BOUND_RULE, UNKNOWN_CAPACITY_RULE
from inferop_core.errors import InferopError
from inferop_core.gate import Gate, default_gate
from inferop_core.objectstore import OBJECT_SCHEMES, ObjectUriError, parse_object_uri
from inferop_core.processing import Processing
from inferop_core.quantity import QUANTITY_PATTERN, parse_quantity
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING, CpuScheduling
from inferop_core.sequential import STATED_CONFIDENCE, AgreementTest, agreement_test
from inferop_core.threads import THREAD_ENV, ThreadPlan
from inferop_core.tritonconfig import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    DEFAULT_TOP_K,
    DYNAMIC_DIM,
    MODEL_SHA256_PARAMETER,
    SHA256_PATTERN,
    TENSOR_NAME_PATTERN,
    Datatype,
    PipelineConfig,
    ServingConfig,
    TensorSpec,
    check_image_classifier,
    member_name,
)

# Schemes whose model each pod fetches before Triton starts (inferop fetch, in an init container).
OBJECT_STORAGE_SCHEMES = OBJECT_SCHEMES
STORAGE_SCHEMES = ("pvc", "hostpath", "oci", *OBJECT_STORAGE_SCHEMES)
GPU_RESOURCE = "nvidia.com/gpu"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_NAME_LENGTH = 253  # a Kubernetes object name (a DNS subdomain), such as a PersistentVolumeClaim's
# An image reference as container runtimes parse it: [registry[:port]/]path[:tag][@sha256:digest], the path in
# lowercase (github.com/distribution/reference).
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_PATTERN = (
    rf"^(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?$"
)

# A Kubernetes quantity: an integer or a string such as "500m", "2Gi", "1.5".
Quantity = Annotated[
    int | str,
    Field(json_schema_extra={"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN}),
]


def admission_rules(*rules: tuple[str, str]) -> ConfigDict:
    """A model_validator's check again as CEL (rule, messageExpression) in the model's CRD schema node, so that an
    apiserver that evaluates them refuses the object at `kubectl apply` with the validator's own words; 1.20 drops
    them and the operator's Valid condition says the same. Only rules CEL states exactly belong here: the tests
    evaluate each against samples the validator refuses (tests/operator/test_crd.py).

    Messages are built with format(), not `+`: the apiserver estimates `'...' + string(int)` (or a join()) as
    unbounded and refuses the whole CRD for its cost (kubernetes/kubernetes#124234)."""
    return ConfigDict(
        json_schema_extra={"x-kubernetes-validations": [{"rule": rule, "messageExpression": m} for rule, m in rules]}
    )


class SpecError(InferopError, ValueError):
    """An invalid InferenceService spec; `str()` names every offending field and what is allowed."""


class Section(BaseModel):
    # Strict: a JSON true is not the number 1, nor "yes" a boolean; the apiserver's schema says the same.
    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
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
    io_bytes_per_sample: int | None = Field(
        default=None,
        ge=0,
        description=(
            "Bytes of one sample's inputs and outputs as measured by inferop export; unset: computed from the "
            "tensors' dims (a dynamic dim counted as 1)."
        ),
    )


class Tensor(Section):
    """A model input or output as Triton's config declares it; dims exclude the batch axis."""

    name: str = Field(
        min_length=1, max_length=256, pattern=TENSOR_NAME_PATTERN, description="Tensor name in the model."
    )
    datatype: Datatype = Field(default="FP32", description="Element type.")
    dims: list[Annotated[int, Field(ge=DYNAMIC_DIM)]] = Field(
        min_length=1,
        description=(
            "Shape without the batch axis (the full shape when batching.maxBatchSize is 0). An output's dim may "
            "be -1 when its size varies; every input dim is fixed."
        ),
    )
    label_filename: str | None = Field(
        default=None, description="File in the model directory with one class name a line (outputs only)."
    )

    @field_validator("dims")
    @classmethod
    def _no_zero_dims(cls, dims: list[int]) -> list[int]:
        if 0 in dims:
            raise ValueError(f"{dims}: a dim of 0 holds nothing; use -1 for a dynamic output dim")
        return dims

    def as_tensor_spec(self) -> TensorSpec:
        return TensorSpec(
            name=self.name, datatype=self.datatype, dims=tuple(self.dims), label_filename=self.label_filename
        )

    @classmethod
    def of(cls, tensor: TensorSpec) -> Tensor:
        """The entry for a tensor as export and tune found it: the inverse of as_tensor_spec."""
        return cls(
            name=tensor.name, datatype=tensor.datatype, dims=list(tensor.dims), label_filename=tensor.label_filename
        )


class ObjectStorage(Section):
    """How each pod fetches a model kept in object storage (s3://, https://) before Triton starts."""

    endpoint: str | None = Field(
        default=None,
        max_length=512,
        pattern=r"^https?://[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?(:[0-9]{1,5})?/?$",
        description="An S3-compatible server, http(s)://host[:port] (MinIO, Ceph, versitygw...); unset: AWS S3.",
    )
    region: str | None = Field(
        default=None, max_length=64, pattern=r"^[a-z0-9-]+$", description="The bucket's region; unset: the server's."
    )
    addressing: Literal["auto", "path", "virtual"] = Field(
        default="auto",
        description="path-style (host/bucket/key) or virtual-hosted (bucket.host/key); auto: virtual for AWS only.",
    )
    credentials_secret: str | None = Field(
        default=None,
        max_length=MAX_NAME_LENGTH,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description=(
            "A Secret in the service's namespace with the keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and "
            "AWS_SESSION_TOKEN, optional). The fetch gets them as environment variables from the Secret: the "
            "operator never reads it, and no object it writes holds them. Unset: anonymous requests."
        ),
    )
    download_timeout_seconds: int = Field(
        default=300, ge=5, le=3600, description="Seconds for the whole download, every attempt together."
    )
    attempts: int = Field(
        default=5, ge=1, le=20, description="Tries per request on a failed connection or a 5xx, backing off."
    )
    max_size: Quantity | None = Field(
        default=None,
        description=(
            "The most the model directory may hold; the fetch refuses more before it reads a byte. Unset: twice the "
            "profile's weights plus 64Mi and model.validation's size."
        ),
    )


class ValidationSet(Section):
    """Held-out inputs recorded with the model: inferop export writes its --validation inputs into the model directory
    (validation.npz, one array per input, samples first), and a rollout's agreement check sends them first."""

    samples: int = Field(ge=1, description="Samples in the set.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="validation.npz's SHA-256; a set that differs is refused.")
    size_bytes: int = Field(ge=0, description="validation.npz's size, which a fetch of the model directory counts.")


class Model(Section):
    """What to serve and where it is stored."""

    name: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-zA-Z0-9_.-]+$", description="Triton model name (the URL path)."
    )
    storage_uri: str = Field(
        pattern=rf"^({'|'.join(STORAGE_SCHEMES)})://.+$",
        description=(
            "Where the model directory (<version>/model.onnx, label files) is stored: pvc://claim/path, "
            "hostpath:///absolute/path (single-node development clusters such as kind; a hostPath volume, which "
            "the Pod Security Standards baseline and restricted forbid), oci://image (a model image holding the "
            "model directory at /model), s3://bucket/path (see storage) or https://host/model.tar.gz (a tarball of "
            "the model directory). It is mounted read-only, or fetched into the pod before Triton starts and checked "
            "against sha256; nothing is written to it."
        ),
    )
    storage: ObjectStorage | None = Field(
        default=None,
        description="For s3:// and https://: the endpoint, credentials and limits of the fetch; unset: the defaults.",
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
    sha256: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description=(
            "The model file's SHA-256 (<version>/model.onnx), as inferop export records it. Written into the served "
            f"config (parameter {MODEL_SHA256_PARAMETER}); a model fetched from object storage is checked against "
            "it and refused on a mismatch."
        ),
    )
    inputs: list[Tensor] = Field(min_length=1, description="Model inputs.")
    outputs: list[Tensor] = Field(min_length=1, description="Model outputs.")
    precision: Literal["fp32", "int8"] = Field(
        default="fp32",
        description=(
            "The precision of the model file's arithmetic, as inferop export writes it; int8 places the pods by "
            "int8Nodes."
        ),
    )
    int8_nodes: Literal["preferred", "required", "any"] = Field(
        default="preferred",
        description=(
            "For an int8 model: whether its pods go to nodes whose CPUs have int8 dot-product instructions (AVX-512 "
            "VNNI, AVX-VNNI or AMX, by Node Feature Discovery's feature.node.kubernetes.io/cpu-cpuid labels), "
            "where int8 runs 2.6-3.5x fp32 against about 1x without: preferred (scheduled there when such a node "
            "has room), required (only there; pods stay Pending without one), or any."
        ),
    )
    validation: ValidationSet | None = Field(
        default=None,
        description="The validation set inferop export recorded with the model (from --validation); unset: none. A "
        "rollout's agreement check sends it before any generated input.",
    )
    processing: Processing | None = Field(
        default=None,
        description=(
            "How callers make inputs and read outputs, as inferop export declares it for a network it knows; "
            "written into the served config (parameter inferop_processing), where `inferop infer` reads it. "
            "Unset: plain tensors."
        ),
    )

    @field_validator("storage_uri", mode="before")
    @classmethod
    def _scheme(cls, value: Any) -> Any:
        scheme = str(value).partition("://")[0] if "://" in str(value) else ""
        if scheme not in STORAGE_SCHEMES:
            raise ValueError(
                f"{value!r} has an unknown scheme {scheme!r}: expected pvc://claim/path, hostpath:///path, "
                "oci://image, s3://bucket/path or https://host/model.tar.gz"
            )
        return value

    @model_validator(mode="after")
    def _tensors(self) -> Model:
        names = [t.name for t in (*self.inputs, *self.outputs)]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"tensor names must be distinct across inputs and outputs; repeated: {repeated}")
        dynamic = [t.name for t in self.inputs if DYNAMIC_DIM in t.dims]
        if dynamic:
            raise ValueError(f"inputs {dynamic}: every input's dims must be fixed (-1 is for outputs only)")
        return self

    @model_validator(mode="after")
    def _storage(self) -> Model:
        scheme, _, rest = self.storage_uri.partition("://")
        if scheme == "pvc" and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(/.*)?", rest):
            raise ValueError(f"storageUri {self.storage_uri!r}: expected pvc://<claim-name>[/path]")
        if scheme == "pvc" and len(rest.partition("/")[0]) > MAX_NAME_LENGTH:
            raise ValueError(f"storageUri: the claim name has more than {MAX_NAME_LENGTH} characters")
        if scheme == "hostpath" and not rest.startswith("/"):
            raise ValueError(f"storageUri {self.storage_uri!r}: expected hostpath:///absolute/path")
        if scheme in OBJECT_STORAGE_SCHEMES:
            try:
                parse_object_uri(self.storage_uri)
            except ObjectUriError as error:
                raise ValueError(f"storageUri {error}") from None
        elif self.storage is not None:
            raise ValueError(f"storage is for s3:// and https:// models; storageUri is {scheme}://")
        limit = None if self.storage is None else self.storage.max_size
        if limit is not None and parse_quantity(limit, "storage.maxSize") < 1:
            raise ValueError(f"storage.maxSize: {limit!r} must be at least one byte")
        return self

    @property
    def fetched(self) -> bool:
        """Whether each pod fetches the model before Triton starts (object storage)."""
        return self.storage_uri.partition("://")[0] in OBJECT_STORAGE_SCHEMES

    def download_limit_bytes(self) -> int:
        """The fetch's size limit: storage.maxSize, or twice the profile's weights plus 64Mi and the validation set."""
        if self.storage is not None and self.storage.max_size is not None:
            return int(parse_quantity(self.storage.max_size, "storage.maxSize"))
        recorded = self.validation.size_bytes if self.validation is not None else 0
        return 2 * self.profile.weight_bytes + 64 * 2**20 + recorded


class EnvVar(Section):
    """One environment variable of the serving container."""

    name: str = Field(max_length=256, pattern=ENV_NAME_PATTERN, description="Variable name.")
    value: str = Field(max_length=32768, description="Its value (an empty string for an empty one).")


class Runtime(Section):
    """The serving container."""

    image: str | None = Field(
        default=None,
        max_length=512,
        pattern=IMAGE_PATTERN,
        description="Triton image (registry/repository[:tag][@sha256:digest]); default from the operator's settings.",
    )
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

    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Environment variables of the Triton container, set after the operator's own. The thread counts "
            f"({', '.join(THREAD_ENV)}) come from spec.threads and cannot be set here."
        ),
    )

    @field_validator("env")
    @classmethod
    def _env(cls, value: list[EnvVar]) -> list[EnvVar]:
        seen: set[str] = set()
        for index, variable in enumerate(value):
            if variable.name in THREAD_ENV:
                raise ValueError(
                    f"env[{index}].name {variable.name} is derived from spec.threads.intraOp; set that instead"
                )
            if variable.name in seen:
                raise ValueError(f"env[{index}].name {variable.name} is given twice")
            seen.add(variable.name)
        return value

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

    max_batch_size: int = Field(
        default=8,
        ge=0,
        le=4096,
        description=(
            "Largest batch the model runs. 0: the model has no batch axis (a fixed shape); requests run one at a "
            "time and the tensors' dims are the full shape."
        ),
    )
    max_queue_delay_microseconds: int = Field(
        default=2000, ge=0, le=10_000_000, description="How long a request may wait for others to batch with."
    )
    max_queue_size: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description=(
            f"Requests queued per model before new ones are rejected. Unset: derived by {QUEUE_BOUND_RULE}, "
            "capacity being model.profile.samplesPerCpuSecond x the CPUs the threads use; requests are taken as one "
            f"sample each. With no measured capacity: {UNKNOWN_CAPACITY_RULE}, and the status warns."
        ),
    )

    @property
    def samples_per_batch(self) -> int:
        """Samples in the largest batch: a model without a batch axis runs one request at a time."""
        return max(self.max_batch_size, 1)


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

    model_config = admission_rules(
        (
            "!has(self.minReplicas) || self.maxReplicas >= self.minReplicas",
            "'maxReplicas (%d) must be >= minReplicas (%d)'.format([self.maxReplicas, self.minReplicas])",
        )
    )

    min_replicas: int = Field(default=1, ge=1, description="Fewest replicas.")
    max_replicas: int = Field(ge=1, description="Most replicas.")
    metric: Literal["cpu", "queueTime", "pendingRequests"] = Field(
        default="cpu",
        description=(
            "cpu: CPU utilisation percent of requests; queueTime: mean microseconds a request waits in Triton's "
            "queue, per model, the pod's worst model (Pods metric inferop_queue_time_microseconds); "
            "pendingRequests: requests waiting in the pod's Triton queues (Pods metric inferop_pending_requests). "
            "Pods metrics need a metrics adapter with the chart's rules (metricsAdapter.enabled)."
        ),
    )
    target: int = Field(ge=1, description="Target value per pod (percent for cpu).")
    scale_down_stabilization_seconds: int | None = Field(
        default=None,
        ge=0,
        le=3600,
        description=(
            "Seconds the HPA looks back before it scales down, taking the highest recommendation of the window "
            "(unset: Kubernetes' default, 300)."
        ),
    )

    @model_validator(mode="after")
    def _range(self) -> Autoscaling:
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"maxReplicas ({self.max_replicas}) must be >= minReplicas ({self.min_replicas})")
        return self


# Where Envoy Gateway runs the Envoy pods of every Gateway by default: its own namespace.
ENVOY_GATEWAY_NAMESPACE = "envoy-gateway-system"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


class NetworkPolicy(Section):
    """A NetworkPolicy on the Triton pods: inference (http 8000, grpc 8001) open to any caller or only to the
    service's Gateway, metrics (8002) only to pods of one namespace (a Prometheus's), every other port and ingress
    closed."""

    enabled: bool = Field(default=False, description="Render the NetworkPolicy (the cluster's CNI must enforce it).")
    inference_from: Literal["anywhere", "gateway"] = Field(
        default="anywhere",
        description=(
            "Who may call the inference ports. anywhere: any pod. gateway: only the Envoy pods of the service's "
            "Gateway (Envoy Gateway's, in gatewayNamespace), on http, and the operator's pods (its agreement check): "
            "a caller that bypasses the gateway's admission is refused before Triton reads a byte of its request, "
            "which the memory estimate counts on where requests are large (images); grpc is closed (the gateway "
            "routes http only). Needs a gateway (spec.gateway or the operator's default)."
        ),
    )
    gateway_namespace: str = Field(
        default=ENVOY_GATEWAY_NAMESPACE,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "With inferenceFrom gateway: the namespace of the Gateway's Envoy pods (Envoy Gateway's own, its "
            "default; the Gateway's namespace where its EnvoyProxy deploys them there)."
        ),
    )
    metrics_namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "Namespace whose pods may scrape Triton's metrics port, e.g. monitoring (matched by its "
            "kubernetes.io/metadata.name label, Kubernetes 1.21+ sets it); unset: nobody may."
        ),
    )


class Gpu(Section):
    """GPU facts the memory-fit check needs."""

    memory: Quantity = Field(description="Device memory available to one pod, e.g. 16Gi.")


# An HTTP header name as RFC 9110 defines a token, which Gateway API's HTTPHeaderMatch also takes.
HEADER_NAME_PATTERN = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$"


class GatewayRef(Section):
    """The Gateway (Gateway API) that routes callers to this service: the operator writes an HTTPRoute attached to
    it, and a rollout shifts traffic by the route's backend weights."""

    name: str = Field(min_length=1, max_length=63, pattern=DNS_LABEL_PATTERN, description="The Gateway's name.")
    namespace: str | None = Field(
        default=None,
        min_length=1,
        max_length=63,
        pattern=DNS_LABEL_PATTERN,
        description="The Gateway's namespace; unset: the service's own (its listener must allow routes from it).",
    )
    section_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_LABEL_PATTERN,
        description="The Gateway's listener to attach to; unset: every listener that admits the route.",
    )
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(
        default_factory=list,
        max_length=16,
        description="Host names the route answers for (the route's hostnames); empty: any the listener accepts.",
    )


class HeaderMatch(Section):
    """Callers opted in by a header: every request carrying it reaches the candidate (A/B)."""

    name: str = Field(min_length=1, max_length=256, pattern=HEADER_NAME_PATTERN, description="Header name.")
    value: str = Field(min_length=1, max_length=4096, description="Header value, matched exactly.")


class Shadow(Section):
    """Live requests copied to the candidate while its weight is 0; callers get only the stable revision's answers."""

    percent: int = Field(ge=1, le=100, description="Share of live requests mirrored to the candidate, in percent.")


class Analysis(Section):
    """How each step is judged, from Prometheus: the candidate against the stable revision over the same window, by
    Triton's metrics and, through a Gateway of Envoy Gateway, by what its Envoy saw of each backend."""

    interval_seconds: int = Field(
        default=10,
        ge=1,
        le=3600,
        description="How often the step is analysed, and the window each analysis reads: the last intervalSeconds "
        "(from the step's start for the first one), so a regression late in a long step is not diluted. Envoy updates "
        "its latency histograms every 5 s: below 10 s the p99 gate reads fewer than two of its updates, below 5 s "
        "often none.",
    )
    max_failure_ratio_increase: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="How far the candidate's share of failed requests may exceed the stable revision's (0.01: one "
        "percentage point): in Triton, and at the gateway its share of 5xx answers and of resets and connection "
        "failures.",
    )
    max_latency_ratio: float = Field(
        default=1.5,
        ge=1,
        le=100,
        description="The candidate's mean time per request (queue and compute) over the stable revision's, at most.",
    )
    max_p99_ratio: float = Field(
        default=1.5,
        gt=1,
        le=100,
        description="The candidate's 99th percentile of the time the gateway's Envoy waited for its answers over the "
        "stable revision's in the same window, at most (Envoy's histogram of upstream request time, per backend; "
        "through a Gateway of Envoy Gateway only), once each has 100 requests timed (minRequests, where more), and "
        "when the candidate's requests slower than this times the stable revision's p99 are more than 1% of its "
        "requests give with a chance of 0.001.",
    )
    min_requests: int = Field(
        default=20,
        ge=1,
        le=1_000_000,
        description="Requests the candidate must have answered in the window before it is judged (in Triton, and at "
        "the gateway for the gateway's checks); fewer: no data.",
    )
    failure_limit: int = Field(
        default=1,
        ge=1,
        le=100,
        description="Failed analyses of a step in a row before it rolls back: 1, the first failure; 2 lets one noisy "
        "interval pass (a passed analysis starts the count again).",
    )


class Agreement(Section):
    """Before any live request reaches the candidate, both revisions answer the same inputs, as many as a sequential
    test needs to decide with stated error rates: a candidate whose agreement is at `minAgreement` or above passes
    with probability 0.99 at least, one at `minAgreement - tolerance` or below is refused with probability 0.99 at
    least (both exact rates are in the status and in `inferop plan`)."""

    min_agreement: float = Field(
        default=0.99,
        gt=0,
        lt=1,
        description="Share of inputs that must agree: the same top-1 class for classifier outputs "
        "(imageClassification's output, policyValue's policy), every value within maxAbsDifference for the others.",
    )
    tolerance: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="How far below minAgreement a candidate must be to be refused with probability 0.99; between the "
        "two it may go either way. Halving it takes about four times the inputs.",
    )
    max_samples: int = Field(
        default=5000,
        ge=1,
        le=100_000,
        description="The most inputs a judged output's test counts; undecided there, it takes the decision the "
        "evidence favours, which the stated error rates include. Made from the validation set recorded with the model "
        "(model.validation), then from model.processing.",
    )
    near_tie_epsilon: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="An input on which the stable revision's own top-1 margin (its top value less the second) is below "
        "this, times the top value where that exceeds 1, is a near tie: counted apart and reported, not for or against "
        "the candidate. Unset: the square root of the output datatype's machine epsilon (3.5e-4 for FP32, 0.031 for "
        "FP16).",
    )
    max_abs_difference: float | None = Field(
        default=None,
        gt=0,
        description="Largest difference allowed in every value of the other outputs; unset: 0.02 for policyValue's "
        "value, 0.001 for plain tensors.",
    )

    @model_validator(mode="after")
    def _decidable(self) -> Agreement:
        if self.tolerance >= self.min_agreement:
            raise ValueError(f"tolerance ({self.tolerance:g}) must be below minAgreement ({self.min_agreement:g})")
        fewest = self.test(1).test.fewest_samples
        if self.max_samples < fewest:
            raise ValueError(
                f"maxSamples ({self.max_samples}) cannot decide at minAgreement {self.min_agreement:g} and tolerance "
                f"{self.tolerance:g}: an identical model needs {fewest} inputs"
            )
        return self

    def test(self, outputs: int) -> AgreementTest:
        """The sequential test for a gate judging `outputs` outputs."""
        return agreement_test(self.min_agreement, self.tolerance, outputs, self.max_samples)


REVISION_STEP_PATTERN = r"^[0-9a-f]{1,64}/[0-9]{1,2}$"


class Webhook(Section):
    """Where each decision of a rollout is posted as JSON (a phase, reason or traffic changed: what its Events say),
    in order, from a thread of the operator's own: a receiver that is slow or down never holds a rollout up."""

    url: str = Field(
        min_length=8,
        max_length=2048,
        pattern=r"^https?://[^\s/$.?#][^\s]*$",
        description="http:// or https:// URL the operator POSTs each decision to (application/json).",
    )
    timeout_seconds: int = Field(default=5, ge=1, le=60, description="Each attempt's time limit.")
    attempts: int = Field(
        default=3, ge=1, le=10, description="Attempts a decision gets, 1 s apart and doubling, before it is dropped."
    )


class ScaleDown(Section):
    """The stable revision's pods follow the weight through a gateway: as the candidate takes its share of the
    requests, the stable Deployment keeps the pods its own share needs, plus headroom, once the share has held for
    a while; never fewer than one, and back at full size before the candidate's weight goes to 0 on a rollback for
    latency or by hand. Without a gateway the split by replicas shares the pods already; with autoscaling the HPA
    scales the stable pods on their queue as their share of the requests falls."""

    enabled: bool = Field(default=True, description="Scale the stable pods down as the candidate takes weight.")
    delay_seconds: int = Field(
        default=30,
        ge=0,
        le=3600,
        description="How long a step's weight must have been in effect before the stable pods scale down to it.",
    )
    headroom_percent: int = Field(
        default=25,
        ge=0,
        le=400,
        description="Pods kept beyond the stable revision's share: its share of spec.replicas times (1 + this/100), "
        "rounded up.",
    )


class StepPause(Section):
    """A hold at one step after its stepSeconds passed: its traffic stays and its analyses go on (a failure still
    rolls back), for `seconds` or, unset, until promoted (`inferop rollout promote`)."""

    at_weight: int = Field(ge=0, le=100, description="The step it holds at, by its weight (one of steps).")
    seconds: int | None = Field(
        default=None, ge=1, le=7 * 86_400, description="How long it holds; unset: until promoted."
    )


class Rollout(Section):
    """How a changed model or serving config replaces the running one: the candidate runs beside the stable
    revision, agrees with it on held-out inputs, then takes traffic step by step, each step analysed; a failed
    analysis rolls back at once. Nothing of the stable revision is removed before the candidate has passed at 100."""

    model_config = admission_rules(
        (
            "!has(self.steps) || self.steps[size(self.steps) - 1] == 100",
            "'the last step must be 100 (the candidate takes all traffic before it is promoted), not %d'.format("
            "[self.steps[size(self.steps) - 1]])",
        )
    )

    steps: list[Annotated[int, Field(ge=0, le=100)]] = Field(
        default_factory=lambda: [5, 25, 50, 100],
        min_length=1,
        max_length=20,
        description="Percent of live requests the candidate takes at each step, increasing, ending at 100. A step of "
        "0 sends it only shadowed and header-matched requests.",
    )
    step_seconds: int = Field(
        default=60, ge=1, le=86_400, description="How long each step runs before it is judged and the next begins."
    )
    analysis: Analysis = Field(default_factory=Analysis, description="How each step is judged.")
    agreement: Agreement = Field(default_factory=Agreement, description="The check before any live traffic.")
    header: HeaderMatch | None = Field(
        default=None, description="Callers sending this header reach the candidate at every step (needs a gateway)."
    )
    shadow: Shadow | None = Field(
        default=None, description="Mirror live requests to the candidate at steps of 0 (needs a gateway)."
    )
    paused: bool = Field(default=False, description="Hold at the current step; a failing analysis still rolls back.")
    promote: str | None = Field(
        default=None,
        max_length=64,
        description="A candidate revision (status.rollout.candidate) to promote now, skipping the remaining steps.",
    )
    abort: str | None = Field(
        default=None,
        max_length=64,
        description="A candidate revision to roll back now; it stays rolled back until the spec names another, or "
        "until retried.",
    )
    end_step: str | None = Field(
        default=None,
        pattern=REVISION_STEP_PATTERN,
        description="REVISION/STEP (status.rollout.candidate and .step, as `inferop rollout promote` writes them): "
        "that step ends now, its time or pause cut short, and the next begins (after the last, the candidate is "
        "promoted); a step whose last analysis failed does not end. It names one step, so it acts once.",
    )
    retry: str | None = Field(
        default=None,
        max_length=80,
        description="Start the rollout of a rolled-back candidate again from its agreement check: a value beginning "
        "with the candidate revision (status.rollout.candidate) and differing from status.rollout.retried, as "
        "`inferop rollout retry` writes it (REVISION/TIME); the spec must still serve that revision, and abort must "
        "not name it.",
    )
    pauses: list[StepPause] = Field(
        default_factory=list,
        max_length=20,
        description="Holds at steps, after their stepSeconds: for a time, or until promoted.",
    )
    webhook: Webhook | None = Field(default=None, description="Receives each decision of the rollout as JSON.")
    scale_down: ScaleDown = Field(
        default_factory=ScaleDown, description="How the stable pods follow the weight (through a gateway)."
    )

    @model_validator(mode="after")
    def _steps(self) -> Rollout:
        if self.steps[-1] != 100:
            last = self.steps[-1]
            raise ValueError(
                f"the last step must be 100 (the candidate takes all traffic before it is promoted), not {last}"
            )
        if any(later <= earlier for earlier, later in zip(self.steps, self.steps[1:], strict=False)):
            raise ValueError(f"steps {self.steps} must increase")
        for index, pause in enumerate(self.pauses):
            if pause.at_weight not in self.steps:
                raise ValueError(f"pauses[{index}].atWeight {pause.at_weight} is not one of steps {self.steps}")
        weights = [pause.at_weight for pause in self.pauses]
        if len(set(weights)) != len(weights):
            raise ValueError(f"pauses hold at the weights {weights}: at most one pause a step")
        return self

    def pause_at(self, step: int) -> StepPause | None:
        """The pause that holds at step `step` (an index of steps), if any."""
        return next((pause for pause in self.pauses if pause.at_weight == self.steps[step]), None)


class Pipeline(Section):
    """Callers send an image and read its top labels: the model's declared preprocessing before it and a top-k after
    it, run in the same Triton (an ensemble named as the model, the model itself served as <name>_model)."""

    input: Literal["image"] = Field(
        default="image", description="What callers send: image (the bytes of a JPEG or PNG file, a BYTES tensor)."
    )
    top_k: int = Field(
        default=DEFAULT_TOP_K, ge=1, le=1000, description="Labels, with their probabilities, in each answer."
    )
    max_image_bytes: Quantity = Field(
        default=f"{DEFAULT_MAX_IMAGE_BYTES // 2**20}Mi",
        description="Largest image accepted; a larger one is refused (400) before it is decoded.",
    )
    max_image_pixels: int = Field(
        default=DEFAULT_MAX_IMAGE_PIXELS,
        ge=1,
        le=1_000_000_000,
        description=(
            "Most pixels (width x height) an image may declare; more is refused (400) from its header, before it is "
            "decoded (a decompression bomb)."
        ),
    )
    images_per_cpu_second: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Images the stages decode, preprocess and rank per CPU-second, as inferop export measured them on "
            "photographs; the plan sizes the decoding instances and the CPUs they take from it."
        ),
    )
    pre_instances: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "Decoding instances (each one thread). Unset: enough to decode at the rate the model answers, from "
            "imagesPerCpuSecond (1 without it)."
        ),
    )

    @field_validator("max_image_bytes")
    @classmethod
    def _bytes(cls, value: int | str) -> int | str:
        if parse_quantity(value, "pipeline.maxImageBytes") < 1:
            raise ValueError(f"{value!r} must be at least one byte")
        return value

    @property
    def max_image_bytes_count(self) -> int:
        return int(parse_quantity(self.max_image_bytes, "pipeline.maxImageBytes"))


class Serving(Section):
    """How one model is served in one pod: the settings `inferop export` writes into config.pbtxt and its
    manifest, and the operator into the pod's config. Their defaults live here and nowhere else."""

    instances: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description=(
            "Triton model instances per pod. Unset: 2 where the CPU budget holds both instances' threads, else 1; "
            "one instance on several CPUs lets Triton's dynamic batcher hold a batch for 500 ms."
        ),
    )
    threads: Threads = Field(default_factory=Threads, description="ONNX Runtime threads per instance.")
    batching: Batching = Field(default_factory=Batching, description="Dynamic batching.")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Request and start-up timeouts.")


class InferenceServiceSpec(Serving):
    """A model served by NVIDIA Triton that cannot oversubscribe its CPUs, predictably fits in memory,
    times out instead of hanging, and scales on load."""

    model: Model = Field(description="The model to serve.")
    runtime: Runtime = Field(default_factory=Runtime, description="The serving container.")
    replicas: int = Field(default=1, ge=0, le=1000, description="Pods, when autoscaling is not set.")
    resources: Resources = Field(default_factory=Resources, description="Triton container resources.")
    autoscaling: Autoscaling | None = Field(default=None, description="Scale on load with an HPA.")
    gpu: Gpu | None = Field(default=None, description="GPU memory for the memory-fit check.")
    network_policy: NetworkPolicy = Field(
        default_factory=NetworkPolicy, description="Who may reach the Triton pods' ports (a NetworkPolicy)."
    )
    gateway: GatewayRef | None = Field(
        default=None,
        description=(
            "Route callers through this Gateway (an HTTPRoute; where Envoy Gateway is served, also a "
            "BackendTrafficPolicy that refuses at the gateway what the pods would reject); unset: the operator's "
            "default gateway, if any."
        ),
    )
    rollout: Rollout | None = Field(
        default=None,
        description="Roll a changed model or serving config out gradually, analysed at each step; unset: a change "
        "replaces the pods at once (a rolling update).",
    )
    pipeline: Pipeline | None = Field(
        default=None,
        description="Serve an image classifier behind its pipeline: callers send JPEG or PNG bytes and read the top "
        "labels; unset: callers send the model's tensors.",
    )

    @property
    def uses_gpu(self) -> bool:
        return parse_quantity(self.resources.limits.get(GPU_RESOURCE, 0), GPU_RESOURCE) > 0

    def serving_config(
        self, threads: ThreadPlan, queue_size: int | None, gpu_memory_limit_bytes: int | None = None
    ) -> ServingConfig:
        """The one translation of a spec into what config.pbtxt holds, given the threads, queue bound and (GPU)
        per-instance device memory the plan derived for it: export, the operator and local serving render this."""
        return ServingConfig(
            name=self.model.name,
            inputs=tuple(t.as_tensor_spec() for t in self.model.inputs),
            outputs=tuple(t.as_tensor_spec() for t in self.model.outputs),
            max_batch_size=self.batching.max_batch_size,
            instances=threads.instances,
            take_turns=threads.take_turns,
            device="gpu" if self.uses_gpu else "cpu",
            max_queue_delay_microseconds=self.batching.max_queue_delay_microseconds,
            max_queue_size=queue_size,
            request_timeout_microseconds=round(self.timeouts.request_seconds * 1_000_000),
            intra_op_threads=threads.intra_op,
            inter_op_threads=threads.inter_op,
            weights=self.model.weights,
            processing=self.model.processing,
            model_sha256=self.model.sha256,
            gpu_memory_limit_bytes=gpu_memory_limit_bytes,
        )

    def pipeline_config(self, model: ServingConfig, pre_instances: int) -> PipelineConfig | None:
        """The pipeline's configs' source, around the model's config as the plan made it (`model`, renamed
        <name>_model), with the decoding instances the plan derived; None without a pipeline."""
        if self.pipeline is None:
            return None
        return PipelineConfig(
            name=self.model.name,
            model=model.model_copy(update={"name": member_name(self.model.name, "model")}),
            top_k=self.pipeline.top_k,
            max_image_bytes=self.pipeline.max_image_bytes_count,
            max_image_pixels=self.pipeline.max_image_pixels,
            pre_instances=pre_instances,
        )

    @model_validator(mode="after")
    def _pipeline(self) -> InferenceServiceSpec:
        if self.pipeline is not None:
            tensors = [t.as_tensor_spec() for t in self.model.inputs], [t.as_tensor_spec() for t in self.model.outputs]
            try:
                check_image_classifier(self.model.name, self.model.processing, *tensors, self.pipeline.top_k)
            except ValueError as error:
                raise ValueError(f"pipeline: {error}") from None
        return self

    @model_validator(mode="after")
    def _agreement_rates(self) -> InferenceServiceSpec:
        """The agreement check's exact error rates within the stated ones: a maxSamples too small to decide most
        candidates near the threshold is refused here, not discovered in a rollout."""
        if self.rollout is None:
            return self
        design = self.rollout.agreement.test(len(agreement_gate(self).top1) + len(agreement_gate(self).max_abs_diff))
        worst = max(design.false_refusal, design.false_acceptance)
        if worst > 1 - STATED_CONFIDENCE:
            settings = self.rollout.agreement
            raise ValueError(
                f"rollout.agreement.maxSamples: {settings.max_samples} inputs leave the check's error rates at "
                f"{design.false_refusal:.2%} (false refusal) and {design.false_acceptance:.2%} (false acceptance), "
                f"above the {1 - STATED_CONFIDENCE:.0%} stated; give more, or a larger tolerance"
            )
        return self

    @model_validator(mode="after")
    def _gpu_memory(self) -> InferenceServiceSpec:
        if self.gpu is not None:
            parse_quantity(self.gpu.memory, "gpu.memory")
        return self


def agreement_gate(spec: InferenceServiceSpec) -> Gate:
    """How a rollout's agreement check judges the candidate's outputs: as the model's processing implies, with
    spec.rollout.agreement's threshold and largest difference. Behind a pipeline callers read the top labels of the
    first output only, and the check judges what they read: its top-1 class."""
    settings = spec.rollout.agreement if spec.rollout is not None else Agreement()
    outputs = [t.as_tensor_spec() for t in spec.model.outputs][: 1 if spec.pipeline is not None else None]
    return default_gate(spec.model.processing, outputs, settings.min_agreement, settings.max_abs_difference)


def parse_spec(raw: dict[str, Any] | Any) -> InferenceServiceSpec:
    """Validate a raw spec; errors list each field by its camelCase path with what was wrong."""
    try:
        return InferenceServiceSpec.model_validate(dict(raw or {}))
    except ValidationError as error:
        raise SpecError(format_errors(error)) from None


def parse_serving(raw: dict[str, Any]) -> Serving:
    """Validate serving settings alone (what export takes before a model exists), named as in a spec."""
    try:
        return Serving.model_validate(raw)
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

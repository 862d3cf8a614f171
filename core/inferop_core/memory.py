"""How much memory a served model takes at its peak: the estimate the memory fit and its fixes rest on.

The peak of a Triton pod is more than weights and activations. Measured with the local runtime inside a
memory cgroup (`make field` re-measures it and prints the error of every estimate), it is:

    runtime baseline
    + instances x (instance overhead + weight factor x weight bytes)
    + instances x activation factor x activation bytes per sample x maxBatchSize
    + queued: queue bound x (buffer factor x input bytes + request bytes)
    + executing: instances x maxBatchSize x (buffer factor x input and output bytes + request bytes)
    + busy: instances x busy-instance bytes
    + an image pipeline's stages (`stage_bytes`): their processes, the largest picture each decoding instance may
      hold, the queue full of the largest images

The last three only while the queue is full ("saturated"): a queued request holds its inputs, its outputs exist once
it has executed (a held-out model whose outputs are as large as its inputs showed it: counting both overestimated
its saturated peak by half); an instance executing batch after batch holds more than it did idle, whatever its
batch (at the same full queue, the conv net's peak rose more over idle with 2 instances than with 1). Idle, the
warm-up at the largest batch has already grown the activation arena. The estimate covers the memory the kernel
cannot reclaim: anonymous and shared memory. File pages (libraries, the model file) are reclaimable and are charged
to whichever cgroup read them first, so measurements start from a warm page cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from inferop_core.quantity import format_bytes

MiB = 2**20


@dataclass(frozen=True)
class RuntimeCosts:
    """The constants of one serving runtime, and where they were measured."""

    name: str
    baseline_bytes: int  # the server with nothing loaded
    instance_bytes: int  # each model instance before its weights: a process or a session
    weight_factor: float  # resident bytes per byte of weights (ONNX Runtime keeps initializers and prepacked copies)
    activation_factor: float  # arena bytes per byte of the profile's peak live activations
    buffer_factor: float  # resident copies of each request and response tensor in flight
    request_bytes: int  # each request in flight beyond its tensors: its connection and Triton's request object
    busy_instance_bytes: int  # each instance executing back to back, beyond what it held idle
    measured: str
    assumed: str | None = None  # what of these is assumed rather than measured, said wherever the estimate is shown


# Fitted by `make field`'s memory drill (scripts/field.py --calibrate), 2026-12-02, with the local runtime
# (tritonserver 2.51, python backend, ONNX Runtime 1.32, one intra-op thread, memory pattern off) in a cgroup v1
# memory controller on a 2-core AMD EPYC, on its fit set: both networks x instances 1, 2 x maxBatchSize 1, 8, 32,
# idle and saturated at the derived queue bound. Least squares on the idle peaks, then the buffer factor, the
# request bytes and the busy-instance bytes on saturated minus idle, over what the estimate counts (in_flight).
# Errors on that fit set -22% .. +16%; on the held-out set (the example ranker with two inputs, an ONNX file whose
# activations dwarf its weights, the conv net at batch 128, Inception V3 at batch 64) -5% .. +23%.
# The busy-instance term: at the same full queue of 1,024, the conv net's saturated peak rose 21-24 MiB over idle
# with 1 instance and 28, 82 and 39 MiB with 2 (batch 1, 8, 32); without the term the estimate had 35-37 MiB in
# flight for all six, 6-25% over the peaks with 1 instance and 25% under the one with 2 at batch 8. Its size rests
# mostly on that point: fitted without it, the term is 1.3 MiB. With it, the conv net's held-out batch of 128 is
# estimated 10% over its peak, not 19%. The buffer factor under one copy is least squares sharing Inception's
# saturated rise between the two terms: its queue bound grows with its instances (35 per instance).
# The constants before (fitted 2026-11-30 at a queue of 64) missed the conv net's saturated peak at the derived
# bound of 1,024 by 38%.
# The memory limit's margin (plan.MEMORY_MARGIN) is taken from the same fit set with these constants: a refit changes
# it too (tests/core/test_memory_measured.py derives it again).
LOCAL_RUNTIME = RuntimeCosts(
    name="local",
    baseline_bytes=12_161_024,
    instance_bytes=36_929_644,  # each instance is a python stub process with numpy and ONNX Runtime loaded
    weight_factor=1.855,
    activation_factor=1.504,
    buffer_factor=0.924,
    request_bytes=17_070,
    busy_instance_bytes=13_009_481,
    measured="make field's fit set (inferop serve, python backend, in a memory cgroup), 2026-12-02",
)

# NVIDIA's container runs ONNX Runtime inside the server process, so an instance is a session, not a process.
# Its baseline cannot be measured here (no container engine): the default is deliberately generous and is
# overridden by the operator's INFEROP_RUNTIME_MEMORY_OVERHEAD or an InferenceService's runtime.memoryOverhead.
# The per-byte factors are ONNX Runtime's own and were measured with the local runtime.
CONTAINER_RUNTIME = RuntimeCosts(
    name="container",
    baseline_bytes=512 * MiB,
    instance_bytes=16 * MiB,
    weight_factor=LOCAL_RUNTIME.weight_factor,
    activation_factor=LOCAL_RUNTIME.activation_factor,
    buffer_factor=2.0,  # the HTTP frontend's copy and the backend's input tensor
    request_bytes=LOCAL_RUNTIME.request_bytes,  # the same tritonserver frontend
    # Measured with the local runtime's stub processes, not for a session inside the server: the local one, as
    # the factors are.
    busy_instance_bytes=LOCAL_RUNTIME.busy_instance_bytes,
    measured="baseline not measured (container image); factors from the local runtime",
    assumed=(
        "the runtime's 512Mi is assumed, not measured for this image: set runtime.memoryOverhead or the operator's "
        "INFEROP_RUNTIME_MEMORY_OVERHEAD"
    ),
)


# Device memory of a GPU instance group: the CUDA context and ONNX Runtime's CUDA arena. Not measured here (no
# GPU on our machines): `scripts/gpu-check.sh` measures it where a GPU exists; override with runtime.memoryOverhead.
GPU_RUNTIME = RuntimeCosts(
    name="gpu",
    baseline_bytes=512 * MiB,  # CUDA context and cuDNN/cuBLAS workspaces
    instance_bytes=64 * MiB,
    weight_factor=1.0,
    activation_factor=2.0,  # cuDNN workspaces besides the activations; the arena grows only as asked (kSameAsRequested)
    buffer_factor=0.0,  # requests wait in host memory, not on the device
    request_bytes=0,
    busy_instance_bytes=0,  # a batch on the device is in the activation arena
    measured="not measured: defaults for a GPU, see scripts/gpu-check.sh",
    assumed="the GPU constants are defaults, not measured: scripts/gpu-check.sh measures them",
)


@dataclass(frozen=True)
class ModelCosts:
    """What the export's profile says about one model, per sample where it scales with the batch."""

    weight_bytes: int
    activation_bytes_per_sample: int
    io_bytes_per_sample: int  # inputs + outputs of one sample
    input_bytes_per_sample: int | None = None  # inputs alone, what a queued request holds; None: as io_bytes


@dataclass(frozen=True)
class ServingShape:
    """The settings the peak scales with."""

    instances: int
    max_batch_size: int
    queue_bound: int | None  # None: unbounded, so no estimate holds under overload


@dataclass(frozen=True)
class MemoryEstimate:
    baseline: int
    instances: int
    weights: int
    activations: int
    in_flight: int  # requests queued and executing, and the instances busy with them
    unbounded: bool  # the queue has no bound: in-flight memory grows with the load
    assumed: str | None = None  # the runtime's RuntimeCosts.assumed
    stages: int = 0  # an image pipeline's stages (stage_bytes)

    @property
    def total(self) -> int:
        return self.baseline + self.instances + self.weights + self.activations + self.in_flight + self.stages

    def explain(self) -> str:
        parts = [
            f"{format_bytes(self.baseline)} runtime",
            f"{format_bytes(self.instances)} instances",
            f"{format_bytes(self.weights)} weights",
            f"{format_bytes(self.activations)} activations",
            f"{format_bytes(self.in_flight)} in-flight requests" + (" (queue unbounded)" if self.unbounded else ""),
            *([f"{format_bytes(self.stages)} pipeline stages"] if self.stages else []),
        ]
        return f"{' + '.join(parts)} = {format_bytes(self.total)}"


@dataclass(frozen=True)
class InFlight:
    """What a pod with its queue full holds in flight, in the units the runtime's constants multiply."""

    tensor_bytes: int  # the buffer factor's: each queued request's inputs, each executing request's inputs and outputs
    requests: int  # the request bytes': queued and executing
    busy_instances: int  # the busy-instance bytes': every instance


def in_flight(model: ModelCosts, shape: ServingShape) -> InFlight:
    """The queue full and every instance executing its largest batch. The estimate and the fit of the constants
    (inferop_devtools.field.memory.calibrate) both count through it: a constant fitted on other terms than the
    estimate multiplies would be wrong by the difference."""
    queued, executing = shape.queue_bound or 0, shape.instances * shape.max_batch_size
    inputs = model.io_bytes_per_sample if model.input_bytes_per_sample is None else model.input_bytes_per_sample
    return InFlight(queued * inputs + executing * model.io_bytes_per_sample, queued + executing, shape.instances)


def estimate_memory(
    model: ModelCosts, shape: ServingShape, costs: RuntimeCosts, saturated: bool = True
) -> MemoryEstimate:
    """The peak of one pod (saturated: its queue full), or its level once models are loaded and warm (idle)."""
    n, batch = shape.instances, shape.max_batch_size
    held = in_flight(model, shape)
    in_flight_bytes = (
        held.tensor_bytes * costs.buffer_factor
        + held.requests * costs.request_bytes
        + held.busy_instances * costs.busy_instance_bytes
        if saturated
        else 0
    )
    return MemoryEstimate(
        baseline=costs.baseline_bytes,
        instances=n * costs.instance_bytes,
        weights=round(n * model.weight_bytes * costs.weight_factor),
        activations=round(n * batch * model.activation_bytes_per_sample * costs.activation_factor),
        in_flight=round(in_flight_bytes),
        unbounded=saturated and shape.queue_bound is None,
        assumed=costs.assumed,
    )


def instance_device_bytes(model: ModelCosts, max_batch_size: int, costs: RuntimeCosts) -> int:
    """What one GPU instance's ONNX Runtime arena holds at its peak: one instance's share of the pod estimate
    (its session, its weights and the activations of its largest batch); requests wait in host memory."""
    one = estimate_memory(model, ServingShape(1, max_batch_size, queue_bound=0), costs, saturated=False)
    return one.instances + one.weights + one.activations


# An image pipeline's stages are python stub processes (inferop/serving/pipeline.py) in every runtime. Measured with
# `inferop serve` on Inception V3's pipeline after five JPEGs (2026-12-06): the decoding stage's stub 46 MiB resident
# (21 MiB of it anonymous, the rest its libraries' pages), the top-k stage's 40 MiB; the larger is the cost of each.
STAGE_PROCESS_BYTES = 46 * MiB
# The decoding stage's peak rise per pixel of the picture it takes in, decode and preprocessing together (ru_maxrss,
# inferop.serving.pipeline.image_tensor, 2026-12-06): of 6000x6000 pictures, 16-bit grey, RGBA, grey with alpha and
# palette with transparency PNGs 8.06 bytes (the picture and its composite on white), grey and palette 5.06, RGB 4.3,
# JPEGs 0.3 (decoded at the scale the resize needs); held out, 4000x2500 RGBA and 16-bit grey PNGs 8.22 and 8.23, which
# this is 3% over. The worst, for every picture: its pixels are declared in its header and refused past
# maxImagePixels before they are decoded.
DECODED_BYTES_PER_PIXEL = 8.5


def stage_bytes(
    pre_instances: int,
    post_instances: int,
    max_image_pixels: int,
    max_image_bytes: int,
    queue_bound: int | None,
    executing: int,
    costs: RuntimeCosts,
) -> int:
    """An image pipeline's stages at their peak: each instance's process, each decoding instance holding the largest
    picture it may decode, and every request in the pipeline holding the largest image: a caller's image is kept until
    the ensemble answers, so those queued for decoding, those decoded and queued for the model (both queues have the
    model's bound) and those `executing` (the model's instances x batch, the decoding instances)."""
    processes = (pre_instances + post_instances) * STAGE_PROCESS_BYTES
    pictures = pre_instances * max_image_pixels * DECODED_BYTES_PER_PIXEL
    requests = 2 * (queue_bound or 0) + executing + pre_instances
    images = requests * (costs.buffer_factor * max_image_bytes + costs.request_bytes)
    return round(processes + pictures + images)

"""The decisions that make a spec safe to run: the thread budget and the memory fit.

Pure functions of the spec. A spec that would oversubscribe its CPUs or could not fit its memory is
refused here, before any pod exists, with the arithmetic and a fix in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from inferop_core.capacity import QueueBound, derive_queue_bound, pod_capacity
from inferop_core.errors import InferopError
from inferop_core.memory import (
    CONTAINER_RUNTIME,
    GPU_RUNTIME,
    MemoryEstimate,
    ModelCosts,
    RuntimeCosts,
    ServingShape,
    estimate_memory,
    instance_device_bytes,
    stage_bytes,
)
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_core.stages import StagePlan, check_stages, plan_stages
from inferop_core.threads import OversubscribedError, ThreadPlan, check_budget, plan_threads
from inferop_core.tritonconfig import TOP_K_INSTANCES, PipelineConfig, ServingConfig
from inferop_operator.identity import ROUTE_API
from inferop_operator.spec import GatewayRef, InferenceServiceSpec

# A memory limit is the peak estimate x MEMORY_MARGIN, so that it covers the peak the kernel measures: the largest
# measured peak over its estimate on the fit set the local runtime's constants were fitted on
# (tests/data/memory_measured.json, make field 2026-12-02): the conv net, 2 instances at maxBatchSize 8 with its
# queue full, 184 MiB against 144 MiB estimated (-22%, a ratio of 1.275), rounded up to hundredths.
# tests/core/test_memory_measured.py derives it again from those points (inferop_devtools.field.memory.margin_needed)
# and checks that the limit covers every measured peak, the held-out ones too. Export writes manifests with it, the
# OOMKilled advice suggests limits with it, and docs/reference/memory.md shows the limits it gives on every point.
MEMORY_MARGIN = 1.28


def memory_limit(peak_bytes: float) -> str:
    """The memory limit for a peak estimate (or a limit that proved too small): the margin on top, in whole MiB
    rounded up, so that the quantity passes the fit check it was sized for."""
    return f"{needed_limit_bytes(peak_bytes) // 2**20}Mi"


def needed_limit_bytes(peak_bytes: float) -> int:
    """The bytes of memory_limit(peak_bytes): the least memory limit the fit check accepts for that estimate."""
    return math.ceil(peak_bytes * MEMORY_MARGIN / 2**20) * 2**20


class Refusal(InferopError):
    """The spec is valid but must not run; `condition` is the status condition that explains why."""

    def __init__(self, condition: str, reason: str, message: str):
        super().__init__(message)
        self.condition, self.reason, self.message = condition, reason, message


@dataclass(frozen=True)
class MemoryFit:
    estimate: MemoryEstimate  # the pod's peak with its queue full
    available_bytes: float | None  # None: no limit to check against
    against: str  # what the estimate was compared with
    max_batch_size: int | None = None  # largest batch that fits with the requested instances
    max_instances: int | None = None  # most instances that fit at the requested batch size
    max_image_mib: int | None = None  # with a pipeline: the largest pipeline.maxImageBytes, in MiB, that fits
    margin: bool = False  # whether the limit must hold the estimate with MEMORY_MARGIN (a memory limit)

    @property
    def required_bytes(self) -> int:
        return self.estimate.total

    @property
    def needed_bytes(self) -> int:
        """What the limit must be: for a memory limit, the one memory_limit writes for the estimate, since the
        kernel OOM-kills a container at its limit and the estimate may be under the peak by what the margin covers
        (a limit equal to the estimate of Inception V3 at 1 CPU was OOM-killed on the node at saturation)."""
        return needed_limit_bytes(self.required_bytes) if self.margin else self.required_bytes

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.needed_bytes <= self.available_bytes

    def explain(self) -> str:
        arithmetic = f"peak estimate {self.estimate.explain()}"
        if self.margin:
            arithmetic += f", x {MEMORY_MARGIN} margin = {format_bytes(self.needed_bytes)}"
        assumed = f" ({self.estimate.assumed})" if self.estimate.assumed else ""
        if self.available_bytes is None:
            return f"{arithmetic}; not checked: {self.against}{assumed}"
        return f"{arithmetic} against {format_bytes(self.available_bytes)} {self.against}{assumed}"


@dataclass(frozen=True)
class Plan:
    """What the operator will deploy: the config, the effective threads and the memory estimate."""

    serving: ServingConfig
    threads: ThreadPlan
    cpu_source: str  # "limit", "request" or "assumed"
    queue: QueueBound
    memory: MemoryFit
    warnings: list[str] = field(default_factory=list)
    stages: StagePlan | None = None  # with a pipeline: the CPUs and instances of its stages
    pipeline: PipelineConfig | None = None  # with a pipeline: its members' source, the model's config in it


def plan_service(spec: InferenceServiceSpec, runtime: RuntimeCosts = CONTAINER_RUNTIME) -> Plan:
    """Derive threads and the queue bound, check both budgets; raise Refusal with a message a user can act on.

    `runtime` holds the memory constants of what will serve the model (NVIDIA's container by default);
    the spec's runtime.memoryOverhead replaces its baseline.
    """
    warnings: list[str] = []
    _, cpu_source = cpu_budget(spec)
    if cpu_source == "assumed":
        warnings.append("no CPU limit or request set: the thread budget assumes 1 CPU; set resources.limits.cpu")
    stages = stage_plan(spec)
    cpus = model_cpus(spec)
    threads = plan_threads(cpus, spec.instances, spec.threads.intra_op, spec.threads.inter_op)
    try:
        if stages is not None:
            check_stages(stages, spec.threads.allow_oversubscription)
        at_limit = None if stages is None else (lambda limit: _model_cpus_at(spec, limit))
        check_budget(threads, spec.threads.allow_oversubscription, at_limit)
    except OversubscribedError as error:
        assumed = " (1 CPU assumed: no CPU limit or request is set)" if cpu_source == "assumed" else ""
        raise Refusal("ThreadBudget", "Oversubscribed", f"{error}{assumed}") from None
    if threads.oversubscribed:
        warnings.append(f"oversubscription allowed by threads.allowOversubscription: {threads.explain()}")

    costs = runtime_costs(spec, runtime)
    memory = memory_fit(spec, costs)
    asked = spec.instances
    if not memory.fits and asked is None and threads.instances > 1:
        # Derived, not asked for: one instance that fits serves, where two would be refused.
        one = spec.model_copy(update={"instances": 1})
        if (alone := memory_fit(one, costs)).fits:
            spec, memory = one, alone
            threads = plan_threads(cpus, 1, spec.threads.intra_op, spec.threads.inter_op)
            warnings.append(
                f"one instance: {memory.explain()}, and two would not fit; with one instance Triton's dynamic "
                "batcher can hold a batch for 500 ms: raise resources.limits.memory for two"
            )
    if asked == 1:  # one derived for memory has its own warning above
        two = plan_threads(cpus, None, spec.threads.intra_op, spec.threads.inter_op)
        instead = "leave instances unset (2 here, taking turns)" if two.take_turns else "leave instances unset or set 2"
        warnings.append(
            "instances: 1: Triton's dynamic batcher hands a batch only to an instance waiting for one, so when every "
            f"caller has sent again before the one instance is back, the batch waits for the batcher's 500 ms timer; "
            f"{instead}"
        )
    queue = queue_bound(spec, threads)
    if queue.source == "unknown capacity":
        warnings.append(queue.explain(spec.timeouts.request_seconds))
    if not memory.fits:
        fixes = []
        if memory.max_batch_size:
            fixes.append(f"batching.maxBatchSize <= {memory.max_batch_size}")
        if memory.max_instances:
            fixes.append(f"instances <= {memory.max_instances}")
        if memory.max_image_mib:
            fixes.append(f"pipeline.maxImageBytes <= {memory.max_image_mib}Mi")
        # Whole MiB rounded up, so the amount suggested is a quantity that passes this very check.
        fixes.append(f"at least {math.ceil(memory.needed_bytes / 2**20)}Mi {memory.against.split(' (')[0]}")
        raise Refusal(
            "MemoryFit",
            "InsufficientMemory",
            f"model does not fit: {memory.explain()}. Fix: {' or '.join(fixes)}",
        )
    if memory.available_bytes is None:
        warnings.append(f"memory fit not checked: {memory.against}")
    if spec.model.precision == "int8" and spec.model.int8_nodes != "required":
        warnings.append(
            f"int8 model with int8Nodes {spec.model.int8_nodes}: pods may land on nodes without int8 dot-product "
            "instructions (AVX-512 VNNI, AVX-VNNI, AMX), where int8 runs about as fast as fp32; set "
            "model.int8Nodes: required to keep them off"
        )

    if spec.model.fetched and spec.model.sha256 is None:
        warnings.append(
            f"model.sha256 is not set: the model fetched from {spec.model.storage_uri} is served unchecked; set it to "
            "the digest inferop export records, so that a changed or half-written object is refused"
        )

    if stages is not None and stages.share is None:
        warnings.append(f"pipeline: {stages.explain()}; re-export with --pipeline image to measure it")
    if stages is not None and stages.oversubscribed:
        warnings.append(f"oversubscription allowed by threads.allowOversubscription: {stages.explain()}")

    serving = spec.serving_config(threads, queue.size, gpu_memory_limit(spec, threads.instances, memory, costs))
    pipeline = spec.pipeline_config(serving, stages.pre_instances) if stages is not None else None
    return Plan(
        serving=serving,
        threads=threads,
        cpu_source=cpu_source,
        queue=queue,
        memory=memory,
        warnings=warnings,
        stages=stages,
        pipeline=pipeline,
    )


def check_routing(spec: InferenceServiceSpec, gateway: GatewayRef | None, served: bool) -> None:
    """Refuse header matches, mirroring and a NetworkPolicy open to the gateway alone without a gateway (`gateway`,
    the spec's or the operator's default, where Gateway API is `served`): only a gateway routes by header or mirrors
    requests, and without one such a policy would refuse every caller."""
    if gateway is not None and served:
        return
    rollout = spec.rollout
    needs = [
        f"spec.rollout.{field}" for field, value in (("header", rollout and rollout.header),
                                                     ("shadow", rollout and rollout.shadow)) if value
    ]  # fmt: skip
    if spec.network_policy.enabled and spec.network_policy.inference_from == "gateway":
        needs.append("spec.networkPolicy.inferenceFrom gateway")
    if needs:
        fields = " and ".join(needs)
        why = (
            "no gateway is named (spec.gateway, or the operator's default gateway)"
            if gateway is None
            else (f"Gateway API ({ROUTE_API} httproutes) is not served by this cluster")
        )
        raise Refusal(
            "Rollout" if needs[0].startswith("spec.rollout") else "ChildrenApplied",
            "NeedsGateway",
            f"{fields} need a Gateway API implementation routing to the service, and {why}: install Gateway "
            "API's CRDs and an implementation (e.g. Envoy Gateway), create a Gateway and name it in spec.gateway",
        )


def gpu_memory_limit(spec: InferenceServiceSpec, instances: int, memory: MemoryFit, costs: RuntimeCosts) -> int | None:
    """Each GPU instance's share of the device (the backend's gpu_mem_limit): gpu.memory less the runtime's
    baseline, split between the instances, so that together they can never take more than the device has;
    without gpu.memory, one instance's estimate with the margin. An allocation beyond it fails that request
    with an error, where an exhausted device would fail every instance."""
    if not spec.uses_gpu:
        return None
    if memory.available_bytes is not None:
        return math.floor((memory.available_bytes - memory.estimate.baseline) / instances)
    peak = instance_device_bytes(model_costs(spec), spec.batching.samples_per_batch, costs)
    return math.ceil(peak * MEMORY_MARGIN)


def cpu_budget(spec: InferenceServiceSpec) -> tuple[float, str]:
    """CPUs a pod may use: the limit, else the request, else 1 (assumed, with a warning)."""
    for source, values in (("limit", spec.resources.limits), ("request", spec.resources.requests)):
        if "cpu" in values:
            return parse_quantity(values["cpu"], f"resources.{source}s.cpu"), source
    return 1.0, "assumed"


def stage_plan(spec: InferenceServiceSpec) -> StagePlan | None:
    """With a pipeline: the CPUs its stages take and their decoding instances (inferop_core.stages)."""
    if spec.pipeline is None:
        return None
    return plan_stages(
        cpu_budget(spec)[0],
        spec.model.profile.samples_per_cpu_second,
        spec.pipeline.images_per_cpu_second,
        spec.pipeline.pre_instances,
    )


def _model_cpus_at(spec: InferenceServiceSpec, limit: int) -> float:
    """The CPUs the model's threads get under a CPU limit of `limit`, the stages' share set aside as planned."""
    resources = spec.resources.model_copy(update={"limits": {**spec.resources.limits, "cpu": str(limit)}})
    return model_cpus(spec.model_copy(update={"resources": resources}))


def model_cpus(spec: InferenceServiceSpec) -> float:
    """The CPUs the model's threads are planned on: the pod's, less those a pipeline's stages take."""
    stages = stage_plan(spec)
    return cpu_budget(spec)[0] if stages is None else stages.model_cpus


def queue_bound(spec: InferenceServiceSpec, threads: ThreadPlan) -> QueueBound:
    """batching.maxQueueSize, else derived from the measured capacity and the request timeout."""
    return derive_queue_bound(
        pod_capacity(spec.model.profile.samples_per_cpu_second, threads),
        spec.timeouts.request_seconds,
        threads.instances,
        spec.batching.samples_per_batch,
        requested=spec.batching.max_queue_size,
    )


def runtime_costs(spec: InferenceServiceSpec, runtime: RuntimeCosts) -> RuntimeCosts:
    """The runtime's constants, on the GPU device-memory ones for GPU specs, with the spec's overhead."""
    costs = GPU_RUNTIME if spec.uses_gpu else runtime
    if spec.runtime.memory_overhead is not None:
        overhead = parse_quantity(spec.runtime.memory_overhead, "runtime.memoryOverhead")
        # The baseline is the user's now; a GPU's other constants are still defaults.
        costs = replace(costs, baseline_bytes=round(overhead), assumed=None if costs is runtime else costs.assumed)
    return costs


def estimate_peak(spec: InferenceServiceSpec, costs: RuntimeCosts) -> MemoryEstimate:
    """The pod's peak with its queue full, for `spec` as it stands (threads and queue bound re-derived)."""
    threads = plan_threads(model_cpus(spec), spec.instances, spec.threads.intra_op, spec.threads.inter_op)
    shape = ServingShape(threads.instances, spec.batching.samples_per_batch, queue_bound(spec, threads).size)
    estimate = estimate_memory(model_costs(spec), shape, costs)
    stages, pipeline = stage_plan(spec), spec.pipeline
    if stages is None or pipeline is None:
        return estimate
    held = stage_bytes(
        stages.pre_instances,
        TOP_K_INSTANCES,
        pipeline.max_image_pixels,
        pipeline.max_image_bytes_count,
        shape.queue_bound,
        shape.instances * shape.max_batch_size,
        costs,
    )
    return replace(estimate, stages=held)


def model_costs(spec: InferenceServiceSpec) -> ModelCosts:
    """What the memory estimate needs of the model: its profile and the bytes of its tensors per sample
    (as export measured them, else from the tensors' dims), and of its inputs alone."""
    profile = spec.model.profile
    tensors = (*spec.model.inputs, *spec.model.outputs)
    return ModelCosts(
        weight_bytes=profile.weight_bytes,
        activation_bytes_per_sample=profile.activation_bytes_per_sample,
        io_bytes_per_sample=profile.io_bytes_per_sample
        if profile.io_bytes_per_sample is not None
        else sum(t.as_tensor_spec().bytes_per_sample for t in tensors),
        # Inputs have fixed dims (export refuses an open one), so their bytes are exact.
        input_bytes_per_sample=sum(t.as_tensor_spec().bytes_per_sample for t in spec.model.inputs),
    )


def memory_fit(spec: InferenceServiceSpec, costs: RuntimeCosts) -> MemoryFit:
    """The peak estimate against the memory limit (CPU) or gpu.memory (GPU), with the largest batch size and
    instance count that fit: each found by re-estimating the changed spec, so a suggested fix passes."""
    estimate = estimate_peak(spec, costs)
    if spec.uses_gpu:
        if spec.gpu is None:
            return MemoryFit(estimate, None, "gpu.memory is not set")
        available, against = parse_quantity(spec.gpu.memory, "gpu.memory"), "of GPU memory (gpu.memory)"
    elif "memory" in spec.resources.limits:
        available = parse_quantity(spec.resources.limits["memory"], "resources.limits.memory")
        against = "of memory (resources.limits.memory)"
    else:
        return MemoryFit(estimate, None, "resources.limits.memory is not set")

    margin = not spec.uses_gpu

    def fits(**changes: Any) -> bool:
        peak = estimate_peak(_changed(spec, **changes), costs).total
        return (needed_limit_bytes(peak) if margin else peak) <= available

    max_batch = next((b for b in range(spec.batching.max_batch_size - 1, 0, -1) if fits(max_batch_size=b)), None)
    instances = plan_threads(model_cpus(spec), spec.instances, spec.threads.intra_op, spec.threads.inter_op).instances
    max_instances = next((n for n in range(instances - 1, 0, -1) if fits(instances=n)), None)
    max_image_mib = None
    if spec.pipeline is not None:  # the estimate grows with the largest image allowed: the most MiB that fit
        low, high = 0, math.ceil(spec.pipeline.max_image_bytes_count / 2**20) - 1
        while low < high:
            middle = (low + high + 1) // 2
            low, high = (middle, high) if fits(max_image_mib=middle) else (low, middle - 1)
        max_image_mib = low or None
    return MemoryFit(estimate, available, against, max_batch, max_instances, max_image_mib, margin)


def _changed(
    spec: InferenceServiceSpec,
    max_batch_size: int | None = None,
    instances: int | None = None,
    max_image_mib: int | None = None,
) -> Any:
    batching = spec.batching.model_copy(update={"max_batch_size": max_batch_size or spec.batching.max_batch_size})
    changed = spec.model_copy(update={"batching": batching, "instances": instances or spec.instances})
    if max_image_mib is not None and spec.pipeline is not None:
        pipeline = spec.pipeline.model_copy(update={"max_image_bytes": f"{max_image_mib}Mi"})
        changed = changed.model_copy(update={"pipeline": pipeline})
    return changed

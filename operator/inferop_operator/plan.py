"""The decisions that make a spec safe to run: the thread budget and the memory fit.

Pure functions of the spec. A spec that would oversubscribe its CPUs or could not fit its memory is
refused here, before any pod exists, with the arithmetic and a fix in the message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from inferop.quantity import format_bytes, parse_quantity
from inferop.threads import OversubscribedError, ThreadPlan, check_budget, plan_threads
from inferop.tritonconfig import ServingConfig
from inferop_operator.spec import InferenceServiceSpec


class Refusal(Exception):
    """The spec is valid but must not run; `condition` is the status condition that explains why."""

    def __init__(self, condition: str, reason: str, message: str):
        super().__init__(message)
        self.condition, self.reason, self.message = condition, reason, message


@dataclass(frozen=True)
class MemoryFit:
    required_bytes: int
    available_bytes: float | None  # None: no limit to check against
    against: str  # what the estimate was compared with
    max_batch_size: int | None = None  # largest batch that fits with the requested instances
    max_instances: int | None = None  # most instances that fit at the requested batch size

    @property
    def fits(self) -> bool:
        return self.available_bytes is None or self.required_bytes <= self.available_bytes

    def explain(self, spec: InferenceServiceSpec) -> str:
        profile, instances, batch = spec.model.profile, spec.instances, spec.batching.max_batch_size
        arithmetic = (
            f"{format_bytes(profile.weight_bytes)} weights x {instances} instance(s) + "
            f"{format_bytes(profile.activation_bytes_per_sample)} activations x batch {batch} x {instances} "
            f"instance(s) = {format_bytes(self.required_bytes)}"
        )
        if self.available_bytes is None:
            return f"{arithmetic}; not checked: {self.against}"
        return f"{arithmetic} against {format_bytes(self.available_bytes)} {self.against}"


@dataclass(frozen=True)
class Plan:
    """What the operator will deploy: the config, the effective threads and the memory estimate."""

    serving: ServingConfig
    threads: ThreadPlan
    cpu_source: str  # "limit", "request" or "assumed"
    memory: MemoryFit
    warnings: list[str] = field(default_factory=list)


def plan_service(spec: InferenceServiceSpec) -> Plan:
    """Derive threads and check both budgets; raise Refusal with a message a user can act on."""
    warnings: list[str] = []
    cpus, cpu_source = cpu_budget(spec)
    if cpu_source == "assumed":
        warnings.append("no CPU limit or request set: the thread budget assumes 1 CPU; set resources.limits.cpu")
    threads = plan_threads(cpus, spec.instances, spec.threads.intra_op, spec.threads.inter_op)
    try:
        check_budget(threads, spec.threads.allow_oversubscription)
    except OversubscribedError as error:
        assumed = " (1 CPU assumed: no CPU limit or request is set)" if cpu_source == "assumed" else ""
        raise Refusal("ThreadBudget", "Oversubscribed", f"{error}{assumed}") from None
    if threads.oversubscribed:
        warnings.append(f"oversubscription allowed by threads.allowOversubscription: {threads.explain()}")

    memory = memory_fit(spec)
    if not memory.fits:
        fixes = []
        if memory.max_batch_size:
            fixes.append(f"batching.maxBatchSize <= {memory.max_batch_size}")
        if memory.max_instances:
            fixes.append(f"instances <= {memory.max_instances}")
        fixes.append(f"at least {format_bytes(memory.required_bytes)} {memory.against.split(' (')[0]}")
        raise Refusal(
            "MemoryFit",
            "InsufficientMemory",
            f"model does not fit: {memory.explain(spec)}. Fix: {' or '.join(fixes)}",
        )
    if memory.available_bytes is None:
        warnings.append(f"memory fit not checked: {memory.against}")

    serving = ServingConfig(
        name=spec.model.name,
        inputs=tuple(t.as_tensor_spec() for t in spec.model.inputs),
        outputs=tuple(t.as_tensor_spec() for t in spec.model.outputs),
        max_batch_size=spec.batching.max_batch_size,
        instances=spec.instances,
        device="gpu" if spec.uses_gpu else "cpu",
        max_queue_delay_microseconds=spec.batching.max_queue_delay_microseconds,
        max_queue_size=spec.batching.max_queue_size,
        request_timeout_microseconds=round(spec.timeouts.request_seconds * 1_000_000),
        intra_op_threads=threads.intra_op,
        inter_op_threads=threads.inter_op,
    )
    return Plan(serving=serving, threads=threads, cpu_source=cpu_source, memory=memory, warnings=warnings)


def cpu_budget(spec: InferenceServiceSpec) -> tuple[float, str]:
    """CPUs a pod may use: the limit, else the request, else 1 (assumed, with a warning)."""
    for source, values in (("limit", spec.resources.limits), ("request", spec.resources.requests)):
        if "cpu" in values:
            return parse_quantity(values["cpu"], f"resources.{source}s.cpu"), source
    return 1.0, "assumed"


def memory_fit(spec: InferenceServiceSpec) -> MemoryFit:
    """weights x instances + activations x maxBatchSize x instances, against the memory limit (CPU) or
    gpu.memory (GPU), with the largest batch size and instance count that would fit."""
    weights = spec.model.profile.weight_bytes
    activations = spec.model.profile.activation_bytes_per_sample
    instances, batch = spec.instances, spec.batching.max_batch_size
    required = weights * instances + activations * batch * instances
    if spec.uses_gpu:
        if spec.gpu is None:
            return MemoryFit(required, None, "gpu.memory is not set")
        available, against = parse_quantity(spec.gpu.memory, "gpu.memory"), "of GPU memory (gpu.memory)"
    elif "memory" in spec.resources.limits:
        available = parse_quantity(spec.resources.limits["memory"], "resources.limits.memory")
        against = "of memory (resources.limits.memory)"
    else:
        return MemoryFit(required, None, "resources.limits.memory is not set")
    max_batch = math.floor((available - weights * instances) / (activations * instances)) if activations else None
    max_instances = math.floor(available / (weights + activations * batch)) if weights + activations else None
    return MemoryFit(
        required_bytes=required,
        available_bytes=available,
        against=against,
        max_batch_size=max_batch if max_batch and max_batch >= 1 else None,
        max_instances=max_instances if max_instances and max_instances >= 1 else None,
    )

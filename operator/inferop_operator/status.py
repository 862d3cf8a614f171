"""Status that tells the truth: phase, conditions, replicas and URL, derived from facts, never assumed.

The status is a typed model, as the spec is: the CRD's status schema is generated from it (an API server prunes
every status field its schema does not list), and the handlers patch its camelCase dump. Pure functions: the
handlers pass in what they know (the plan or the refusal, the Deployment's status, the status written last) and
patch what these return.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import Field, ValidationError

from inferop_operator.builders import CHILDREN, Service, selector_labels
from inferop_operator.diagnosis import diagnose
from inferop_operator.plan import Plan
from inferop_operator.rollout import Reported, RolloutStatus

if TYPE_CHECKING:  # the status stays free of the Kubernetes client; it only reads a failure's fields
    from inferop_operator.kubeapi import ApiFailure

ConditionType = Literal[
    "Valid", "ThreadBudget", "MemoryFit", "ChildrenApplied", "Progressing", "PodsHealthy", "Available", "Rollout",
    "Agreement", "Analysis", "Ready",
]  # fmt: skip
CONDITION_TYPES: tuple[ConditionType, ...] = get_args(ConditionType)
Phase = Literal["Ready", "Progressing", "Pending", "Failed"]


# Reported (rollout.py): a part of the status, camelCase like the spec. A field this model does not know (an older
# operator's) is ignored when the status is read, so it cannot fail every reconcile.


class Condition(Reported):
    """One check and its outcome, as Kubernetes conditions are written."""

    type: ConditionType = Field(description="What was checked.")
    status: Literal["True", "False", "Unknown"] = Field(description="The outcome: True, False or Unknown.")
    reason: str = Field(description="The outcome in one CamelCase word, for tools.")
    message: str = Field(default="", description="The outcome for a person: the arithmetic, the server's answer.")
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339, UTC); a new message alone does not move it."
    )


class ThreadsStatus(Reported):
    """The effective thread plan of each pod."""

    cpus: float = Field(description="CPUs a pod may use, from which the thread counts are derived.")
    cpu_source: str = Field(description="Where cpus came from: limit, request, or assumed (neither is set).")
    instances: int = Field(description="Triton model instances per pod.")
    intra_op: int = Field(description="ONNX Runtime intra-op threads of each instance.")
    inter_op: int = Field(description="ONNX Runtime inter-op threads of each instance.")
    summary: str = Field(
        description=(
            "instances x (intraOp + interOp) / whole CPUs, as `kubectl get` shows it; 'in turns': the instances "
            "execute one at a time."
        )
    )


class QueueStatus(Reported):
    """The bound of Triton's request queue."""

    max_queue_size: int = Field(description="Requests queued per model before new ones are rejected.")
    source: str = Field(description="spec (batching.maxQueueSize), capacity (derived), or unknown capacity.")
    capacity_samples_per_second: float | None = Field(
        default=None, description="Samples a pod serves per second, when the model's profile measured it."
    )


class MemoryStatus(Reported):
    """The pod's memory estimate with its queue full, and what it was checked against."""

    required_bytes: int = Field(description="Peak bytes a pod needs with its queue full.")
    available_bytes: int | None = Field(
        default=None, description="The memory limit (CPU) or gpu.memory (GPU) it fits in; unset: not checked."
    )


class Status(Reported):
    """Observed state: phase, conditions, URL, replicas, threads, the queue bound, memory and warnings."""

    phase: Phase | None = Field(
        default=None,
        description=(
            "Ready; Progressing; Pending while a child the API server refused is retried; Failed for a spec that "
            "cannot run (invalid, refused, or a child the API server rejects as invalid)."
        ),
    )
    observed_generation: int | None = Field(default=None, description="The spec generation this status is about.")
    conditions: list[Condition] = Field(
        default_factory=list,
        description=(
            "Valid, ThreadBudget, MemoryFit, ChildrenApplied, Progressing (the rollout), PodsHealthy (why pods fail, "
            "with the fix), Available and Ready, in this order."
        ),
    )
    url: str | None = Field(default=None, description="Where the Service serves Triton's HTTP API.")
    replicas: int | None = Field(default=None, description="Pods of the Deployment (the scale subresource's count).")
    ready_replicas: int | None = Field(default=None, description="Pods of the Deployment that are ready.")
    threads: ThreadsStatus | None = Field(default=None, description="The effective thread plan of each pod.")
    queue: QueueStatus | None = Field(default=None, description="The bound of Triton's request queue.")
    memory: MemoryStatus | None = Field(default=None, description="The pod's memory estimate with its queue full.")
    selector: str | None = Field(default=None, description="Label selector of the pods (the scale subresource's).")
    warnings: list[str] | None = Field(
        default=None, description="What the plan warns about; each is posted as a Warning event once, when new."
    )
    rollout: RolloutStatus | None = Field(
        default=None, description="The revisions and, while a changed spec rolls out, where it stands."
    )

    def condition(self, kind: str) -> Condition | None:
        return next((c for c in self.conditions if c.type == kind), None)


def read_status(raw: Any) -> Status:
    """The status as last written. One this model cannot read counts as none: it is rewritten, not retried forever."""
    try:
        return Status.model_validate(dict(raw or {}))
    except ValidationError:
        return Status()


def status_patch(current: Mapping[str, Any], new: Status) -> dict[str, Any]:
    """The JSON merge patch that makes the written status (`current`, as read) say `new`: only the fields that
    changed, so a resync of a converged service writes nothing. Fields `new` leaves unset (the threads of an
    invalid spec) keep what they said; inside a field, a key `new` no longer has is removed (a merge patch would
    otherwise keep a stale memory.availableBytes)."""

    def diff(before: Any, after: Any) -> Any:
        if not (isinstance(before, Mapping) and isinstance(after, Mapping)):
            return after
        return {
            **{key: None for key in before if key not in after},
            **{key: diff(before.get(key), value) for key, value in after.items() if before.get(key) != value},
        }

    written = new.model_dump(by_alias=True, exclude_none=True)
    return {key: diff(current.get(key), value) for key, value in written.items() if current.get(key) != value}


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool | None, reason: str, message: str) -> Condition:
    """A condition; an unknown `kind` fails validation."""
    status = {True: "True", False: "False", None: "Unknown"}[ok]
    return Condition.model_validate({"type": kind, "status": status, "reason": reason, "message": message})


def merge_conditions(previous: list[Condition], current: list[Condition]) -> list[Condition]:
    """Conditions in a fixed order; lastTransitionTime moves only when a condition's status changes."""
    before = {c.type: c for c in previous}
    merged = []
    for item in sorted(current, key=lambda c: CONDITION_TYPES.index(c.type)):
        old = before.get(item.type)
        since = old.last_transition_time if old is not None and old.status == item.status else None
        merged.append(item.model_copy(update={"last_transition_time": since or now()}))
    return merged


@dataclass(frozen=True)
class Prerequisite:
    """A condition Ready depends on, and what Ready says while it is False: `reason` (None: the condition's own)
    and `message`, where "{message}" stands for the condition's."""

    type: ConditionType
    reason: str | None
    message: str


# Ready, declared once (KServe's condition set): True only when none of these is False and the pods serve, False with
# the first of them that is. MemoryFit is Unknown when nothing bounds memory, which does not hold a service back.
READY_REQUIRES = (
    Prerequisite("Valid", None, "the spec is invalid; nothing was deployed for it"),
    Prerequisite("ThreadBudget", None, "spec refused, nothing deployed for it: {message}"),
    Prerequisite("MemoryFit", None, "spec refused, nothing deployed for it: {message}"),
    Prerequisite("ChildrenApplied", "ChildrenNotApplied", "not every child is applied: {message}"),
)


def ready_condition(found: Iterable[Condition], serving: Condition | None = None) -> Condition:
    """Ready from the prerequisites in `found` and, when they all hold, `serving`: whether the pods serve (the
    Deployment's replicas). A status with no failing prerequisite and nothing serving is a bug, not a state."""
    by_type = {c.type: c for c in found}
    for prerequisite in READY_REQUIRES:
        failed = by_type.get(prerequisite.type)
        if failed is not None and failed.status == "False":
            reason = prerequisite.reason or failed.reason
            return condition("Ready", False, reason, prerequisite.message.format(message=failed.message))
    if serving is None:
        raise ValueError("Ready needs the pods' state when every prerequisite holds")
    return serving


def with_ready(found: list[Condition], serving: Condition | None = None) -> list[Condition]:
    return [*found, ready_condition(found, serving)]


def invalid_status(message: str, generation: int | None, previous: Status) -> Status:
    return Status(
        phase="Failed",
        observed_generation=generation,
        conditions=merge_conditions(
            previous.conditions, with_ready([condition("Valid", False, "InvalidSpec", message)])
        ),
    )


def refused_status(condition_type: str, reason: str, message: str, generation: int | None, previous: Status) -> Status:
    checks = [
        condition("Valid", True, "SpecValid", "the spec is valid"),
        condition(condition_type, False, reason, message),
    ]
    if condition_type == "MemoryFit":  # memory is checked after the thread budget, which therefore passed
        checks.append(condition("ThreadBudget", True, "WithinBudget", "the thread budget fits"))
    # Nothing is created for a refused spec; what an earlier accepted spec deployed is left as it was. A refusal
    # outside the prerequisites (a rollout that needs a gateway) holds Ready back by itself.
    refused = condition("Ready", False, reason, f"spec refused, nothing deployed for it: {message}")
    return Status(
        phase="Failed",
        observed_generation=generation,
        conditions=merge_conditions(previous.conditions, with_ready(checks, refused)),
    )


def plan_figures(plan: Plan) -> Status:
    """The effective numbers a user needs to trust the deployment (threads, queue bound, memory estimate), and the
    plan's warnings: what the plan alone decides, which `inferop plan` shows without a cluster."""
    threads, memory = plan.threads, plan.memory
    return Status(
        threads=ThreadsStatus(
            cpus=threads.cpus,
            cpu_source=plan.cpu_source,
            instances=threads.instances,
            intra_op=threads.intra_op,
            inter_op=threads.inter_op,
            summary=f"{threads.instances}x({threads.intra_op}+{threads.inter_op})/{threads.cpu_slots}cpu"
            + (" in turns" if threads.take_turns else ""),
        ),
        queue=QueueStatus(
            max_queue_size=plan.queue.size,
            source=plan.queue.source,
            capacity_samples_per_second=round(plan.queue.capacity, 3) if plan.queue.capacity else None,
        ),
        memory=MemoryStatus(
            required_bytes=memory.required_bytes,
            available_bytes=int(memory.available_bytes) if memory.available_bytes is not None else None,
        ),
        warnings=list(plan.warnings),
    )


def plan_status(service: Service) -> Status:
    """The plan's figures and the pods' selector."""
    selector = ",".join(f"{k}={v}" for k, v in selector_labels(service).items())
    return plan_figures(service.plan).model_copy(update={"selector": selector})


def new_warnings(previous: Status, current: Status) -> list[str]:
    """The warnings `current` carries that the status written last did not: each is posted once, when it first
    holds, not again on every resync or operator restart."""
    return [warning for warning in current.warnings or [] if warning not in (previous.warnings or [])]


def deployed_status(
    service: Service,
    deployment: dict[str, Any] | None,
    generation: int | None,
    previous: Status,
    pods: Iterable[Mapping[str, Any]] = (),
    rollout: RolloutStatus | None = None,
) -> Status:
    """Status of a deployed service, from its plan, the Deployment's own status, its pods (`pod_facts` of each) and
    the rollout's state."""
    applied = ", ".join(f"{kind} {name}" for kind, name in children(service))
    planned = plan_status(service).model_copy(
        update={
            "url": service.url,
            "observed_generation": generation,
            "rollout": rollout,
            "conditions": [
                *plan_conditions(service.plan),
                condition("ChildrenApplied", True, "Applied", f"{applied} applied"),
                *rollout_conditions(rollout),
            ],
        }
    )
    return follow_pods(follow_deployment(planned, deployment, previous), pods, previous)


def rollout_conditions(state: RolloutStatus | None) -> list[Condition]:
    """Rollout (where the candidate stands), Agreement and Analysis (their numbers), for a service with a rollout."""
    if state is None or state.stable is None or (state.stable_spec is None and state.phase is None):
        return []  # no spec.rollout: a change serves at once, there is nothing to say
    if state.phase is None:
        found = [condition("Rollout", True, "Stable", f"revision {state.stable} serves")]
    else:
        outcome = {"Succeeded": True, "RollingBack": False, "RolledBack": False}.get(state.phase)
        found = [condition("Rollout", outcome, state.reason or state.phase, state.message or state.phase)]
    if state.agreement is not None:
        passed = state.agreement.passed
        found.append(condition("Agreement", passed, "Agrees" if passed else "Disagrees", state.agreement.message))
    if state.analysis is not None:
        outcome = {"Passed": True, "Failed": False}.get(state.analysis.verdict)
        found.append(condition("Analysis", outcome, state.analysis.verdict, state.analysis.message))
    return found


def follow_deployment(status: Status, deployment: dict[str, Any] | None, previous: Status) -> Status:
    """`status` with what the Deployment says: replicas, readyReplicas, the Available and Ready conditions and the
    phase they give; transition times are kept from `previous`. Nothing else is re-derived, so the Deployment
    watcher refreshes readiness without parsing or planning the spec again."""
    deployment_status = (deployment or {}).get("status") or {}
    desired = ((deployment or {}).get("spec") or {}).get("replicas", 0)
    ready = int(deployment_status.get("readyReplicas") or 0)
    current = int(deployment_status.get("replicas") or 0)
    caught_up = (deployment or {}).get("metadata", {}).get("generation") == deployment_status.get("observedGeneration")
    available = find_condition(deployment_status, "Available")
    progress = progress_condition(deployment)

    if deployment is None:
        serving = condition("Ready", False, "DeploymentMissing", "the Deployment does not exist yet")
    elif desired == 0:
        serving = condition("Ready", False, "ScaledToZero", "replicas is 0: nothing serves requests")
    elif ready >= desired and caught_up:
        serving = condition("Ready", True, "AllReplicasReady", f"{ready}/{desired} replicas ready")
    else:
        serving = condition("Ready", False, "ReplicasNotReady", f"{ready}/{desired} replicas ready")
    if available is None:
        available_condition = condition(
            "Available", None, "NoDeploymentStatus", "the Deployment has reported no status yet"
        )
    else:
        available_condition = condition(
            "Available",
            available.get("status") == "True",
            str(available.get("reason", "Unknown")),
            str(available.get("message", "")),
        )
    others = [c for c in status.conditions if c.type not in ("Progressing", "Available", "Ready")]
    conditions = with_ready([*others, progress, available_condition], serving)
    return status.model_copy(
        update={
            "phase": "Ready" if conditions[-1].status == "True" else "Progressing",
            "replicas": current,
            "ready_replicas": ready,
            "conditions": merge_conditions(previous.conditions, conditions),
        }
    )


def progress_condition(deployment: Mapping[str, Any] | None) -> Condition:
    """The rollout as the Deployment reports it (its Progressing condition); a stuck one, with what to check."""
    found = find_condition((deployment or {}).get("status"), "Progressing")
    if found is None:
        return condition("Progressing", None, "NoDeploymentStatus", "the Deployment has reported no rollout yet")
    reason, message = str(found.get("reason") or "Unknown"), str(found.get("message") or "")
    if reason != "ProgressDeadlineExceeded":
        return condition("Progressing", found.get("status") == "True", reason, message)
    deadline = ((deployment or {}).get("spec") or {}).get("progressDeadlineSeconds")
    return condition(
        "Progressing",
        False,
        reason,
        f"the rollout made no progress for {deadline}s (progressDeadlineSeconds, from timeouts.startupSeconds + "
        f"300): {message.rstrip('.')}. See condition PodsHealthy and `kubectl describe pods` for the pods: Pending "
        "pods mean no node has the requested CPU, memory or GPU free (lower resources or add nodes); pods that "
        "start but never become ready need a larger timeouts.startupSeconds if the model loads slowly",
    )


def pods_condition(pods: Iterable[Mapping[str, Any]], memory: MemoryStatus | None) -> Condition:
    """PodsHealthy from the pods' own reports (`pod_facts` of each): the first failure `diagnose` finds, with what to
    do about it, as KServe's FailureInfo."""
    found = diagnose(pods, memory.required_bytes if memory else None)
    if found is None:
        return condition("PodsHealthy", True, "NoFailures", "no pod reports a failed container")
    return condition("PodsHealthy", False, found.reason, found.message)


def follow_pods(status: Status, pods: Iterable[Mapping[str, Any]], previous: Status) -> Status:
    """`status` with PodsHealthy derived from the pods (`pod_facts` of each); transition times from `previous`."""
    others = [c for c in status.conditions if c.type != "PodsHealthy"]
    healthy = pods_condition(pods, status.memory)
    return status.model_copy(update={"conditions": merge_conditions(previous.conditions, [*others, healthy])})


# Conditions that explain failing pods; each is posted as a Warning event when it turns False or says a new thing.
ADVICE_CONDITIONS: tuple[ConditionType, ...] = ("Progressing", "PodsHealthy")


def new_advice(previous: Status, current: Status) -> list[Condition]:
    """The advice conditions of `current` that fail and say something the status written last did not."""
    found = [current.condition(kind) for kind in ADVICE_CONDITIONS]
    return [c for c in found if c is not None and c.status == "False" and not same_condition(c.type, previous, current)]


class AdviceLedger:
    """The advice conditions posted as Warnings, by service uid and condition type: (reason, message). Three handlers
    (the service's, the Deployment's and the pods') derive them, and two may see the same change before either's
    status write is back in what the other reads; this keeps their Warning to one. The written status does the same
    across restarts."""

    def __init__(self) -> None:
        self._said: dict[tuple[str, str], tuple[str, str]] = {}
        # The service's handler derives on a thread while the pods' and the Deployment's run on the event loop.
        self._lock = threading.Lock()

    def derive(self, uid: str, previous: Status, build: Callable[[], Status]) -> tuple[Status, list[Condition]]:
        """The status `build` makes from what the pods report now, and the advice to post (failing, new since
        `previous`, and not posted already) in one step: a status built from older reports cannot clear a failure
        after a newer one posted it (the next look would post it again)."""
        with self._lock:
            current = build()
            return current, self._to_post(uid, previous, current)

    def _to_post(self, uid: str, previous: Status, current: Status) -> list[Condition]:
        for kind in ADVICE_CONDITIONS:
            found = current.condition(kind)
            if found is not None and found.status != "False":
                self._said.pop((uid, kind), None)
        fresh = []
        for advice in new_advice(previous, current):
            said = (advice.reason, advice.message)
            if self._said.get((uid, advice.type)) != said:
                self._said[(uid, advice.type)] = said
                fresh.append(advice)
        return fresh

    def forget(self, uid: str) -> None:
        """A deleted service's entries: a long-running operator does not keep every uid it saw."""
        with self._lock:
            for key in [key for key in self._said if key[0] == uid]:
                del self._said[key]

    def uids(self) -> set[str]:
        with self._lock:
            return {uid for uid, _ in self._said}


def children(service: Service) -> list[tuple[str, str]]:
    """(kind, name) of every child the spec asks for, in the order they are applied."""
    return [(child.kind, child.name(service)) for child in CHILDREN if child.wanted(service)]


def plan_conditions(plan: Plan) -> list[Condition]:
    """The checks a planned spec passed: valid, within its thread budget, and its memory fit (or unchecked)."""
    memory = plan.memory
    return [
        condition("Valid", True, "SpecValid", "the spec is valid"),
        condition("ThreadBudget", True, "WithinBudget", plan.threads.explain()),
        condition("MemoryFit", True, "Fits", memory.explain())
        if memory.available_bytes is not None
        else condition("MemoryFit", None, "NotChecked", memory.explain()),
    ]


def children_failed_status(service: Service, failure: ApiFailure, generation: int | None, previous: Status) -> Status:
    """Status of a planned service whose child the API server refused (`failure`).

    A refusal that asking again cannot help (422 invalid...) is Failed, like an invalid spec, until the spec
    changes; any other (500, 403 forbidden by a quota...) is Pending: it is retried with a backoff.
    """
    message = failure_message(failure)
    # What the Deployment and the pods reported last still holds: the failure says nothing about them.
    observed = [c for kind in ("Progressing", "PodsHealthy", "Available") if (c := previous.condition(kind))]
    return plan_status(service).model_copy(
        update={
            "phase": "Failed" if failure.permanent else "Pending",
            "observed_generation": generation,
            "conditions": merge_conditions(
                previous.conditions,
                with_ready(
                    [
                        *plan_conditions(service.plan),
                        condition("ChildrenApplied", False, failure.reason, message),
                        *observed,
                    ]
                ),
            ),
        }
    )


def failure_message(failure: ApiFailure) -> str:
    outlook = "not retried until the spec changes" if failure.permanent else "retried with a backoff"
    return f"{failure.explain()} ({outlook})"


def find_condition(status: Any, kind: str) -> dict[str, Any] | None:
    """A condition of a Kubernetes object's status as the API server returns it (the Deployment's)."""
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == kind), None)


def same_condition(kind: str, before: Status, after: Status) -> bool:
    """Condition `kind` says the same (status, reason, message) in both statuses; its time may differ."""

    def said(status: Status) -> tuple[str, str, str] | None:
        found = status.condition(kind)
        return (found.status, found.reason, found.message) if found else None

    return said(before) == said(after)

"""Status that tells the truth: phase, conditions, replicas and URL, derived from facts, never assumed.

Pure functions: the handlers pass in what they know (the plan or the refusal, the Deployment's status)
and patch what these return.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from inferop_operator.builders import CHILDREN, Service, selector_labels

if TYPE_CHECKING:  # the status stays free of the Kubernetes client; it only reads a failure's fields
    from inferop_operator.kubeapi import ApiFailure

CONDITION_TYPES = ("Valid", "ThreadBudget", "MemoryFit", "ChildrenApplied", "Available", "Ready")


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def condition(kind: str, ok: bool | None, reason: str, message: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": {True: "True", False: "False", None: "Unknown"}[ok],
        "reason": reason,
        "message": message,
    }


def merge_conditions(previous: list[dict[str, Any]] | None, current: list[dict[str, str]]) -> list[dict[str, Any]]:
    """Conditions in a fixed order; lastTransitionTime moves only when a condition's status changes."""
    before = {c.get("type"): c for c in previous or []}
    merged = []
    for item in sorted(current, key=lambda c: CONDITION_TYPES.index(c["type"])):
        old = before.get(item["type"])
        changed = old is None or old.get("status") != item["status"]
        since = now() if old is None or changed else old.get("lastTransitionTime", now())
        merged.append({**item, "lastTransitionTime": since})
    return merged


def invalid_status(message: str, generation: int | None, previous: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": merge_conditions(
            previous,
            [
                condition("Valid", False, "InvalidSpec", message),
                condition("Ready", False, "InvalidSpec", "the spec is invalid; nothing was deployed for it"),
            ],
        ),
    }


def refused_status(
    condition_type: str, reason: str, message: str, generation: int | None, previous: list[dict[str, Any]] | None
) -> dict[str, Any]:
    checks = [
        condition("Valid", True, "SpecValid", "the spec is valid"),
        condition(condition_type, False, reason, message),
    ]
    if condition_type == "MemoryFit":  # memory is checked after the thread budget, which therefore passed
        checks.append(condition("ThreadBudget", True, "WithinBudget", "the thread budget fits"))
    # Nothing is created for a refused spec; what an earlier accepted spec deployed is left as it was.
    checks.append(condition("Ready", False, reason, f"spec refused, nothing deployed for it: {message}"))
    return {
        "phase": "Failed",
        "observedGeneration": generation,
        "conditions": merge_conditions(previous, checks),
    }


def plan_status(service: Service) -> dict[str, Any]:
    """The effective numbers a user needs to trust the deployment: threads and the memory estimate."""
    plan = service.plan
    threads, memory = plan.threads, plan.memory
    return {
        "threads": {
            "cpus": threads.cpus,
            "cpuSource": plan.cpu_source,
            "instances": threads.instances,
            "intraOp": threads.intra_op,
            "interOp": threads.inter_op,
            "summary": f"{threads.instances}x({threads.intra_op}+{threads.inter_op})/{threads.cpu_slots}cpu",
        },
        "queue": {
            "maxQueueSize": plan.queue.size,
            "source": plan.queue.source,
            **({"capacitySamplesPerSecond": round(plan.queue.capacity, 3)} if plan.queue.capacity else {}),
        },
        "memory": {
            "requiredBytes": memory.required_bytes,
            **({"availableBytes": int(memory.available_bytes)} if memory.available_bytes is not None else {}),
        },
        "selector": ",".join(f"{k}={v}" for k, v in selector_labels(service).items()),
    }


def deployed_status(
    service: Service, deployment: dict[str, Any] | None, generation: int | None, previous: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """Status of a deployed service, from its plan and the Deployment's own status."""
    deployment_status = (deployment or {}).get("status") or {}
    desired = ((deployment or {}).get("spec") or {}).get("replicas", 0)
    ready = int(deployment_status.get("readyReplicas") or 0)
    current = int(deployment_status.get("replicas") or 0)
    caught_up = (deployment or {}).get("metadata", {}).get("generation") == deployment_status.get("observedGeneration")
    available = find_condition(deployment_status, "Available")

    if deployment is None:
        ready_condition = condition("Ready", False, "DeploymentMissing", "the Deployment does not exist yet")
    elif desired == 0:
        ready_condition = condition("Ready", False, "ScaledToZero", "replicas is 0: nothing serves requests")
    elif ready >= desired and caught_up:
        ready_condition = condition("Ready", True, "AllReplicasReady", f"{ready}/{desired} replicas ready")
    else:
        ready_condition = condition("Ready", False, "ReplicasNotReady", f"{ready}/{desired} replicas ready")
    if available is None:
        available_condition = condition(
            "Available", None, "NoDeploymentStatus", "the Deployment has reported no status yet"
        )
    else:
        available_condition = condition(
            "Available",
            available.get("status") == "True",
            available.get("reason", "Unknown"),
            available.get("message", ""),
        )
    applied = ", ".join(f"{kind} {name}" for kind, name in children(service))
    return {
        "phase": "Ready" if ready_condition["status"] == "True" else "Progressing",
        "url": service.url,
        "replicas": current,
        "readyReplicas": ready,
        "observedGeneration": generation,
        **plan_status(service),
        "conditions": merge_conditions(
            previous,
            [
                *plan_conditions(service),
                condition("ChildrenApplied", True, "Applied", f"{applied} applied"),
                available_condition,
                ready_condition,
            ],
        ),
    }


def children(service: Service) -> list[tuple[str, str]]:
    """(kind, name) of every child the spec asks for, in the order they are applied."""
    return [(child.kind, child.name(service)) for child in CHILDREN if child.wanted(service)]


def plan_conditions(service: Service) -> list[dict[str, str]]:
    """The checks a planned spec passed: valid, within its thread budget, and its memory fit (or unchecked)."""
    memory = service.plan.memory
    return [
        condition("Valid", True, "SpecValid", "the spec is valid"),
        condition("ThreadBudget", True, "WithinBudget", service.plan.threads.explain()),
        condition("MemoryFit", True, "Fits", memory.explain())
        if memory.available_bytes is not None
        else condition("MemoryFit", None, "NotChecked", memory.explain()),
    ]


def children_failed_status(
    service: Service, failure: ApiFailure, generation: int | None, previous: list[dict[str, Any]] | None
) -> dict[str, Any]:
    """Status of a planned service whose child the API server refused (`failure`).

    A refusal that asking again cannot help (422 invalid...) is Failed, like an invalid spec, until the spec
    changes; any other (500, 403 forbidden by a quota...) is Pending: it is retried with a backoff.
    """
    phase = "Failed" if failure.permanent else "Pending"
    message = failure_message(failure)
    # What the Deployment reported last still holds: the failure says nothing about its pods.
    last = find_condition({"conditions": previous}, "Available")
    available = [{key: str(last.get(key, "")) for key in ("type", "status", "reason", "message")}] if last else []
    return {
        "phase": phase,
        "observedGeneration": generation,
        **plan_status(service),
        "conditions": merge_conditions(
            previous,
            [
                *plan_conditions(service),
                condition("ChildrenApplied", False, failure.reason, message),
                *available,
                condition("Ready", False, "ChildrenNotApplied", f"not every child is applied: {message}"),
            ],
        ),
    }


def failure_message(failure: ApiFailure) -> str:
    outlook = "not retried until the spec changes" if failure.permanent else "retried with a backoff"
    return f"{failure.explain()} ({outlook})"


def find_condition(status: Any, kind: str) -> dict[str, Any] | None:
    return next((c for c in (status or {}).get("conditions") or [] if c.get("type") == kind), None)


def same_condition(kind: str, before: Any, after: Any) -> bool:
    """Condition `kind` says the same (status, reason, message) in both statuses; its time may differ."""

    def said(status: Any) -> tuple[Any, ...] | None:
        found = find_condition(status, kind)
        return (found.get("status"), found.get("reason"), found.get("message")) if found else None

    return said(before) == said(after)


def children_failed(status: Any) -> bool:
    """True while the last reconcile left a child unapplied (ChildrenApplied is False)."""
    return (find_condition(status, "ChildrenApplied") or {}).get("status") == "False"

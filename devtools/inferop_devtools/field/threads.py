"""Drill a, field report 000: copies of a model each spinning its own thread pool in a 1-CPU pod.

The naive deployment (4 copies with ONNX Runtime's default threads) and the operator's plan (what it renders for
the same model and limits) differ in their threads; inferop's pods also run Triton under SCHED_BATCH. To credit
each, both deployments run under both policies: the threads' share is the plan against the naive copies under the
same policy, SCHED_BATCH's share is one deployment under SCHED_BATCH against itself under SCHED_OTHER.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from inferop_core.memory import LOCAL_RUNTIME
from inferop_core.scheduling import CpuScheduling
from inferop_devtools.field.pods import Machine, closed_loop, describe, naive, planned, pod, pod_spec
from inferop_operator.plan import Refusal, plan_service
from inferop_operator.spec import parse_spec

POLICIES: tuple[CpuScheduling, ...] = ("normal", "batch")
# (network, closed-loop callers, seconds): enough callers that the batcher forms full batches.
LOADS = (("conv_net", 16, 15.0), ("inception_v3", 8, 25.0))
COPIES = 4
GOAL_RATIO = 1.3


def ratio(rows: dict[str, dict[str, Any]], a: str, b: str) -> float:
    """Throughput of row `a` against row `b`."""
    return round(rows[a]["throughput"] / rows[b]["throughput"], 3) if rows[b]["throughput"] else 0.0


def drill_threads(machine: Machine) -> dict[str, Any]:
    """Field report 000: copies of a model, each with the backend's default thread pool, in a 1-CPU pod."""
    results: dict[str, Any] = {}
    goals = []
    for network, concurrency, seconds in LOADS:
        user_spec = pod_spec(network, cpus=1, changes={"instances": COPIES})
        try:
            plan_service(parse_spec(user_spec), LOCAL_RUNTIME)
            refusal = "accepted (unexpected)"
        except Refusal as refused:
            refusal = refused.message
        fixed = planned(pod_spec(network, cpus=1, changes={"instances": 1}))
        rows: dict[str, dict[str, Any]] = {}
        for label, serving in (("naive", naive(fixed, instances=COPIES)), ("inferop", fixed)):
            for policy in POLICIES:
                with pod(serving, machine.limits(cpus=1), cpu_scheduling=policy) as server:
                    level = closed_loop(server, network, concurrency, seconds, machine)
                    assert server.cgroup is not None
                    usage = dict(server.cgroup.usage())
                rows[f"{label}/{policy}"] = {**asdict(level), "usage": usage, "config": describe(serving, policy)}
                print(
                    f"  threads/{network}/{label}/{policy}: {level.throughput:.1f} samples/s, p99 {level.p99_ms:.0f} "
                    f"ms, errors {level.errors}"
                )

        threads_share = {policy: ratio(rows, f"inferop/{policy}", f"naive/{policy}") for policy in POLICIES}
        batch_share = {label: ratio(rows, f"{label}/batch", f"{label}/normal") for label in ("naive", "inferop")}
        p99_lower = {
            policy: rows[f"inferop/{policy}"]["p99_ms"] < rows[f"naive/{policy}"]["p99_ms"] for policy in POLICIES
        }
        errors = sum(row["errors"] for row in rows.values())
        results[network] = {
            "refusal": refusal,
            "concurrency": concurrency,
            "seconds": seconds,
            "rows": rows,
            "threads_ratio": threads_share,  # the plan against the naive copies, same policy
            "sched_batch_ratio": batch_share,  # SCHED_BATCH against SCHED_OTHER, same deployment
            "overall_ratio": ratio(rows, "inferop/batch", "naive/normal"),  # what the old drill credited to threads
            "p99_lower": p99_lower,
        }
        for policy in POLICIES:
            goals.append(
                (
                    f"{network}, both under SCHED_{'BATCH' if policy == 'batch' else 'OTHER'}: the plan >= "
                    f"{GOAL_RATIO}x the naive copies' throughput at a lower p99",
                    threads_share[policy] >= GOAL_RATIO and p99_lower[policy],
                )
            )
        goals.append((f"{network}: no request failed", errors == 0))
    results["goals"] = [{"text": text, "met": met} for text, met in goals]
    results["goal"] = {
        "text": f"for every network, under either policy, planned >= {GOAL_RATIO}x naive throughput at a lower p99",
        "met": all(met for _, met in goals),
    }
    return results

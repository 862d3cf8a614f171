"""Drill a, field report 000: copies of a model each spinning its own thread pool in a 1-CPU pod."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from inferop.memory import LOCAL_RUNTIME
from inferop.scheduling import DEFAULT_CPU_SCHEDULING
from inferop_devtools.field.pods import NAIVE_SCHEDULING, Machine, closed_loop, describe, naive, planned, pod, pod_spec
from inferop_operator.plan import Refusal, plan_service
from inferop_operator.spec import parse_spec


def drill_threads(machine: Machine) -> dict[str, Any]:
    """Field report 000: copies of a model, each with the backend's default thread pool, in a 1-CPU pod."""
    results: dict[str, Any] = {}
    for network, concurrency, seconds in (("conv_net", 16, 15.0), ("inception_v3", 8, 25.0)):
        copies = 4
        user_spec = pod_spec(network, cpus=1, changes={"instances": copies})
        try:
            plan_service(parse_spec(user_spec), LOCAL_RUNTIME)
            refusal = "accepted (unexpected)"
        except Refusal as refused:
            refusal = refused.message
        fixed = planned(pod_spec(network, cpus=1, changes={"instances": 1}))
        rows = {}
        for label, serving, policy in (
            ("naive", naive(fixed, instances=copies), NAIVE_SCHEDULING),
            ("inferop", fixed, DEFAULT_CPU_SCHEDULING),
        ):
            with pod(serving, machine.limits(cpus=1), cpu_scheduling=policy) as server:
                level = closed_loop(server, network, concurrency, seconds, machine)
                assert server.cgroup is not None
                usage = dict(server.cgroup.usage())
                rows[label] = {**asdict(level), "usage": usage, "config": describe(serving, policy)}
            print(f"  threads/{network}/{label}: {level.throughput:.1f} samples/s, p99 {level.p99_ms:.0f} ms")
        ratio = rows["inferop"]["throughput"] / rows["naive"]["throughput"]
        results[network] = {
            "refusal": refusal,
            "concurrency": concurrency,
            "seconds": seconds,
            "naive": rows["naive"],
            "inferop": rows["inferop"],
            "throughput_ratio": round(ratio, 3),
            "p99_lower": rows["inferop"]["p99_ms"] < rows["naive"]["p99_ms"],
        }
    conv = results["conv_net"]
    results["goal"] = {
        "text": "planned >= 1.3x naive throughput at a lower p99 (conv net)",
        "met": conv["throughput_ratio"] >= 1.3 and conv["p99_lower"],
    }
    return results

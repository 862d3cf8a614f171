"""Drill a, field report 000: copies of a model each spinning its own thread pool in a 1-CPU pod, on the local
cluster's real node.

The naive deployment (4 copies with ONNX Runtime's default threads, as a Deployment of Triton written by hand) and
the operator's plan for the same model and limits differ in their threads; the operator's pods also run Triton under
SCHED_BATCH. To credit each, both run under both policies: the threads' share is the plan against the naive copies
under the same policy, SCHED_BATCH's share is one deployment under SCHED_BATCH against itself under SCHED_OTHER.
inferop under SCHED_BATCH is the operator's own pod for the InferenceService; the other three are Deployments of the
same image by hand (inferop under SCHED_OTHER with the operator's config and environment, without its chrt). Each
pod is held to the server's CPU with a CPU limit of 1, which the kubelet writes into its cgroup; the callers run on
the other CPU, in the node's network.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from inferop import bench
from inferop.openloop import generator_process
from inferop_core.memory import LOCAL_RUNTIME
from inferop_core.scheduling import CpuScheduling
from inferop_devtools.field.node import FieldNode, inference_service, triton_deployment
from inferop_devtools.field.pods import Machine, describe, naive, pod_spec, rendered
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
    results: dict[str, Any] = {"where": "the local cluster's node: containerd, runc and the kubelet"}
    goals = []
    with FieldNode.up(machine, "threads") as node:
        for network, concurrency, seconds in LOADS:
            user_spec = pod_spec(network, cpus=1, changes={"instances": COPIES})
            try:
                plan_service(parse_spec(user_spec), LOCAL_RUNTIME)
                refusal = "accepted (unexpected)"
            except Refusal as refused:
                refusal = refused.message
            raw = pod_spec(network, cpus=1, changes={"instances": 1})
            fixed = plan_service(parse_spec(raw)).serving  # as the operator plans it
            copies = naive(fixed, instances=COPIES)
            limits = {"cpu": "1"}
            name = network.replace("_", "-")
            by_hand = node.repo(f"{network}-naive", copies)
            deployments = {
                f"naive/{policy}": triton_deployment(
                    f"{name}-naive-{policy}", node.triton_image, by_hand, limits, policy
                )
                for policy in POLICIES
            }
            deployments["inferop/normal"] = triton_deployment(
                f"{name}-inferop-normal", node.triton_image, node.repo(f"{network}-inferop", fixed), limits,
                "normal", rendered(raw).env,
            )  # fmt: skip
            deployments["inferop/batch"] = inference_service(f"{name}-inferop", raw)
            rows: dict[str, dict[str, Any]] = {}
            for label, policy in ((label, policy) for label in ("naive", "inferop") for policy in POLICIES):
                key = f"{label}/{policy}"
                serving = copies if label == "naive" else fixed
                with node.serving(deployments[key]) as watch, generator_process(machine.client_cpus):
                    level = bench.sweep(watch.url, network, [concurrency], seconds, batch=1,
                                        timeout=120)[0]  # fmt: skip
                    usage = watch.usage()
                rows[key] = {**asdict(level), "usage": usage, "config": describe(serving, policy)}
                print(
                    f"  threads/{network}/{key}: {level.throughput:.1f} samples/s, p99 {level.p99_ms:.0f} ms, errors "
                    f"{level.errors}"
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
                "overall_ratio": ratio(rows, "inferop/batch", "naive/normal"),  # what the old drill credited
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

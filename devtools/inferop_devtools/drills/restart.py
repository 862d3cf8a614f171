"""Drill: the control plane (etcd, kube-apiserver, kube-controller-manager) stopped and started again while the
operator reconciles.

The operator must never exit, its watches must resume on their own, and everything (services created just
before the outage and edits made just after it) must converge within 30 s of the apiserver's return.
"""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

from inferop_devtools.drills.harness import (
    DrillCluster,
    converged,
    operator_running,
    service,
    wait_until,
    watch_until,
)
from inferop_operator.identity import GROUP, PLURAL, VERSION

NAMESPACE = "restart"
GOAL_SECONDS = 30.0


def run_apiserver_restart(root: Path, rounds: int = 3, services: int = 20, pause: float = 3.0) -> dict[str, Any]:
    """Each round: create `services` services, restart the apiserver and etcd at once (mid-reconcile), then edit
    every service created so far; time from the apiserver's return until all of it has converged."""
    results = []
    with DrillCluster(root) as cluster, operator_running(cluster, root / "operator.log", resync_seconds=60) as operator:
        cluster.create_namespaces([NAMESPACE])
        created: list[str] = []
        for round_index in range(rounds):
            for index in range(services):
                name = f"r{round_index}-{index:02d}"
                cluster.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, service(name))
                created.append(name)
            away = cluster.plane.restart(pause=pause)
            back = time.perf_counter()
            edit = {"spec": {"batching": {"maxQueueDelayMicroseconds": 1001 + round_index}}}
            for name in created:  # edits the operator can only see through a watch that resumed
                patch = partial(cluster.custom.patch_namespaced_custom_object, GROUP, VERSION, NAMESPACE, PLURAL)
                wait_until(partial(patch, name, edit), 30, f"the edit of {name}")
            watch_until(
                f"{len(created)} services to converge after the restart",
                120,
                len(created),
                converged,
                cluster.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                NAMESPACE,
                PLURAL,
            )
            results.append(
                {
                    "round": round_index,
                    "services": len(created),
                    "apiserver_away_s": round(away, 2),
                    "converged_after_back_s": round(time.perf_counter() - back, 2),
                    "operator_running": operator.running(),
                }
            )
        deployments = {d.metadata.name for d in cluster.apps.list_namespaced_deployment(NAMESPACE).items}
        tracebacks = operator.tracebacks()
        alive = operator.running()
    return {
        "rounds": results,
        "max_converged_after_back_s": max(r["converged_after_back_s"] for r in results),
        "goal_s": GOAL_SECONDS,
        "deployments_missing": sorted(set(created) - deployments),
        "operator_alive": alive and all(r["operator_running"] for r in results),
        "operator_starts": operator.starts,
        "operator_exits": operator.unexpected_exits,
        "tracebacks": tracebacks,
    }


def format_apiserver_restart(result: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "yes" if ok else "no"

    worst = result["max_converged_after_back_s"]
    lines = [
        "### 3. Control plane restarted",
        "",
        "kube-apiserver and etcd stopped and started again right after new services were created; then every "
        "service was edited (only a resumed watch can see the edits).",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
        f"| the operator never exits | {'running' if result['operator_alive'] else 'exited'}, started "
        f"{result['operator_starts']} time(s), exits {result['operator_exits'] or 'none'} | "
        f"{met(result['operator_alive'] and result['operator_starts'] == 1)} |",
        f"| everything converges within {result['goal_s']:.0f} s of the apiserver's return | worst {worst} s "
        f"(ratio {worst / result['goal_s']:.2f}); Deployments missing: {len(result['deployments_missing'])} | "
        f"{met(worst <= result['goal_s'] and not result['deployments_missing'])} |",
        f"| no traceback | {len(result['tracebacks'])} | {met(not result['tracebacks'])} |",
        "",
        "| round | services | apiserver away | converged after its return |",
        "|---|---|---|---|",
    ]
    for row in result["rounds"]:
        lines.append(
            f"| {row['round']} | {row['services']} | {row['apiserver_away_s']} s | {row['converged_after_back_s']} s |"
        )
    return "\n".join(lines)

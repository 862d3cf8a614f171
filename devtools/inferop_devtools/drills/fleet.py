"""Drill: a fleet of InferenceServices across namespaces, created one after the other as fast as the API takes.

Goals: all converge in under 120 s with the operator's resident memory under 300 MB; a steady-state resync
changes no object and costs a bounded number of apiserver requests per service (counted from the apiserver's
own `apiserver_request_total`); the time from each create to its Deployment, p50 and p99.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from inferop_devtools.drills.harness import (
    DrillCluster,
    converged,
    example_spec,
    operator_running,
    percentile,
    service,
    watch_until,
)
from inferop_operator.identity import GROUP, MANAGED, PLURAL, VERSION, label_selector

CONVERGE_GOAL_S = 120.0
CREATORS = 8
SETTLE_CHECKS = 30  # of 10 s each
RSS_GOAL_MB = 300.0


def resource_versions(cluster: DrillCluster) -> dict[str, str]:
    """Every object the operator writes, by kind/namespace/name: equal snapshots mean nothing was written."""
    selector = label_selector(MANAGED)
    versions: dict[str, str] = {}
    for item in cluster.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]:
        meta = item["metadata"]
        versions[f"InferenceService/{meta['namespace']}/{meta['name']}"] = meta["resourceVersion"]
    for kind, items in (
        ("Deployment", cluster.apps.list_deployment_for_all_namespaces(label_selector=selector).items),
        ("ConfigMap", cluster.core.list_config_map_for_all_namespaces(label_selector=selector).items),
        ("Service", cluster.core.list_service_for_all_namespaces(label_selector=selector).items),
    ):
        for obj in items:
            versions[f"{kind}/{obj.metadata.namespace}/{obj.metadata.name}"] = obj.metadata.resource_version
    return versions


def run_fleet(root: Path, services: int = 1000, namespaces: int = 10, resync: float = 30) -> dict[str, Any]:
    names = [(f"fleet-{index % namespaces}", f"svc-{index:04d}") for index in range(services)]
    created_at: dict[str, float] = {}
    deployed_at: dict[str, float] = {}
    with DrillCluster(root) as cluster, operator_running(cluster, root / "operator.log", resync) as operator:
        cluster.create_namespaces(sorted({namespace for namespace, _ in names}))

        def seen(item: dict[str, Any]) -> None:
            deployed_at.setdefault(f"{item['metadata']['namespace']}/{item['metadata']['name']}", time.perf_counter())

        def follow_deployments() -> None:
            watch_until(
                f"{services} Deployments",
                CONVERGE_GOAL_S * 3,
                services,
                lambda item: True,
                cluster.apps.list_deployment_for_all_namespaces,
                on_ready=seen,
            )

        follower = threading.Thread(target=follow_deployments, daemon=True)
        follower.start()
        # A start-up budget far beyond the drill, so no rollout deadline passes (and changes a status) in it.
        spec = example_spec()
        spec["timeouts"]["startupSeconds"] = 3600

        def create(target: tuple[str, str]) -> None:
            namespace, name = target
            created_at[f"{namespace}/{name}"] = time.perf_counter()
            cluster.custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, service(name, spec))

        start = time.perf_counter()
        with ThreadPoolExecutor(CREATORS) as creators:  # as `kubectl apply` of many files, or a GitOps sync, sends them
            list(creators.map(create, names))
        created_s = time.perf_counter() - start

        watch_until(
            f"{services} services to converge",
            CONVERGE_GOAL_S * 3,
            services,
            converged,
            cluster.custom.list_cluster_custom_object,
            GROUP,
            VERSION,
            PLURAL,
        )
        converge_s = time.perf_counter() - start
        follower.join(60)

        # Steady state: once nothing changes any more (the last Deployments' own status settles a little after
        # convergence), one and a half resync intervals, so every service's timer fires at least once.
        # kube-controller-manager works through 1,000 Deployments long after the operator has converged.
        settled = resource_versions(cluster)
        for _ in range(SETTLE_CHECKS):
            time.sleep(10)
            now = resource_versions(cluster)
            if now == settled:
                break
            settled = now
        window = resync * 1.5
        before_versions, before_requests = resource_versions(cluster), cluster.request_counts()
        time.sleep(window)
        after_versions, after_requests = resource_versions(cluster), cluster.request_counts()
        rss_after = operator.rss_bytes()
        # The kernel's high-water mark covers the whole run, the create burst included: no sampling can miss it.
        peak_rss = operator.peak_rss_bytes()
        tracebacks = operator.tracebacks()
        alive = operator.running()

    changed = sorted(key for key, version in after_versions.items() if before_versions.get(key) != version)
    verbs = set(before_requests) | set(after_requests)
    requests = {verb: after_requests.get(verb, 0) - before_requests.get(verb, 0) for verb in verbs}
    requests = {verb: round(count) for verb, count in requests.items() if count}
    resyncs = services * window / resync
    latencies = [deployed_at[key] - created_at[key] for key in created_at if key in deployed_at]
    return {
        "services": services,
        "namespaces": namespaces,
        "create_all_s": round(created_s, 2),
        "converge_s": round(converge_s, 2),
        "operator_peak_rss_mb": round(peak_rss / 2**20, 1),
        "operator_steady_rss_mb": round(rss_after / 2**20, 1),
        "apply_to_deployment_p50_s": round(percentile(latencies, 0.5), 3),
        "apply_to_deployment_p99_s": round(percentile(latencies, 0.99), 3),
        "deployments_seen": len(latencies),
        "steady_window_s": window,
        "resync_seconds": resync,
        "steady_objects": len(after_versions),
        "steady_objects_changed": changed[:20],
        "steady_changed_count": len(changed),
        "steady_requests_by_verb": requests,
        "steady_requests_per_service_resync": round(sum(requests.values()) / resyncs, 2),
        "operator_alive": alive,
        "tracebacks": tracebacks,
    }


def format_fleet(result: dict[str, Any]) -> str:
    def met(ok: bool) -> str:
        return "yes" if ok else "no"

    return "\n".join(
        [
            "### 7. Fleet scale",
            "",
            f"{result['services']} InferenceServices across {result['namespaces']} namespaces, created one after the "
            f"other ({result['create_all_s']} s to create them all), the operator as its own process.",
            "",
            "| goal | measured | met |",
            "|---|---|---|",
            f"| all converge in < {CONVERGE_GOAL_S:.0f} s | {result['converge_s']} s (ratio "
            f"{result['converge_s'] / CONVERGE_GOAL_S:.2f}) | {met(result['converge_s'] < CONVERGE_GOAL_S)} |",
            f"| operator RSS < {RSS_GOAL_MB:.0f} MB | peak {result['operator_peak_rss_mb']} MB (the kernel's VmHWM "
            f"over the whole run; ratio {result['operator_peak_rss_mb'] / RSS_GOAL_MB:.2f}), steady "
            f"{result.get('operator_steady_rss_mb', '?')} MB | "
            f"{met(result['operator_peak_rss_mb'] < RSS_GOAL_MB)} |",
            f"| a steady-state resync changes no object | {result['steady_changed_count']} of "
            f"{result['steady_objects']} objects changed in {result['steady_window_s']:.0f} s "
            f"(resync every {result['resync_seconds']:.0f} s) | {met(result['steady_changed_count'] == 0)} |",
            f"| bounded apiserver requests per service and resync | {result['steady_requests_per_service_resync']} "
            f"({result['steady_requests_by_verb']}) | reported |",
            f"| create → Deployment | p50 {result['apply_to_deployment_p50_s']} s, p99 "
            f"{result['apply_to_deployment_p99_s']} s over {result['deployments_seen']} | reported |",
            f"| no traceback | {len(result['tracebacks'])} | {met(not result['tracebacks'])} |",
        ]
    )

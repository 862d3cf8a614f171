"""The operator against a fresh local control plane, as its own process: time from `kubectl apply` to the
Deployment, convergence of many services applied at once, and the operator's memory."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferop_devtools.bench.targets import Target
from inferop_devtools.drills.harness import EXAMPLE, DrillCluster, operator_running, watch_until
from inferop_operator.identity import GROUP, PLURAL, VERSION

APPLY_SECONDS = 1.0  # kubectl apply -> the Deployment exists, p50, at most
CONVERGE_SECONDS = 30.0  # every service applied at once has its Deployment and reports its spec, at most
RSS_MB = 150.0  # the operator's peak resident memory, at most


def operator_bench(services: int, samples: int) -> dict[str, Any]:
    example = EXAMPLE.read_text()
    with tempfile.TemporaryDirectory(prefix="inferop-bench-operator-") as state, DrillCluster(Path(state)) as cluster:
        cluster.create_namespaces(["latency", "fleet"])
        with operator_running(cluster, Path(state) / "operator.log") as operator:
            latencies = []
            for index in range(samples):
                name = f"latency-{index}"
                start = time.perf_counter()
                cluster.kubectl(
                    "apply", "-n", "latency", "-f", "-", stdin=example.replace("name: conv-net", f"name: {name}")
                )
                watch_until(
                    f"Deployment {name}",
                    30,
                    1,
                    lambda deployment: True,
                    cluster.apps.list_namespaced_deployment,
                    "latency",
                    field_selector=f"metadata.name={name}",
                )
                latencies.append(time.perf_counter() - start)

            many = "\n---\n".join(example.replace("name: conv-net", f"name: fleet-{i}") for i in range(services))
            start = time.perf_counter()
            cluster.kubectl("apply", "-n", "fleet", "-f", "-", stdin=many)
            deadline = time.monotonic() + 300

            def observed(service: dict[str, Any]) -> bool:
                status = service.get("status") or {}
                return bool(status.get("observedGeneration") == service["metadata"]["generation"])

            # Converged: every Deployment exists and every service has reported on its spec; one condition after
            # the other, so the time taken is that of the later.
            watch_until(
                f"{services} Deployments",
                deadline - time.monotonic(),
                services,
                lambda deployment: True,
                cluster.apps.list_namespaced_deployment,
                "fleet",
            )
            watch_until(
                f"{services} services to report status.observedGeneration",
                deadline - time.monotonic(),
                services,
                observed,
                cluster.custom.list_namespaced_custom_object,
                GROUP,
                VERSION,
                "fleet",
                PLURAL,
            )
            converge_seconds = time.perf_counter() - start
            peak = operator.peak_rss_bytes()
    return {
        "apply_to_deployment_p50_s": round(statistics.median(latencies), 3),
        "apply_to_deployment_max_s": round(max(latencies), 3),
        "samples": samples,
        "services": services,
        "converge_s": round(converge_seconds, 2),
        "operator_peak_rss_mb": round(peak / 2**20, 1),
    }


def operator_targets(figures: dict[str, Any]) -> list[Target]:
    return [
        Target("kubectl apply -> Deployment, p50 (s)", figures["apply_to_deployment_p50_s"], APPLY_SECONDS, False),
        Target(f"{figures['services']} services converged (s)", figures["converge_s"], CONVERGE_SECONDS, False),
        Target("operator peak resident memory (MiB)", figures["operator_peak_rss_mb"], RSS_MB, False),
    ]

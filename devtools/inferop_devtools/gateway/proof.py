"""Proof that a real Gateway API implementation routes real requests here: Envoy Gateway programs a real Envoy from
an HTTPRoute with weights 80/20, a header match and a 50% RequestMirror, and the requests are counted where they
landed; then the weights change and the time until Envoy applies them is measured.

    sudo .venv/bin/python -m inferop_devtools.gateway.proof [--requests 400] [--workdir DIR]

Needs root (namespaces), scripts/kube-current.sh, scripts/kube-addons.sh and scripts/gateway.sh built. Everything
runs in a network namespace of its own (the control plane, kwok, Envoy Gateway, Envoy, the backends and the
load), which disappears with the processes at the end. Results go to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import logging
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from inferop_devtools.cluster.addons import Kwok, addon_binaries
from inferop_devtools.cluster.controlplane import KUBERNETES_1_37, ClusterError, ControlPlane, http_get, kube_binaries
from inferop_devtools.gateway.backend import COUNTS_PATH
from inferop_devtools.gateway.envoygateway import (
    ENVOY_ADMIN_PORT,
    NAMESPACE,
    XDS_HOST,
    EnvoyGateway,
    cluster_dns_hosts,
    gateway_binaries,
)
from inferop_devtools.gateway.kubelet import Json, PodContainer, StandInPods
from inferop_devtools.gateway.namespaces import enter_private_network
from inferop_devtools.gateway.plane import GATEWAY_API, Cluster, conditions, infrastructure_objects, pod_cidr, wait_for

log = logging.getLogger("gateway-proof")

DEMO = "demo"
GATEWAY = "gw"
ROUTE = "canary"
BACKEND_PORT = 8000  # not 8080: Envoy Gateway binds *:8080 (controller-runtime metrics) in the same namespace
BACKEND_SELECTOR = "app=demo-backend"
TRACKS = {"stable": 2, "canary": 1}  # Deployment -> replicas
FIELD_MANAGER = "inferop-gateway-proof"


# ---------------------------------------------------------------------------------------------- objects


def backend_objects() -> list[Json]:
    """A Deployment and a Service per track; the image is never pulled (kwok runs nothing)."""
    objects: list[Json] = []
    for track, replicas in TRACKS.items():
        labels = {"app": "demo-backend", "track": track}
        objects.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": track, "namespace": DEMO},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": labels},
                    "template": {
                        "metadata": {"labels": labels},
                        "spec": {
                            "containers": [
                                {
                                    "name": "backend",
                                    "image": "inferop.invalid/backend:proof",
                                    "ports": [{"name": "http", "containerPort": BACKEND_PORT}],
                                }
                            ]
                        },
                    },
                },
            }
        )
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": track, "namespace": DEMO},
                "spec": {"selector": labels, "ports": [{"name": "http", "port": BACKEND_PORT, "targetPort": "http"}]},
            }
        )
    return objects


def http_route(stable_weight: int, canary_weight: int, mirror_percent: int = 50) -> Json:
    """`x-canary: 1` goes to the canary; everything else is split by weight and mirrored to the canary."""

    def ref(name: str, weight: int | None = None) -> Json:
        backend: Json = {"name": name, "port": BACKEND_PORT}
        if weight is not None:
            backend["weight"] = weight
        return backend

    return {
        "apiVersion": GATEWAY_API,
        "kind": "HTTPRoute",
        "metadata": {"name": ROUTE, "namespace": DEMO},
        "spec": {
            "parentRefs": [{"name": GATEWAY}],
            "rules": [
                {
                    "matches": [{"headers": [{"name": "x-canary", "value": "1"}]}],
                    "backendRefs": [ref("canary")],
                },
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                    "backendRefs": [ref("stable", stable_weight), ref("canary", canary_weight)],
                    "filters": [
                        {
                            "type": "RequestMirror",
                            "requestMirror": {"backendRef": ref("canary"), "percent": mirror_percent},
                        }
                    ],
                },
            ],
        },
    }


# ---------------------------------------------------------------------------------------------- helpers


class Load:
    """Requests through one keep-alive connection to Envoy's listener, answers counted by body (the pod name)."""

    def __init__(self, address: str, port: int) -> None:
        self.connection = http.client.HTTPConnection(address, port, timeout=5)

    def get(self, headers: dict[str, str] | None = None) -> tuple[int, str]:
        self.connection.request("GET", "/", headers=headers or {})
        response = self.connection.getresponse()
        return response.status, response.read().decode(errors="replace")

    def close(self) -> None:
        self.connection.close()


def backend_counts(pods: StandInPods, strict: bool = True) -> dict[str, int | None]:
    """Requests each backend pod received (mirrored copies included); None for one not answering yet, unless
    `strict`."""
    counts: dict[str, int | None] = {}
    for name, pod in pods.pods.items():
        status, body = http_get(f"http://{pod['status']['podIP']}:{BACKEND_PORT}{COUNTS_PATH}")
        if status != 200 and strict:
            raise ClusterError(f"backend {name} did not answer its counts ({status})")
        counts[name] = int(json.loads(body)["received"]) if status == 200 else None
    return counts


def settled_backend_counts(pods: StandInPods) -> dict[str, int | None]:
    """Counts once they stop moving: mirrored copies are sent asynchronously and may trail the answers."""
    previous = backend_counts(pods)
    while True:
        time.sleep(0.3)
        current = backend_counts(pods)
        if current == previous:
            return current
        previous = current


def observed(route: Json) -> bool:
    """Whether Envoy Gateway has written the HTTPRoute's status for its current generation."""
    parents = (route.get("status") or {}).get("parents") or [{}]
    generations = {c.get("observedGeneration") for c in parents[0].get("conditions", [])}
    return generations == {route["metadata"]["generation"]}


def measure_switch(
    cluster: Cluster, envoy: tuple[str, int], track_of: dict[str, str], stable: int, canary: int, streak: int = 50
) -> dict[str, Any]:
    """Apply new weights while a thread sends requests back to back, and time, from the start of the apply call:
    when Envoy switched (between the last answer that broke the new weights and the answer after it; weighted
    round robin breaks them every few requests, so the bracket is tight) and when Envoy Gateway wrote the
    route's status for the new generation."""
    want = {"stable"} if canary == 0 else {"canary"} if stable == 0 else None
    if want is None:
        raise ValueError("measure a switch to 100/0 or 0/100")
    answers: list[tuple[float, str | None]] = []
    stop = threading.Event()

    def send() -> None:
        load = Load(*envoy)
        try:
            while not stop.is_set():
                status, body = load.get()
                answers.append((time.monotonic(), track_of.get(body) if status == 200 else None))
        finally:
            load.close()

    sender = threading.Thread(target=send, name="load", daemon=True)
    sender.start()
    try:
        time.sleep(0.2)  # answers under the old weights first
        started = time.monotonic()
        cluster.apply(http_route(stable, canary))
        applied = time.monotonic()
        status_seconds: float | None = None
        while True:
            recent = answers[-streak:]
            if len(recent) == streak and recent[0][0] > started and all(t in want for _, t in recent):
                break
            if status_seconds is None and observed(cluster.get(GATEWAY_API, "HTTPRoute", ROUTE, DEMO)):
                status_seconds = time.monotonic() - started
            if time.monotonic() > applied + 60:
                raise ClusterError(f"weights {stable}/{canary} not applied by Envoy within 60 s")
            time.sleep(0.01)
        while status_seconds is None:
            if observed(cluster.get(GATEWAY_API, "HTTPRoute", ROUTE, DEMO)):
                status_seconds = time.monotonic() - started
            time.sleep(0.01)
    finally:
        stop.set()
        sender.join()
    times = [t for t, _ in answers]
    old = [i for i, (t, track) in enumerate(answers) if t > started and track not in want]
    last_old = times[old[-1]] - started if old else None
    next_new = times[old[-1] + 1] - started if old else next(t for t in times if t > started) - started
    return {
        "weights": f"{stable}/{canary}",
        "apply_call_seconds": round(applied - started, 3),
        "envoy_switched_between_seconds": [None if last_old is None else round(last_old, 3), round(next_new, 3)],
        "status_observed_seconds": round(status_seconds, 3),
        "requests_during": len([t for t in times if t > started]),
    }


def envoy_upstream_requests() -> dict[str, int]:
    """Envoy's own count of requests per cluster (admin /stats), mirrors included: a second witness."""
    status, body = http_get(f"http://127.0.0.1:{ENVOY_ADMIN_PORT}/stats?filter=upstream_rq_total$")
    if status != 200:
        raise ClusterError(f"Envoy's admin /stats answered {status}")
    counts = {}
    for line in body.splitlines():
        name, _, value = line.partition(": ")
        if name.startswith("cluster.httproute/"):
            counts[name.removeprefix("cluster.").removesuffix(".upstream_rq_total")] = int(value)
    return counts


# ---------------------------------------------------------------------------------------------- the proof


def run(workdir: Path, requests: int, header_requests: int) -> dict[str, Any]:
    kube_bin = kube_binaries(build=False, release=KUBERNETES_1_37)
    addons_bin = addon_binaries()
    gateway_bin = gateway_binaries()
    result: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        plane = ControlPlane(workdir / "cluster", bin_dir=kube_bin, release=KUBERNETES_1_37)
        stack.callback(plane.down)
        plane.up(timeout=120)
        kwok = Kwok(plane.kubeconfig, workdir, addons_bin)
        stack.callback(kwok.stop)
        kwok.start().add_node("gateway-node-0", timeout=60)

        started = time.monotonic()
        envoy_gateway = EnvoyGateway(plane.kubeconfig, workdir / "envoy-gateway", kube_bin / "kubectl", gateway_bin)
        envoy_gateway.install()
        stack.callback(envoy_gateway.stop)
        envoy_gateway.start(timeout=120)
        log.info("Envoy Gateway ready in %.1f s (CRDs, certgen, cache sync)", time.monotonic() - started)

        cluster = Cluster(plane.kubeconfig)
        for obj in [*infrastructure_objects(DEMO, GATEWAY), *backend_objects()]:
            cluster.apply(obj)

        # The backends: one process per kwok pod, bound to the pod's IP.
        backends = StandInPods(
            cluster.api,
            DEMO,
            BACKEND_SELECTOR,
            workdir / "backends",
            lambda pod: [
                sys.executable,
                "-m",
                "inferop_devtools.gateway.backend",
                f"--address={pod['status']['podIP']}",
                f"--port={BACKEND_PORT}",
                f"--name={pod['metadata']['name']}",
            ],
        )
        stack.callback(backends.stop)
        wait_for(
            lambda: len(backends.running_pods()) == sum(TRACKS.values()),
            "backend pods Running",
            120,
            cluster.pods_and_warnings,
        )
        backends.sync()
        wait_for(lambda: None not in backend_counts(backends, strict=False).values(), "the backends answering", 30)
        track_of = {name: pod["metadata"]["labels"]["track"] for name, pod in backends.pods.items()}
        result["backend_pods"] = {name: pod["status"]["podIP"] for name, pod in backends.pods.items()}

        # The Envoy of the Gateway: Envoy Gateway created its Deployment, kwok ran the pod, we run the container.
        gateway_started = time.monotonic()
        envoy_selector = (
            f"gateway.envoyproxy.io/owning-gateway-name={GATEWAY},gateway.envoyproxy.io/owning-gateway-namespace={DEMO}"
        )

        def envoy_pod() -> Json | None:
            pods = cluster.list("v1", "Pod", NAMESPACE, envoy_selector)
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            return running[0] if running else None

        pod = wait_for(envoy_pod, "the Envoy pod Running", 120, cluster.pods_and_warnings)
        hosts = workdir / "envoy" / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(cluster_dns_hosts({XDS_HOST: "127.0.0.1"}))
        envoy = PodContainer(
            cluster.api,
            NAMESPACE,
            pod["metadata"]["name"],
            "envoy",
            workdir / "envoy",
            path=[gateway_bin],
            binds={"/etc/hosts": hosts},
        )
        stack.callback(envoy.stop)
        envoy.start()
        envoy.wait_ready(timeout=120)
        log.info("Envoy %s ready at %s", pod["metadata"]["name"], envoy.pod_ip)

        services = cluster.list("v1", "Service", NAMESPACE, envoy_selector)
        port = next(p["targetPort"] for p in services[0]["spec"]["ports"] if p["port"] == 80)
        result["envoy"] = {"pod": pod["metadata"]["name"], "address": f"{envoy.pod_ip}:{port}"}

        cluster.apply(http_route(80, 20))
        route = wait_for(
            lambda: (
                (r := cluster.get(GATEWAY_API, "HTTPRoute", ROUTE, DEMO))
                and conditions(r, parent=True).get("ResolvedRefs") == "True"
                and r
            ),
            "HTTPRoute Accepted and ResolvedRefs",
            60,
        )
        gateway = cluster.get(GATEWAY_API, "Gateway", GATEWAY, DEMO)
        result["status"] = {"httproute": conditions(route, parent=True), "gateway": conditions(gateway)}

        load = Load(envoy.pod_ip, port)
        stack.callback(load.close)
        wait_for(lambda: load.get()[0] == 200, "the route served by Envoy", 60)
        result["gateway_to_first_answer_seconds"] = round(time.monotonic() - gateway_started, 1)

        before = settled_backend_counts(backends)
        answers: Counter[str] = Counter()
        for _ in range(requests):
            status, body = load.get()
            answers[track_of.get(body, f"status {status}")] += 1
        header_answers: Counter[str] = Counter()
        for _ in range(header_requests):
            status, body = load.get({"x-canary": "1"})
            header_answers[track_of.get(body, f"status {status}")] += 1
        after = settled_backend_counts(backends)
        received: Counter[str] = Counter()
        for name in after:
            received[track_of[name]] += (after[name] or 0) - (before.get(name) or 0)
        result["weighted_80_20"] = {"requests": requests, "answered_by": dict(answers)}
        result["header_x_canary"] = {"requests": header_requests, "answered_by": dict(header_answers)}
        canary_answers = answers["canary"] + header_answers["canary"]
        result["mirror_50_percent"] = {
            "canary_received": received["canary"],
            "canary_answered": canary_answers,
            "mirrored": received["canary"] - canary_answers,
            "expected_about": requests // 2,
            "stable_received": received["stable"],
        }

        result["envoy_upstream_rq_total"] = envoy_upstream_requests()

        result["weight_changes"] = [
            measure_switch(cluster, (envoy.pod_ip, port), track_of, 0, 100),
            measure_switch(cluster, (envoy.pod_ip, port), track_of, 100, 0),
            measure_switch(cluster, (envoy.pod_ip, port), track_of, 0, 100),
        ]
        route = cluster.get(GATEWAY_API, "HTTPRoute", ROUTE, DEMO)
        result["status_after_changes"] = conditions(route, parent=True)
    return result


@contextlib.contextmanager
def work_directory(path: Path | None) -> Iterator[Path]:
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        yield path
        return
    with tempfile.TemporaryDirectory(prefix="inferop-gateway-") as temporary:
        yield Path(temporary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400, help="requests without the header (weighted, mirrored)")
    parser.add_argument("--header-requests", type=int, default=50, help="requests with x-canary: 1")
    parser.add_argument("--workdir", type=Path, default=None, help="kept afterwards (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    # First, before any thread exists: everything from here on lives in the private network namespace.
    enter_private_network([pod_cidr()])
    try:
        with work_directory(args.workdir) as workdir:
            result = run(workdir, args.requests, args.header_requests)
    except ClusterError as error:
        print(f"gateway proof failed: {error}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A whole serving cluster on one machine for rollouts: the operator under test, driving a real data plane.

    kube-apiserver 1.37 (+ etcd, controller-manager, scheduler) with the CRDs, kwok for the nodes
    the operator, as its own process, with a Prometheus URL
    Envoy Gateway and its Envoy (envoygateway, kubelet), one Gateway `inference` in namespace `models`
    the operator's Triton pods, each a real tritonserver at its pod IP (tritonpods)
    Prometheus scraping each Triton pod with the labels the chart's PodMonitor gives it, and Envoy's stats

Everything runs in the caller's network namespace, which must be private with kwok's pod range local
(namespaces.enter_private_network, `pod_cidr`): call that first. Needs root, and scripts/kube-current.sh,
kube-addons.sh, gateway.sh and prometheus.sh built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from inferop_devtools.cluster.addons import Kwok, addon_binaries
from inferop_devtools.cluster.controlplane import KUBERNETES_1_37, ClusterError, http_get, kube_binaries
from inferop_devtools.drills.harness import DrillCluster, OperatorProcess
from inferop_devtools.gateway.envoygateway import (
    CONTROLLER_NAME,
    ENVOY_ADMIN_PORT,
    NAMESPACE,
    XDS_HOST,
    EnvoyGateway,
    cluster_dns_hosts,
    gateway_binaries,
)
from inferop_devtools.gateway.kubelet import Json, PodContainer
from inferop_devtools.gateway.tritonpods import TritonPods, played_stages
from inferop_devtools.prometheus import Prometheus
from inferop_operator.identity import API_VERSION, GROUP, KIND, PLURAL, VERSION

log = logging.getLogger(__name__)
GATEWAY_API = "gateway.networking.k8s.io/v1"
MODELS = "models"  # the namespace of the services and of their Gateway
GATEWAY = "inference"
LISTENER_PORT = 80  # the Gateway's listener; Envoy Gateway binds Envoy to 10080 for it
FIELD_MANAGER = "inferop-drill"


# The pod IPs kwok hands out here: not loopback, which EndpointSlices refuse (and Envoy would find no endpoint),
# made local by `enter_private_network` inside the drill's own network namespace.
POD_CIDR = "10.0.0.1/24"
SCRAPE_SECONDS = 1  # Prometheus' scrape interval: a rollout's quick steps last seconds


def pod_cidr() -> str:
    """The range `enter_private_network` must make local."""
    return POD_CIDR


def envoy_stats_job(address: str) -> dict[str, Any]:
    """The scrape of Envoy's Prometheus stats, as Envoy Gateway's docs have a PodMonitor scrape its proxies."""
    return {"job_name": "envoy", "metrics_path": "/stats/prometheus", "static_configs": [{"targets": [address]}]}


def infrastructure_objects(namespace: str = MODELS, gateway: str = GATEWAY) -> list[Json]:
    """An EnvoyProxy that makes the Envoy Service a ClusterIP (no load-balancer controller would ever give a
    LoadBalancer an address, and the Gateway would stay unprogrammed), the GatewayClass naming it, a Gateway
    with an HTTP listener that admits routes from its own namespace."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "EnvoyProxy",
            "metadata": {"name": "local", "namespace": NAMESPACE},
            "spec": {"provider": {"type": "Kubernetes", "kubernetes": {"envoyService": {"type": "ClusterIP"}}}},
        },
        {
            "apiVersion": GATEWAY_API,
            "kind": "GatewayClass",
            "metadata": {"name": "eg"},
            "spec": {
                "controllerName": CONTROLLER_NAME,
                "parametersRef": {
                    "group": "gateway.envoyproxy.io",
                    "kind": "EnvoyProxy",
                    "name": "local",
                    "namespace": NAMESPACE,
                },
            },
        },
        {
            "apiVersion": GATEWAY_API,
            "kind": "Gateway",
            "metadata": {"name": gateway, "namespace": namespace},
            "spec": {
                "gatewayClassName": "eg",
                "listeners": [{"name": "http", "protocol": "HTTP", "port": LISTENER_PORT}],
            },
        },
    ]


def wait_for(
    check: Callable[[], Any], what: str, timeout: float, explain: Callable[[], str] = str, interval: float = 0.2
) -> Any:
    """Poll `check` until it returns something truthy; raise after `timeout` seconds, with `explain()`."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):  # an object not there yet, an apiserver busy
            if result := check():
                return result
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not after {timeout:g} s\n{explain()}")
        time.sleep(interval)


def conditions(obj: Json, parent: bool = False) -> dict[str, str]:
    """type -> status of an object's conditions (an HTTPRoute's: those of its first parent; a policy's: those of
    its first ancestor)."""
    status = obj.get("status") or {}
    if parent:
        parents = status.get("parents") or status.get("ancestors") or [{}]
        return {c["type"]: c["status"] for c in parents[0].get("conditions", [])}
    return {c["type"]: c["status"] for c in status.get("conditions", [])}


class Cluster:
    """The API through a dynamic client: server-side apply of any kind, reads as plain dicts."""

    def __init__(self, kubeconfig: Path) -> None:
        from kubernetes import config, dynamic

        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.dynamic = dynamic.DynamicClient(self.api)

    def apply(self, obj: Json) -> Json:
        resource = self.dynamic.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        applied = resource.server_side_apply(body=obj, field_manager=FIELD_MANAGER, force_conflicts=True)
        result: Json = applied.to_dict()
        return result

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Json:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        result: Json = resource.get(name=name, namespace=namespace).to_dict()
        return result

    def patch(self, api_version: str, kind: str, name: str, namespace: str, body: Json) -> Json:
        """A JSON merge patch (an edit of some fields, as `kubectl patch --type merge`)."""
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        patched = resource.patch(body=body, name=name, namespace=namespace, content_type="application/merge-patch+json")
        result: Json = patched.to_dict()
        return result

    def list(self, api_version: str, kind: str, namespace: str | None, selector: str = "") -> list[Json]:
        resource = self.dynamic.resources.get(api_version=api_version, kind=kind)
        return [item.to_dict() for item in resource.get(namespace=namespace, label_selector=selector).items]

    def pods_and_warnings(self) -> str:
        """Every pod's phase and node, and the last warning events: why a wait for pods timed out."""
        lines = [
            f"pod {p['metadata']['namespace']}/{p['metadata']['name']}: {(p.get('status') or {}).get('phase')}"
            f" on {p['spec'].get('nodeName') or 'no node'}"
            for p in self.list("v1", "Pod", None)
        ]
        warnings = [e for e in self.list("v1", "Event", None) if e.get("type") == "Warning"]
        lines += [
            f"event {e['involvedObject']['kind']}/{e['involvedObject']['name']}: {e['message']}" for e in warnings
        ]
        return "\n".join(lines[-30:])


class GatewayPlane:
    """The cluster above, started in `workdir`; `operator_env` adds operator settings (INFEROP_*), `faults` maps a
    Triton pod's config text to the fault environment of its server (see TritonPods)."""

    def __init__(
        self,
        workdir: Path,
        operator_env: Mapping[str, str] | None = None,
        faults: Callable[[str], Mapping[str, str]] = lambda config: {},
        cpuset: Callable[[Json], str | None] = lambda pod: None,
    ) -> None:
        self.workdir, self.operator_env, self.faults, self.cpuset = workdir, dict(operator_env or {}), faults, cpuset
        self.stack = contextlib.ExitStack()
        self.envoy_address = ""  # host:port of Envoy's listener for the Gateway
        self.envoy_metrics = ""  # host:port of its Prometheus stats (/stats/prometheus), its pod's `metrics` port

    def __enter__(self) -> GatewayPlane:
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stack.close()

    def _start(self) -> None:
        workdir, stack = self.workdir, self.stack
        kube_bin = kube_binaries(build=False, release=KUBERNETES_1_37)
        gateway_bin = gateway_binaries()
        self.drill = stack.enter_context(DrillCluster(workdir, release=KUBERNETES_1_37))
        kwok = Kwok(self.drill.plane.kubeconfig, workdir, addon_binaries(), played_stages(workdir), POD_CIDR)
        stack.callback(kwok.stop)
        kwok.start().add_node("node-0", timeout=60)

        started = time.monotonic()
        envoy_gateway = EnvoyGateway(self.drill.plane.kubeconfig, workdir / "envoy-gateway", kube_bin / "kubectl")
        envoy_gateway.install()
        stack.callback(envoy_gateway.stop)
        envoy_gateway.start(timeout=120)
        log.info("Envoy Gateway ready in %.1f s", time.monotonic() - started)
        self.cluster = Cluster(self.drill.plane.kubeconfig)
        for obj in infrastructure_objects():
            self.cluster.apply(obj)
        self._start_envoy(gateway_bin)

        targets = workdir / "prometheus-targets.json"
        targets.write_text("[]")
        self.prometheus = Prometheus(
            [], file_sd=targets, jobs=[envoy_stats_job(self.envoy_metrics)], scrape_interval=f"{SCRAPE_SECONDS}s"
        )
        self.prometheus.start()
        stack.callback(self.prometheus.stop)

        def publish_targets() -> None:
            staged = targets.with_suffix(".tmp")
            staged.write_text(json.dumps(self.pods.targets()))
            staged.replace(targets)  # whole, so Prometheus never reads half a file

        self.pods = TritonPods(self.drill.api, MODELS, workdir / "pods", self.faults, publish_targets, self.cpuset)
        stack.callback(self.pods.stop)
        self.pods.run()
        env = {"INFEROP_PROMETHEUS_URL": self.prometheus.url, **self.operator_env}
        self.operator = OperatorProcess(self.drill, workdir / "operator.log", env=env)
        stack.callback(self.operator.stop)
        self.operator.start()

    def _start_envoy(self, gateway_bin: Path) -> None:
        """The Envoy that Envoy Gateway deployed for the Gateway: its pod (kwok's) run here (kubelet.PodContainer)."""
        owner = "gateway.envoyproxy.io/owning-gateway"
        selector = f"{owner}-name={GATEWAY},{owner}-namespace={MODELS}"

        def envoy_pod() -> Json | None:
            pods = self.cluster.list("v1", "Pod", NAMESPACE, selector)
            running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
            return running[0] if running else None

        pod = wait_for(envoy_pod, "the Envoy pod Running", 120, self.cluster.pods_and_warnings)
        hosts = self.workdir / "envoy" / "hosts"
        hosts.parent.mkdir(parents=True, exist_ok=True)
        hosts.write_text(cluster_dns_hosts({XDS_HOST: "127.0.0.1"}))
        envoy = PodContainer(
            self.cluster.api,
            NAMESPACE,
            pod["metadata"]["name"],
            "envoy",
            self.workdir / "envoy",
            path=[gateway_bin],
            binds={"/etc/hosts": hosts},
        )
        self.stack.callback(envoy.stop)
        envoy.start()
        envoy.wait_ready(timeout=120)
        services = self.cluster.list("v1", "Service", NAMESPACE, selector)
        port = next(p["targetPort"] for p in services[0]["spec"]["ports"] if p["port"] == LISTENER_PORT)
        self.envoy_address = f"{envoy.pod_ip}:{port}"
        (container,) = (c for c in pod["spec"]["containers"] if c["name"] == "envoy")
        metrics = next(p["containerPort"] for p in container.get("ports", ()) if p.get("name") == "metrics")
        self.envoy_metrics = f"{envoy.pod_ip}:{metrics}"

    # ------------------------------------------------------------------------------------------- services

    def apply_service(self, manifest: Json) -> Json:
        return self.cluster.apply({"apiVersion": API_VERSION, "kind": KIND, **manifest})

    def service(self, name: str) -> Json:
        return self.cluster.get(API_VERSION, KIND, name, MODELS)

    def patch_service(self, name: str, spec: Json) -> Json:
        return self.cluster.patch(API_VERSION, KIND, name, MODELS, {"spec": spec})

    def route(self, name: str) -> Json | None:
        try:
            return self.cluster.get(GATEWAY_API, "HTTPRoute", name, MODELS)
        except Exception:  # not found
            return None

    def envoy_max_requests(self, route: str) -> dict[str, int]:
        """Envoy's bound on parallel requests for each backend of HTTPRoute `route` (Envoy Gateway makes a cluster per
        route rule), from its admin API: what it enforces, whatever the objects say."""
        status, body = http_get(f"http://127.0.0.1:{ENVOY_ADMIN_PORT}/clusters?format=json")
        if status != 200:
            raise ClusterError(f"Envoy's admin /clusters answered {status}")
        found = {}
        for cluster in json.loads(body).get("cluster_statuses", []):
            if cluster["name"].startswith(f"httproute/{MODELS}/{route}/"):
                (default, *_) = cluster.get("circuit_breakers", {}).get("thresholds", [{}])
                found[cluster["name"]] = int(default.get("max_requests", 0))
        return found

    def delete_service(self, name: str) -> None:
        self.drill.custom.delete_namespaced_custom_object(GROUP, VERSION, MODELS, PLURAL, name)

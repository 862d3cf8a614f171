"""A whole serving cluster on the local node for rollouts: the operator under test, driving a real data plane.

    kube-apiserver 1.37 (+ etcd, controller-manager, scheduler) and one real node: containerd, the kubelet,
        kube-proxy and CoreDNS, as `inferop cluster up` starts them (cluster.node)
    Envoy Gateway, installed with its own Helm chart (envoygateway), and the Envoy it deploys for one Gateway
        `inference` in namespace `models`: pods of the node, of the local images
    the operator, as its own process, with a Prometheus URL; its Triton pods, pods of the node that serve what it
        rendered (the local Triton image)
    Prometheus scraping the Triton pods as the chart's PodMonitor selects and labels them, and Envoy's pods as
        Envoy Gateway's docs have them scraped (gateway.discovery)

The calling process enters the node's network namespace once the node is up, as a host-network process of the
node would run: the operator and Prometheus that it starts run there too, and its callers reach the Gateway's
Service and the pods' addresses. Needs root, and scripts/kube-current.sh, kube-node.sh, kube-addons.sh, gateway.sh
and prometheus.sh built.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from inferop.serving.tritonserver import model_metrics
from inferop_devtools.cluster.controlplane import ClusterError, http_get
from inferop_devtools.cluster.images import Images
from inferop_devtools.cluster.local_images import envoy_gateway_image, envoy_image, images_cache
from inferop_devtools.cluster.node import CTR, NODE_SCRIPT
from inferop_devtools.cluster.tools import built
from inferop_devtools.drills.harness import DrillCluster, OperatorProcess
from inferop_devtools.gateway.discovery import PodDiscovery, PodMonitor
from inferop_devtools.gateway.envoygateway import CONTROLLER_NAME, NAMESPACE, EnvoyGateway, gateway_binaries
from inferop_devtools.prometheus import CHART_JOB, Prometheus
from inferop_operator.builders import envoy_pod_labels
from inferop_operator.identity import (
    API_VERSION,
    COMPONENT,
    COMPONENTS,
    GROUP,
    INSTANCE,
    KIND,
    MANAGED,
    PLURAL,
    VERSION,
    label_selector,
)

log = logging.getLogger(__name__)
Json = dict[str, Any]
GATEWAY_API = "gateway.networking.k8s.io/v1"
MODELS = "models"  # the namespace of the services and of their Gateway
GATEWAY = "inference"
LISTENER_PORT = 80  # the Gateway's listener, the port of the Service in front of its Envoy
FIELD_MANAGER = "inferop-drill"
SCRAPE_SECONDS = 1  # Prometheus' scrape interval: a rollout's quick steps last seconds
# Envoy's admin port in the bootstrap Envoy Gateway renders, on 127.0.0.1 of its pod: stats, clusters, config_dump.
ENVOY_ADMIN_PORT = 19000
# The labels Envoy Gateway puts on the Envoy of a Gateway.
ENVOY_LABELS = envoy_pod_labels(GATEWAY, MODELS)
ENVOY_SELECTOR = label_selector(ENVOY_LABELS)
# Triton's counters of a model that the drills read off each pod.
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_request_duration_us")


# The chart's PodMonitor of the Triton pods (charts/inferop/templates/monitoring.yaml): every namespace, the pods
# of either track, their service and track as labels, under the job its rules select.
TRITON_PODS = PodMonitor(
    CHART_JOB,
    {**{key: [value] for key, value in MANAGED.items()}, COMPONENT: sorted(COMPONENTS.values())},
    "metrics",
    [INSTANCE, COMPONENT],
)
# Envoy's Prometheus stats, as Envoy Gateway's docs have a PodMonitor scrape its proxies.
ENVOY_STATS = PodMonitor(
    "envoy", {k: [v] for k, v in ENVOY_LABELS.items()}, "metrics", path="/stats/prometheus", namespaces=[NAMESPACE]
)


def infrastructure_objects(envoy: str, namespace: str = MODELS, gateway: str = GATEWAY) -> list[Json]:
    """An EnvoyProxy that runs the local Envoy image `envoy` behind a ClusterIP Service (no load-balancer
    controller would ever give a LoadBalancer an address, and the Gateway would stay unprogrammed), the GatewayClass
    naming it, a Gateway with an HTTP listener that admits routes from its own namespace."""
    kubernetes = {"envoyService": {"type": "ClusterIP"}, "envoyDeployment": {"container": {"image": envoy}}}
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "gateway.envoyproxy.io/v1alpha1",
            "kind": "EnvoyProxy",
            "metadata": {"name": "local", "namespace": NAMESPACE},
            "spec": {"provider": {"type": "Kubernetes", "kubernetes": kubernetes}},
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
    """The cluster above, started in `workdir`; `operator_env` adds operator settings (INFEROP_*)."""

    def __init__(self, workdir: Path, operator_env: Mapping[str, str] | None = None) -> None:
        self.workdir, self.operator_env = workdir, dict(operator_env or {})
        self.stack = contextlib.ExitStack()
        self.envoy_address = ""  # host:port of the Service in front of the Gateway's Envoy
        self._baselines: dict[str, dict[str, float]] = {}  # each Triton pod's counters when first read

    def __enter__(self) -> GatewayPlane:
        try:
            self._start()
        except BaseException as error:
            if not self.stack.__exit__(type(error), error, error.__traceback__):
                raise
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stack.close()

    def _start(self) -> None:
        workdir, stack = self.workdir, self.stack
        gateway_bin = gateway_binaries()
        self.drill = stack.enter_context(DrillCluster(workdir, node=True))
        node = self.drill.node
        assert node is not None
        files = built(NODE_SCRIPT, "the node's packages and files")
        specs = [envoy_gateway_image(gateway_bin), envoy_image(files, gateway_bin)]
        images = Images(images_cache(), str(CTR)).ensure(node.containerd_socket, specs)
        stack.enter_context(node.site.network())  # before any thread: everything below runs in the node's network
        kubeconfig = self.drill.plane.kubeconfig
        started = time.monotonic()
        EnvoyGateway(kubeconfig, self.drill.tools, gateway_bin).install(images["envoy-gateway"])
        log.info("Envoy Gateway Ready in %.1f s", time.monotonic() - started)
        self.cluster = Cluster(kubeconfig)
        for obj in infrastructure_objects(images["envoy"]):
            self.cluster.apply(obj)
        self._find_envoy()

        monitors = [TRITON_PODS, ENVOY_STATS]
        targets = workdir / "prometheus-targets"
        stack.enter_context(PodDiscovery(lambda: self.cluster.list("v1", "Pod", None), monitors, targets))
        jobs = [monitor.scrape_job(targets) for monitor in monitors]
        self.prometheus = Prometheus([], jobs=jobs, scrape_interval=f"{SCRAPE_SECONDS}s")
        self.prometheus.start()
        stack.callback(self.prometheus.stop)
        env = {"INFEROP_PROMETHEUS_URL": self.prometheus.url, **self.operator_env}
        self.operator = OperatorProcess(self.drill, workdir / "operator.log", env=env)
        stack.callback(self.operator.stop)
        self.operator.start()

    def envoy_pod(self) -> Json:
        """The pod of the Gateway's Envoy."""
        (pod, *_) = self.cluster.list("v1", "Pod", NAMESPACE, ENVOY_SELECTOR)
        return pod

    def _find_envoy(self) -> None:
        """The Envoy that Envoy Gateway deployed for the Gateway, Ready, and the address of its Service."""

        def ready() -> bool:
            pods = self.cluster.list("v1", "Pod", NAMESPACE, ENVOY_SELECTOR)
            return any(conditions(p).get("Ready") == "True" for p in pods)

        wait_for(ready, "the Gateway's Envoy pod Ready", 180, self.cluster.pods_and_warnings)
        (service,) = self.cluster.list("v1", "Service", NAMESPACE, ENVOY_SELECTOR)
        self.envoy_address = f"{service['spec']['clusterIP']}:{LISTENER_PORT}"

    # ------------------------------------------------------------------------------------------- pods

    def triton_pods(self, service: str | None = None) -> list[Json]:
        """The Triton pods of every service (or of `service`), in the order they were made."""
        selector = label_selector({**MANAGED, **({INSTANCE: service} if service else {})})
        pods = self.cluster.list("v1", "Pod", MODELS, selector)
        return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])

    def counts(self, model: str, pods: list[Json]) -> dict[str, dict[str, float]]:
        """Each pod's requests of `model` as Triton counts them (successes, failures, time in the server) since
        this plane first read them (its first reading, as the pod turned Ready, the baseline: warm-ups left out),
        read off its metrics port; pods that do not answer are left out."""
        found = {}
        for pod in pods:
            name, address = pod["metadata"]["name"], (pod.get("status") or {}).get("podIP")
            if not address:
                continue
            (triton,) = (
                c for c in pod["spec"]["containers"] if any(p.get("name") == "metrics" for p in c.get("ports", ()))
            )
            port = next(p["containerPort"] for p in triton["ports"] if p.get("name") == "metrics")
            try:
                now = model_metrics(f"http://{address}:{port}/metrics", model, *COUNTERS)
            except OSError:
                continue
            first = self._baselines.setdefault(name, now)
            found[name] = {key: value - first[key] for key, value in now.items()}
        return found

    @contextlib.contextmanager
    def envoy_admin(self) -> Iterator[str]:
        """The address of the Envoy's admin API (127.0.0.1 of its pod), through `kubectl port-forward`."""
        pod = self.envoy_pod()
        argv = [str(self.drill.tools / "kubectl"), "port-forward", "-n", NAMESPACE, "--address=127.0.0.1",
                f"pod/{pod['metadata']['name']}", f":{ENVOY_ADMIN_PORT}"]  # fmt: skip
        forward = subprocess.Popen(
            argv, env=self.drill.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        try:
            assert forward.stdout is not None
            said = forward.stdout.readline()  # "Forwarding from 127.0.0.1:43215 -> 19000", or why not
            found = re.search(r"127\.0\.0\.1:(\d+)", said)
            if found is None:
                raise ClusterError(f"kubectl port-forward to Envoy's admin said: {said}")
            yield f"127.0.0.1:{found.group(1)}"
        finally:
            forward.terminate()
            forward.wait(timeout=10)

    def envoy_stats(self, *names: str) -> dict[str, int]:
        """Counters of the Gateway's Envoy by their full names (its admin API's /stats), 0 for one it lacks."""
        with self.envoy_admin() as admin:
            status, body = http_get(f"http://{admin}/stats?format=json")
        if status != 200:
            raise ClusterError(f"Envoy's admin /stats answered {status}")
        found = {stat["name"]: stat.get("value") for stat in json.loads(body).get("stats", []) if "name" in stat}
        return {name: int(found.get(name) or 0) for name in names}

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
        with self.envoy_admin() as admin:
            status, body = http_get(f"http://{admin}/clusters?format=json")
        if status != 200:
            raise ClusterError(f"Envoy's admin /clusters answered {status}")
        found = {}
        for cluster in json.loads(body).get("cluster_statuses", []):
            if cluster["name"].startswith(f"httproute/{MODELS}/{route}/"):
                (default, *_) = cluster.get("circuit_breakers", {}).get("thresholds", [{}])
                found[cluster["name"]] = int(default.get("max_requests", 0))
        return found

    def caller_beside(self, addresses: list[str], port: int) -> dict[str, str]:
        """What a pod of the services' namespace that is not the gateway meets when it connects to each of
        `addresses` at `port`: "connected", "refused" or "timed out" (a pod of the operator's image, which has
        Python; it says so in its termination message)."""
        assert self.drill.node is not None
        name = f"beside-{int(time.monotonic() * 1000) % 10**8}"
        script = (
            "import json, socket, sys\n"
            "def attempt(address):\n"
            "    try:\n"
            f"        socket.create_connection((address, {port}), timeout=5).close()\n"
            "        return 'connected'\n"
            "    except ConnectionRefusedError:\n"
            "        return 'refused'\n"
            "    except OSError:\n"
            "        return 'timed out'\n"
            "met = {address: attempt(address) for address in sys.argv[1:]}\n"
            "open('/dev/termination-log', 'w').write(json.dumps(met))\n"
        )
        container = {"name": "caller", "image": self.drill.node.images()["operator"], "imagePullPolicy": "Never",
                     "command": ["python3", "-c", script, *addresses]}  # fmt: skip
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": MODELS},
               "spec": {"containers": [container], "restartPolicy": "Never"}}  # fmt: skip
        self.cluster.apply(pod)

        def ended() -> Json | None:
            statuses = (self.cluster.get("v1", "Pod", name, MODELS).get("status") or {}).get("containerStatuses")
            return ((statuses or [{}])[0].get("state") or {}).get("terminated")

        terminated = wait_for(ended, "the caller beside the services to end", 120, self.cluster.pods_and_warnings)
        self.cluster.dynamic.resources.get(api_version="v1", kind="Pod").delete(name=name, namespace=MODELS)
        met: dict[str, str] = json.loads(terminated.get("message") or "{}")
        return met

    def delete_service(self, name: str) -> None:
        self.drill.custom.delete_namespaced_custom_object(GROUP, VERSION, MODELS, PLURAL, name)

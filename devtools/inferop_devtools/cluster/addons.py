"""What turns the bare control plane into a cluster with nodes and custom metrics, for end-to-end tests.

- `Kwok` plays the kubelet of fake nodes: Pods the kube-scheduler places there become Running and Ready with
  container statuses, or crash-loop when labelled so (the stages in scripts/kwok/).
- `MetricsAdapter` runs prometheus-adapter against a real Prometheus and registers it through the apiserver's
  aggregation layer as `custom.metrics.k8s.io`, where the HPA controller reads Pods metrics.
- `PodTargets` tells Prometheus which pods to scrape, as a PodMonitor would: Debian's Prometheus is built
  without Kubernetes service discovery, so the Running and Ready pods are listed here and written to a
  file_sd file, every one pointing at one address (the local tritonserver that stands in for all of them)
  and labelled with its own namespace and pod name.

The binaries come from scripts/kube-addons.sh. kwok needs a kube-scheduler, so a release whose control plane
runs none gets no kwok.
"""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from inferop.paths import log_tail, repo_root
from inferop_devtools.cluster.controlplane import (
    ClusterError,
    free_ports,
    http_get,
    insecure_context,
    stop_process,
)
from inferop_devtools.cluster.tools import built

log = logging.getLogger(__name__)

ADDONS_SCRIPT = "kube-addons.sh"
ADDONS = ("kwok", "prometheus-adapter", "coredns", "kube-router")
KWOK_DIR = repo_root() / "scripts" / "kwok"
# The stages kwok plays (it ships none without kwokctl): nodes Ready, pods Running and Ready, crash loops.
KWOK_STAGES = ("node.yaml", "pod.yaml", "pod-crashloop.yaml")
# kwok takes the nodes with this annotation and leaves every other node alone.
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
# A restarted kwok waits out the lease of the node its predecessor held: fresh node names never wait.
NODE_LEASE_SECONDS = 40
# Where prometheus-adapter's APIService points: an ExternalName Service resolves to this address without
# kube-proxy or Endpoints (which may not hold a loopback address).
ADAPTER_HOST = "127.0.0.1"
CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
CUSTOM_METRICS_VERSIONS = ("v1beta1", "v1beta2")


def addon_binaries(build: bool = False) -> Path:
    """The directory holding the ADDONS; with `build=False` a missing build raises at once."""
    return built(ADDONS_SCRIPT, ", ".join(ADDONS), build)


class Daemon:
    """A background process in its own session, its output in a log file; stopped with its process group. `env`
    replaces the environment it inherits."""

    def __init__(self, argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = None if env is None else dict(env)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log_file:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=self.env,
            )

    def check(self) -> None:
        """Raise with the log's tail when the process has exited."""
        if self.process is not None and self.process.poll() is not None:
            name = Path(self.argv[0]).name
            raise ClusterError(f"{name} exited with status {self.process.returncode}\n{log_tail(self.log_path)}")

    def wait(self, ready: Callable[[], bool], what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            self.check()
            if time.monotonic() > deadline:
                raise ClusterError(f"{what} not ready after {timeout:g} s\n{log_tail(self.log_path)}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None:
            stop_process(self.process.pid, self.argv[0])
            self.process.wait()
            self.process = None


# The pod IPs kwok hands out, on loopback: the apiserver takes them, EndpointSlices leave them out, and a client that
# follows one (the operator's agreement check) reaches this machine only. A data plane whose Envoy must route to pods
# (inferop_devtools.gateway) runs on the real node instead.
LOOPBACK_POD_CIDR = "127.0.100.1/24"


def kwok_command(
    bin_dir: Path, kubeconfig: Path, stages: Sequence[Path] | None = None, cidr: str = LOOPBACK_POD_CIDR
) -> list[str]:
    """kwok playing the kubelet of the fake nodes, with `stages` (default: scripts/kwok's KWOK_STAGES), pod IPs from
    `cidr`."""
    stage_files = stages if stages is not None else [KWOK_DIR / stage for stage in KWOK_STAGES]
    return [
        str(bin_dir / "kwok"),
        f"--kubeconfig={kubeconfig}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={FAKE_NODE_ANNOTATION}=fake",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
        f"--cidr={cidr}",
        f"--node-ip={cidr.split('/')[0]}",
        *[f"--config={stage}" for stage in stage_files],
    ]


def fake_node(name: str) -> dict[str, Any]:
    """scripts/kwok/fake-node.yaml under another name."""
    node: dict[str, Any] = yaml.safe_load((KWOK_DIR / "fake-node.yaml").read_text())
    node["metadata"]["name"] = name
    node["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return node


class Kwok:
    """kwok on the control plane behind `kubeconfig`, with fake nodes added by `add_node`."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        bin_dir: Path | None = None,
        stages: Sequence[Path] | None = None,
        cidr: str = LOOPBACK_POD_CIDR,
    ) -> None:
        from kubernetes import client, config

        argv = kwok_command(bin_dir or addon_binaries(), kubeconfig, stages, cidr)
        self.daemon = Daemon(argv, workdir / "kwok.log")
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api)

    def start(self) -> Kwok:
        self.daemon.start()
        return self

    def add_node(self, name: str, timeout: float = 30.0) -> None:
        """Create a fake node and return once kwok reports it Ready."""
        from kubernetes import utils

        utils.create_from_dict(self.api, fake_node(name))
        self.daemon.wait(lambda: _holds(_conditions(self.core.read_node(name)), "Ready"), f"node {name}", timeout)

    def stop(self) -> None:
        self.daemon.stop()

    def __enter__(self) -> Kwok:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def adapter_command(
    bin_dir: Path, kubeconfig: Path, port: int, workdir: Path, prometheus_url: str, relist_seconds: int
) -> list[str]:
    return [
        str(bin_dir / "prometheus-adapter"),
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={ADAPTER_HOST}",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'adapter-certs'}",
        f"--prometheus-url={prometheus_url}",
        f"--config={workdir / 'adapter-config.yaml'}",
        # How often it lists Prometheus' series: a pod's metric exists for the HPA only after a relist saw it.
        f"--metrics-relist-interval={relist_seconds}s",
    ]


def adapter_objects(namespace: str, name: str, port: int) -> list[dict[str, Any]]:
    """The Service and APIServices that route custom.metrics.k8s.io through the apiserver to the adapter."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": ADAPTER_HOST},
    }
    api_services = [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": f"{version}.{CUSTOM_METRICS_GROUP}"},
            "spec": {
                "group": CUSTOM_METRICS_GROUP,
                "version": version,
                "service": {"namespace": namespace, "name": name, "port": port},
                # It serves a self-signed certificate for its own name, not the Service's.
                "insecureSkipTLSVerify": True,
                "groupPriorityMinimum": 100,
                "versionPriority": 100 + index,
            },
        }
        for index, version in enumerate(CUSTOM_METRICS_VERSIONS)
    ]
    return [service, *api_services]


class MetricsAdapter:
    """prometheus-adapter with `config` (its --config, e.g. the chart's metricsAdapter rules) reading
    `prometheus_url`, served as custom.metrics.k8s.io by the apiserver behind `kubeconfig`.

    `stop` removes the APIServices too: an unavailable aggregated API fails discovery, and with it namespace
    deletion, for everyone."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        prometheus_url: str,
        config: Mapping[str, Any],
        namespace: str = "custom-metrics",
        relist_seconds: int = 2,
        bin_dir: Path | None = None,
    ) -> None:
        from kubernetes import config as kube_config

        self.workdir = workdir
        self.config = dict(config)
        self.namespace = namespace
        self.port = free_ports(1)[0]
        argv = adapter_command(
            bin_dir or addon_binaries(), kubeconfig, self.port, workdir, prometheus_url, relist_seconds
        )
        self.daemon = Daemon(argv, workdir / "prometheus-adapter.log")
        self.api = kube_config.new_client_from_config(config_file=str(kubeconfig))

    def start(self, timeout: float = 60.0) -> MetricsAdapter:
        """Run the adapter and register it; on failure nothing is left running or registered."""
        try:
            self._start(timeout)
        except BaseException:  # no __exit__ follows a failed __enter__
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        from kubernetes import client, utils

        (self.workdir / "adapter-config.yaml").write_text(yaml.safe_dump(self.config, sort_keys=False))
        self.daemon.start()
        url = f"https://{ADAPTER_HOST}:{self.port}/readyz"
        self.daemon.wait(lambda: http_get(url, insecure_context())[0] == 200, "prometheus-adapter", timeout)
        namespaces = client.CoreV1Api(self.api).list_namespace(field_selector=f"metadata.name={self.namespace}")
        if not namespaces.items:
            utils.create_from_dict(
                self.api, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
            )
        for body in adapter_objects(self.namespace, "prometheus-adapter", self.port):
            utils.create_from_dict(self.api, body)
        registry = client.ApiregistrationV1Api(self.api)

        def available() -> bool:
            services = [registry.read_api_service(f"{v}.{CUSTOM_METRICS_GROUP}") for v in CUSTOM_METRICS_VERSIONS]
            return all(_holds(_conditions(s), "Available") for s in services)

        self.daemon.wait(available, "the custom.metrics.k8s.io APIServices", timeout)

    def stop(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        registry = client.ApiregistrationV1Api(self.api)
        for version in CUSTOM_METRICS_VERSIONS:
            try:
                registry.delete_api_service(f"{version}.{CUSTOM_METRICS_GROUP}")
            except ApiException as error:
                if error.status != 404:
                    raise
        self.daemon.stop()

    def __enter__(self) -> MetricsAdapter:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def _conditions(resource: Any) -> Sequence[Any]:
    """An object's status conditions; none while it has no status yet."""
    return (resource.status and resource.status.conditions) or ()


def _holds(conditions: Sequence[Any], kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in conditions or ())


def file_sd_groups(pods: Sequence[Any], address: str) -> list[dict[str, Any]]:
    """One file_sd target group per Running and Ready pod: `address`, labelled with the pod's namespace and
    name (what a PodMonitor's relabelling puts on its series)."""
    return [
        {"targets": [address], "labels": {"namespace": pod.metadata.namespace, "pod": pod.metadata.name}}
        for pod in pods
        if pod.status.phase == "Running" and _holds(_conditions(pod), "Ready") and not pod.metadata.deletion_timestamp
    ]


LIST_TIMEOUT_SECONDS = 5.0


class PodTargets:
    """Keeps `path` (a Prometheus file_sd file) listing the pods of `namespace` matching `selector`, every
    `interval` seconds, all scraped at `address`."""

    def __init__(
        self, kubeconfig: Path, namespace: str, selector: str, address: str, path: Path, interval: float = 0.5
    ) -> None:
        from kubernetes import client, config

        self.core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.namespace, self.selector, self.address, self.path = namespace, selector, address, path
        self.interval = interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-targets", daemon=True)
        self.write([])

    def write(self, groups: list[dict[str, Any]]) -> None:
        staged = self.path.with_suffix(".tmp")
        staged.write_text(json.dumps(groups))
        staged.replace(self.path)  # Prometheus never reads half a file

    def _run(self) -> None:
        written: list[dict[str, Any]] = []
        while not self._stopped.wait(self.interval):
            try:
                # Bounded: the client waits for ever by default, and a list that hangs would freeze the targets.
                pods = self.core.list_namespaced_pod(
                    self.namespace, label_selector=self.selector, _request_timeout=LIST_TIMEOUT_SECONDS
                ).items
            except Exception as error:  # a failed list keeps the last targets, as Prometheus' own discovery does
                log.warning("listing pods for Prometheus failed: %s", error)
                continue
            groups = file_sd_groups(pods, self.address)
            if groups != written:
                self.write(groups)
                written = groups

    def start(self) -> PodTargets:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join()

    def __enter__(self) -> PodTargets:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

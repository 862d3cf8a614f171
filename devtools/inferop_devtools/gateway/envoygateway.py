"""Envoy Gateway in its normal Kubernetes-provider mode, as a host process against the local control plane.

In a cluster it runs as a pod of the envoy-gateway-system namespace, with the `envoy-gateway` Secret (made by its
certgen Job) mounted at /certs, a path compiled into it. Here the same certgen runs as a command, the Secret is
written to disk and mounted at /certs in a private mount namespace, and KUBECONFIG replaces the in-cluster
service account. Everything else is as in a cluster: it watches GatewayClass/Gateway/HTTPRoute, writes their
status, creates the Envoy Deployment, Service and ConfigMap, and serves that Envoy over xDS on port 18000.

It must share a network namespace with the Envoy it serves (namespaces.enter_private_network), which decides two
settings of its configuration: its admin port moves off 19000 and its Prometheus port (19001) is disabled,
because Envoy's bootstrap takes both. It also binds *:8080 (controller-runtime's metrics, not configurable
through its config), *:8081 (health) and *:18000 (xDS), so backends in that namespace must use other ports.

The binaries and CRDs come from scripts/gateway.sh.
"""

from __future__ import annotations

import base64
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from inferop_devtools.cluster.controlplane import ClusterError, http_get
from inferop_devtools.cluster.tools import built, wait_established
from inferop_devtools.gateway.kubelet import WrappedDaemon
from inferop_devtools.gateway.namespaces import private_root_argv

GATEWAY_SCRIPT = "gateway.sh"
# Where Envoy Gateway runs and creates the Envoy of every Gateway (its default, ENVOY_GATEWAY_NAMESPACE).
NAMESPACE = "envoy-gateway-system"
CONTROLLER_NAME = "gateway.envoyproxy.io/gatewayclass-controller"
# The name its bootstrap gives Envoy for the xDS server: the envoy-gateway Service, as cluster DNS resolves it.
XDS_HOST = f"envoy-gateway.{NAMESPACE}.svc.cluster.local"
XDS_PORT = 18000
# Its controller-runtime health endpoints (":8081", compiled in).
HEALTH_PORT = 8081
# Envoy's admin port in the bootstrap Envoy Gateway renders (127.0.0.1 only): stats, clusters, config_dump.
ENVOY_ADMIN_PORT = 19000
# Envoy Gateway's own admin port, off Envoy's, which both default to.
ADMIN_PORT = 19100
# What it listens on in the namespace it shares with Envoy and the backends (all addresses): controller-runtime's
# metrics, health, xDS, its admin; Envoy takes 19000 (admin), 19001 (stats), 19003 (readiness) and its listeners.
RESERVED_PORTS = frozenset({8080, HEALTH_PORT, XDS_PORT, ENVOY_ADMIN_PORT, 19001, 19003, ADMIN_PORT})
# The Secret its certgen writes for its xDS server (ca.crt, tls.crt, tls.key), mounted at /certs.
SERVER_SECRET = "envoy-gateway"
CERTS_PATH = "/certs"


def gateway_binaries(build: bool = False) -> Path:
    """The directory holding envoy-gateway and envoy (its sibling crds/ holds the CRDs); with `build=False` a
    missing build raises at once instead of taking about 10 minutes."""
    return built(GATEWAY_SCRIPT, "Envoy Gateway and Envoy", build)


def crd_dirs(bin_dir: Path) -> list[Path]:
    """Gateway API's CRDs first (Envoy Gateway's refer to its types), then Envoy Gateway's."""
    return [bin_dir.parent / "crds" / "gateway-api", bin_dir.parent / "crds" / "envoy-gateway"]


def envoy_gateway_config() -> dict[str, Any]:
    """The EnvoyGateway configuration (its --config-path file): the chart's defaults, plus what sharing a network
    namespace with Envoy requires."""
    return {
        "apiVersion": "gateway.envoyproxy.io/v1alpha1",
        "kind": "EnvoyGateway",
        "gateway": {"controllerName": CONTROLLER_NAME},
        "provider": {
            "type": "Kubernetes",
            "kubernetes": {
                # One instance: a restarted one need not wait out its predecessor's lease.
                "leaderElection": {"disable": True},
                # Its webhook sets each Envoy pod's zone; no MutatingWebhookConfiguration points at it here.
                "proxyTopologyInjector": {"disabled": True},
            },
        },
        "logging": {"level": {"default": "info"}},
        "admin": {"address": {"host": "127.0.0.1", "port": ADMIN_PORT}},
        "telemetry": {"metrics": {"prometheus": {"disable": True}}},
    }


class EnvoyGateway:
    """Envoy Gateway on the control plane behind `kubeconfig`, its files in `workdir`.

    `install` applies the CRDs and makes the certificates (once per cluster); `start` runs the controller."""

    def __init__(self, kubeconfig: Path, workdir: Path, kubectl: Path, bin_dir: Path | None = None) -> None:
        self.kubeconfig, self.workdir, self.kubectl = kubeconfig, workdir, kubectl
        self.bin_dir = bin_dir or gateway_binaries()
        self.daemon: WrappedDaemon | None = None

    def _run(self, *argv: str, stdin: str | None = None) -> str:
        result = subprocess.run(
            ["env", f"KUBECONFIG={self.kubeconfig}", *argv], input=stdin, capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise ClusterError(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result.stdout

    def install(self, timeout: float = 60.0) -> None:
        """Apply the CRDs server-side (the EnvoyProxy CRD is too large for client-side apply's annotation), wait
        until they are served, create the namespace and the certificate Secrets (certgen, as its Helm Job)."""
        kubectl = str(self.kubectl)
        for directory in crd_dirs(self.bin_dir):
            self._run(kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(directory))
        # Gateway API's directory also holds a ValidatingAdmissionPolicy, which has no Established condition.
        wait_established(self.kubectl, self.kubeconfig, timeout=timeout)
        namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        self._run(kubectl, "apply", "--server-side", "-f", "-", stdin=yaml.safe_dump(namespace))
        # No MutatingWebhookConfiguration exists for it to patch (the topology injector is disabled).
        self._run(str(self.bin_dir / "envoy-gateway"), "certgen", "--disable-topology-injector")

    def _write_certs(self) -> Path:
        """The envoy-gateway Secret as the kubelet would mount it."""
        from kubernetes import client, config

        api = config.new_client_from_config(config_file=str(self.kubeconfig))
        secret = client.CoreV1Api(api).read_namespaced_secret(SERVER_SECRET, NAMESPACE)
        certs = self.workdir / "certs"
        certs.mkdir(parents=True, exist_ok=True)
        for key, value in (secret.data or {}).items():
            (certs / key).write_bytes(base64.b64decode(value))
        return certs

    def start(self, timeout: float = 60.0) -> EnvoyGateway:
        """Run the controller and wait until its cache has synced (/readyz)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        config_path = self.workdir / "envoy-gateway.yaml"
        config_path.write_text(yaml.safe_dump(envoy_gateway_config(), sort_keys=False))
        program = str(self.bin_dir / "envoy-gateway")
        root = self.workdir / "root"
        root.mkdir(exist_ok=True)
        command = ["env", f"KUBECONFIG={self.kubeconfig}", program, "server", f"--config-path={config_path}"]
        argv = private_root_argv(root, {CERTS_PATH: self._write_certs()}, command)
        self.daemon = WrappedDaemon(argv, self.workdir / "envoy-gateway.log", program)
        self.daemon.start()
        ready = f"http://127.0.0.1:{HEALTH_PORT}/readyz"
        self.daemon.wait(lambda: http_get(ready)[0] == 200, "envoy-gateway", timeout)
        return self

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None

    def __enter__(self) -> EnvoyGateway:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def cluster_dns_hosts(names: dict[str, str]) -> str:
    """An /etc/hosts standing in for cluster DNS (name -> address). Each name is written twice, with and without
    the final dot: Envoy Gateway's bootstrap names the xDS host as an absolute name ("...cluster.local."), and
    Envoy's c-ares resolver matches /etc/hosts entries literally, so without the dotted alias it falls through to
    DNS servers that cannot be reached from a private network namespace."""
    lines = ["127.0.0.1 localhost"]
    lines += [f"{address} {name} {name}." for name, address in names.items()]
    return "\n".join(lines) + "\n"

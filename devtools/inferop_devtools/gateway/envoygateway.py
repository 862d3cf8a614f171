"""Envoy Gateway on the local node, installed as its users install it: its CRDs applied server-side (the EnvoyProxy
CRD is too large for client-side apply's annotation), then its own Helm chart (scripts/gateway.sh keeps the
release's), its images the local ones (cluster.local_images). The chart's certgen Job makes the xDS certificates,
the controller runs as the envoy-gateway Deployment with its service account and RBAC, and the Envoy it deploys for
each Gateway is a pod of the node that reaches it through the envoy-gateway Service.

The binaries, the chart and the CRDs come from scripts/gateway.sh.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

from inferop_devtools.cluster.controlplane import ClusterError
from inferop_devtools.cluster.tools import built, wait_established
from inferop_operator.spec import ENVOY_GATEWAY_NAMESPACE

GATEWAY_SCRIPT = "gateway.sh"
# Where Envoy Gateway runs and creates the Envoy of every Gateway (its chart's namespace): Envoy Gateway's default.
NAMESPACE = ENVOY_GATEWAY_NAMESPACE
RELEASE = "eg"  # the Helm release, as Envoy Gateway's docs name it
CONTROLLER_NAME = "gateway.envoyproxy.io/gatewayclass-controller"


def gateway_binaries(build: bool = False) -> Path:
    """The directory holding envoy-gateway and envoy (its siblings crds/ and chart/ hold the CRDs and the chart);
    with `build=False` a missing build raises at once instead of taking about 10 minutes."""
    return built(GATEWAY_SCRIPT, "Envoy Gateway and Envoy", build)


def crd_dirs(bin_dir: Path) -> list[Path]:
    """Gateway API's CRDs first (Envoy Gateway's refer to its types), then Envoy Gateway's."""
    return [bin_dir.parent / "crds" / "gateway-api", bin_dir.parent / "crds" / "envoy-gateway"]


def chart_dir(bin_dir: Path) -> Path:
    return bin_dir.parent / "chart" / "gateway-helm"


def chart_values(image: str) -> dict[str, Any]:
    """Values over the chart's defaults: the local image (`repository:tag`, never pulled), the CRDs applied apart,
    no topology injector (its webhook only sets a zone label, and no zone exists on one node)."""
    repository, tag = image.rsplit(":", 1)
    return {
        "global": {"images": {"envoyGateway": {"image": "", "pullPolicy": ""}}},
        "deployment": {"envoyGateway": {"image": {"repository": repository, "tag": tag}, "imagePullPolicy": "Never"}},
        "crds": {"enabled": False},
        "topologyInjector": {"enabled": False},
    }


class EnvoyGateway:
    """Envoy Gateway on the control plane behind `kubeconfig`, with `tools` (kubectl and helm)."""

    def __init__(self, kubeconfig: Path, tools: Path, bin_dir: Path | None = None) -> None:
        self.kubeconfig, self.tools = kubeconfig, tools
        self.bin_dir = bin_dir or gateway_binaries()

    def _run(self, tool: str, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        argv = [str(self.tools / tool), f"--kubeconfig={self.kubeconfig}", *args]
        result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{tool} {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
        return result.stdout

    def install(self, image: str, timeout: float = 180.0) -> None:
        """Apply the CRDs and wait until they are served, then `helm install` the chart with `image` and wait
        until its controller is Ready (helm waits for the certgen Job first: a pre-install hook)."""
        for directory in crd_dirs(self.bin_dir):
            self._run("kubectl", "apply", "--server-side", "--force-conflicts", "-f", str(directory))
        # Gateway API's directory also holds a ValidatingAdmissionPolicy, which has no Established condition.
        wait_established(self.tools / "kubectl", self.kubeconfig, timeout=timeout)
        values = yaml.safe_dump(chart_values(image))
        args = ["install", RELEASE, str(chart_dir(self.bin_dir)), "--namespace", NAMESPACE, "--create-namespace",
                "--values", "-", "--wait", f"--timeout={int(timeout)}s"]  # fmt: skip
        self._run("helm", *args, stdin=values, timeout=timeout + 30)

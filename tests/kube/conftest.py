"""Fixtures for tests against the real control plane: one cluster and one operator per Kubernetes release, a
namespace per test. Every test of this tier runs on each release: 1.20, and the current one where it is built
(scripts/kube-current.sh).

On the current release kwok (scripts/kube-addons.sh) plays the kubelet of a fake node: the kube-scheduler places
Pods there and they become Running and Ready, or crash-loop when a test labels them so. 1.20 runs no scheduler:
its Pods stay Pending unless a test writes into their status what a kubelet would."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop.paths import repo_root
from inferop_devtools.cluster.addons import Kwok, addon_binaries
from inferop_devtools.cluster.controlplane import (
    KUBERNETES_RELEASES,
    ClusterError,
    ControlPlane,
    KubernetesRelease,
    kube_binaries,
)
from inferop_devtools.cluster.tools import kube_tools
from tests.conftest import wait_for

REPO = repo_root()
CRD_DIR = REPO / "charts" / "inferop" / "crds"
EXAMPLES = REPO / "operator" / "examples"
RESYNC_SECONDS = 2
# The HPA the operator writes, as each release serves it (asserted, not assumed): 1.20 serves autoscaling/v2beta2
# only (v2 came in 1.23), the current release v2 only (v2beta2 went in 1.26).
AUTOSCALING = {
    "1.20": "horizontalpodautoscalers.v2beta2.autoscaling",
    "1.37": "horizontalpodautoscalers.v2.autoscaling",
}
# Likewise the PodDisruptionBudget: policy/v1beta1 on 1.20 (v1 came in 1.21), policy/v1 on the current release.
DISRUPTION_BUDGET = {"1.20": "poddisruptionbudgets.v1beta1.policy", "1.37": "poddisruptionbudgets.v1.policy"}
# What status.threads says for operator/examples/conv-net.yaml: 2 CPUs shared by 2 instances.
CONV_NET_THREADS = {
    "cpus": 2,
    "cpuSource": "limit",
    "instances": 2,
    "intraOp": 1,
    "interOp": 1,
    "summary": "2x(1+1)/2cpu",
}


# Figures a test measured on the way (e.g. how long a scale took), printed at the end of the run: a print would go
# to the operator's runner, which captures the standard streams while it runs.
MEASURED: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("measured")
        for line in MEASURED:
            terminalreporter.write_line(line)


@pytest.fixture()
def measured(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a figure for the run's summary, under the test's id."""
    return lambda line: MEASURED.append(f"{request.node.nodeid.split('::')[-1]}: {line}")


class Kubectl:
    """The real kubectl against the test cluster; JSON in, JSON out."""

    def __init__(self, kubeconfig: Path, tools: Path, binary: Path | None = None):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
        self.binary = str(binary or tools / "kubectl")

    def run(self, *args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, input=stdin, timeout=60
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        return dict(json.loads(result.stdout))

    def apply(self, namespace: str, *paths: Path) -> subprocess.CompletedProcess[str]:
        args = ["apply", "-n", namespace]
        for path in paths:
            args += ["-f", str(path)]
        return self.run(*args, check=False)


@pytest.fixture(scope="session", params=list(KUBERNETES_RELEASES.values()), ids=lambda release: release.name)
def kubernetes(request: pytest.FixtureRequest) -> KubernetesRelease:
    """The release under test. `make test` builds every release first (make tools), so one that is not built fails
    here, with the command that builds it, rather than passing the run as a skip."""
    release: KubernetesRelease = request.param
    try:
        kube_binaries(build=False, release=release)
    except ClusterError as missing:
        pytest.fail(f"Kubernetes {release.name} is not built: {missing}")
    return release


@pytest.fixture(scope="session")
def control_plane(kubernetes: KubernetesRelease, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp(f"control-plane-{kubernetes.name}"), release=kubernetes)
    try:
        plane.up()
    except Exception as error:  # a missing binary says how to get it
        plane.down()
        pytest.fail(f"control plane did not start: {error}")
    yield plane
    plane.down()


@pytest.fixture(scope="session")
def kwok(
    control_plane: ControlPlane, kubernetes: KubernetesRelease, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Kwok | None]:
    """kwok and one fake node where the release schedules Pods; None on 1.20. Started before any test touches the
    cluster (`kubectl` needs it), so every test of a release sees the same nodes."""
    if not runs_pods(kubernetes):
        yield None
        return
    try:
        bin_dir = addon_binaries()
    except ClusterError as missing:
        pytest.fail(f"Kubernetes {kubernetes.name} runs Pods on kwok's fake nodes: {missing}")
    with Kwok(control_plane.kubeconfig, tmp_path_factory.mktemp(f"kwok-{kubernetes.name}"), bin_dir) as kubelet:
        kubelet.add_node("kwok-node-0")
        yield kubelet


def runs_pods(kubernetes: KubernetesRelease) -> bool:
    """Whether Pods run on this release's test cluster (kwok), or stay Pending (1.20)."""
    return "kube-scheduler" in kubernetes.components


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane, kubernetes: KubernetesRelease, kwok: Kwok | None) -> Kubectl:
    # kubectl supports a server one minor version away: the current release brings its own, 1.20 takes the one
    # from the registries (1.33, which still talks to it).
    own = kube_binaries(build=False, release=kubernetes) / "kubectl"
    tool = Kubectl(control_plane.kubeconfig, kube_tools(), own if own.exists() else None)
    tool.run("apply", *kubernetes.kubectl_crd_flags, "-f", str(CRD_DIR))
    wait_for(
        lambda: '"Established"' in tool.run("get", "crd/inferenceservices.inferop.dev", "-o", "json").stdout,
        what="the CRD to be established",
    )
    return tool


class OperatorRunner:
    """The operator under kopf's test runner, watching all namespaces; restartable."""

    ARGS = ("run", "--standalone", "--all-namespaces", "-m", "inferop_operator.handlers")

    def __init__(self) -> None:
        from kopf.testing import KopfRunner

        self._factory = lambda: KopfRunner(list(self.ARGS), timeout=60)
        self.runner: Any = None

    def start(self) -> None:
        self.runner = self._factory()
        self.runner.__enter__()

    def stop(self) -> None:
        self.runner.__exit__(None, None, None)
        assert self.runner.exception is None, self.runner.exception

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, control_plane: ControlPlane) -> Iterator[OperatorRunner]:
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig)
    os.environ["INFEROP_RESYNC_SECONDS"] = str(RESYNC_SECONDS)  # read when the handlers are imported
    runner = OperatorRunner()
    runner.start()
    yield runner
    runner.stop()


GATEWAY_API = "gateway.networking.k8s.io"


@pytest.fixture(scope="session")
def gateway_api(kubectl: Kubectl, kubernetes: KubernetesRelease) -> None:
    """Gateway API's standard CRDs on the current release (scripts/gateway.sh provides them); 1.20 has none, and
    Gateway API 1.6 needs 1.29 or newer (its CEL rules): there a rollout splits by replicas."""
    if not runs_pods(kubernetes):
        pytest.skip("Gateway API 1.6 needs Kubernetes 1.29 or newer; on 1.20 a rollout splits by replicas")
    from inferop_devtools.gateway.envoygateway import crd_dirs, gateway_binaries

    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_dirs(gateway_binaries())[0]))
    kubectl.run("wait", "--for=condition=Established", "--timeout=60s", f"crd/httproutes.{GATEWAY_API}")


@pytest.fixture()
def namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def condition(service: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((service or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), None)


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


def manifest(name: str, **spec: Any) -> str:
    """An InferenceService of the small example network, with `spec` fields laid over it."""
    base = yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())
    base["metadata"]["name"] = name
    base["spec"].update(spec)
    return yaml.safe_dump(base)


def apply_text(kubectl: Kubectl, namespace: str, text: str) -> None:
    kubectl.run("apply", "-n", namespace, "-f", "-", stdin=text)

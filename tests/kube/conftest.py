"""Fixtures for tests against the real control plane: one cluster and one operator per Kubernetes release, a
namespace per test. Every test of this tier runs on each release: 1.20, and the current one where it is built
(scripts/kube-current.sh).

On the current release kwok (scripts/kube-addons.sh) plays the kubelet of a fake node: the kube-scheduler places
Pods there and they become Running and Ready, or crash-loop when a test labels them so. 1.20 runs no scheduler:
its Pods stay Pending unless a test writes into their status what a kubelet would."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferop_devtools.cluster.addons import Kwok, addon_binaries
from inferop_devtools.cluster.controlplane import (
    KUBERNETES_RELEASES,
    ClusterError,
    ControlPlane,
    KubernetesRelease,
    kube_binaries,
    process_running,
)
from inferop_devtools.cluster.tools import kube_tools, wait_established
from inferop_operator.settings import OperatorSettings
from tests.kube.helpers import GATEWAY_API, RESYNC_SECONDS, Kubectl, OperatorRunner, install_crd, runs_pods


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


@pytest.fixture(scope="session")
def kubectl(control_plane: ControlPlane, kubernetes: KubernetesRelease, kwok: Kwok | None) -> Kubectl:
    # kubectl supports a server one minor version away: the current release brings its own, 1.20 takes the one
    # from the registries (1.33, which still talks to it).
    own = kube_binaries(build=False, release=kubernetes) / "kubectl"
    tool = Kubectl(control_plane.kubeconfig, kube_tools(), own if own.exists() else None)
    install_crd(tool, kubernetes)
    return tool


@pytest.fixture(scope="session")
def operator(kubectl: Kubectl, control_plane: ControlPlane) -> Iterator[OperatorRunner]:
    os.environ["KUBECONFIG"] = str(control_plane.kubeconfig)
    runner = OperatorRunner(OperatorSettings(resync_seconds=RESYNC_SECONDS))
    runner.start()
    yield runner
    runner.stop()


@pytest.fixture(scope="session")
def gateway_api(kubectl: Kubectl, kubernetes: KubernetesRelease) -> None:
    """Gateway API's standard CRDs on the current release (scripts/gateway.sh provides them); 1.20 has none, and
    Gateway API 1.6 needs 1.29 or newer (its CEL rules): there a rollout splits by replicas."""
    if not runs_pods(kubernetes):
        pytest.skip("Gateway API 1.6 needs Kubernetes 1.29 or newer; on 1.20 a rollout splits by replicas")
    from inferop_devtools.gateway.envoygateway import crd_dirs, gateway_binaries

    kubectl.run("apply", "--server-side", "--force-conflicts", "-f", str(crd_dirs(gateway_binaries())[0]))
    wait_established(Path(kubectl.binary), Path(kubectl.env["KUBECONFIG"]), f"httproutes.{GATEWAY_API}")


@pytest.fixture()
def own_plane(tmp_path: Path) -> Iterator[ControlPlane]:
    """A control plane of the default release for one test alone, which may kill or freeze its apiserver."""
    try:  # `make test` builds it first (make tools): a missing or broken build fails, it is no reason to skip
        bin_dir = kube_binaries(build=False)
    except ClusterError as error:
        pytest.fail(f"Kubernetes is not built: {error}")
    with ControlPlane(tmp_path / "cluster", bin_dir=bin_dir) as control_plane:
        yield control_plane
        apiserver = ((control_plane.state() or {}).get("processes") or {}).get("kube-apiserver")  # none: stopped
        if apiserver and process_running(apiserver["pid"], apiserver["executable"]):
            os.kill(apiserver["pid"], signal.SIGCONT)  # a frozen apiserver must run again to stop


@pytest.fixture()
def namespace(kubectl: Kubectl) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    yield name
    kubectl.run("delete", "namespace", name, "--wait=false", check=False)

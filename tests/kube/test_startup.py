"""`inferop operator` serves InferenceServices however its start and the CRD's installation interleave: kopf looks up
what it serves once, when it starts, and with one namespace watched it never looks again.

Each test runs its own control plane, whose CRD it installs (or not) when it chooses.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferop_devtools.cluster.controlplane import ControlPlane
from inferop_devtools.cluster.tools import kube_tools
from tests.helpers import wait_for
from tests.kube.helpers import EXAMPLES, Kubectl, install_crd, operator_process, wait_reconciled

pytestmark = pytest.mark.integration

NAMESPACE = "models"


@pytest.fixture()
def stopped_at_the_end(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_an_operator_started_before_its_crd_serves_it_once_installed(
    own_plane: ControlPlane, tmp_path: Path, stopped_at_the_end: list[subprocess.Popen[bytes]]
) -> None:
    kubectl = Kubectl(own_plane.kubeconfig, kube_tools())
    kubectl.run("create", "namespace", NAMESPACE)
    log = tmp_path / "operator.log"
    process = operator_process(own_plane.kubeconfig, log, "--namespace", NAMESPACE)
    stopped_at_the_end.append(process)
    # The operator up and looking before the CRD comes: its one line while it waits.
    wait_for(
        lambda: process.poll() is not None or "waiting up to" in log.read_text(),
        timeout=60,
        what="the operator to wait for its CRD",
    )
    assert process.poll() is None, log.read_text()[-3000:]
    assert log.read_text().count("waiting up to") == 1

    install_crd(kubectl, own_plane.release)
    assert kubectl.apply(NAMESPACE, EXAMPLES / "conv-net.yaml").returncode == 0

    wait_reconciled(kubectl, process, log, NAMESPACE, "conv-net")
    # kopf's account of its own start is held back: what the operator waits for is what it says.
    assert "Initial authentication" not in log.read_text() and "Activity '" not in log.read_text(), log.read_text()


def test_an_operator_whose_crd_never_comes_exits_saying_so(
    own_plane: ControlPlane, tmp_path: Path, stopped_at_the_end: list[subprocess.Popen[bytes]]
) -> None:
    log = tmp_path / "operator.log"
    process = operator_process(own_plane.kubeconfig, log, "--namespace", NAMESPACE, crd_wait_seconds="2")
    stopped_at_the_end.append(process)

    code = process.wait(timeout=60)

    assert code != 0, log.read_text()[-3000:]
    assert "does not serve inferenceservices" in log.read_text() and "install the CRD" in log.read_text()


def test_an_operator_whose_control_plane_goes_away_stops_with_one_line(
    own_plane: ControlPlane, tmp_path: Path, stopped_at_the_end: list[subprocess.Popen[bytes]]
) -> None:
    kubectl = Kubectl(own_plane.kubeconfig, kube_tools())
    install_crd(kubectl, own_plane.release)
    kubectl.run("create", "namespace", NAMESPACE)
    log = tmp_path / "operator.log"
    process = operator_process(own_plane.kubeconfig, log, "--namespace", NAMESPACE, api_lost_seconds="10")
    stopped_at_the_end.append(process)
    assert kubectl.apply(NAMESPACE, EXAMPLES / "conv-net.yaml").returncode == 0
    wait_reconciled(kubectl, process, log, NAMESPACE, "conv-net")
    before = len(log.read_text().splitlines())

    own_plane.down()
    code = process.wait(timeout=60)  # 10 s without an answer, then kopf's stop (at most 4 s)

    after = log.read_text().splitlines()[before:]
    assert code == 1, "\n".join(after)
    assert sum("has not answered for 10 s: stopping" in line for line in after) == 1, "\n".join(after)
    # kopf's retries of its watches, one line per 30 s of them, not one per attempt.
    assert sum("will retry" in line for line in after) <= 2, "\n".join(after)

"""`inferop operator` stops within STOP_BOUND_SECONDS of SIGTERM whatever the API server does: a pod gets
terminationGracePeriodSeconds, then SIGKILL.

Each test runs its own control plane, because it kills or freezes that apiserver under a running operator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferop_devtools.cluster.controlplane import ControlPlane
from inferop_devtools.cluster.tools import kube_tools
from inferop_operator.cli import STOP_BOUND_SECONDS
from tests.kube.helpers import EXAMPLES, Kubectl, install_crd, operator_process, wait_reconciled

pytestmark = pytest.mark.integration

NAMESPACE = "models"
RESYNC_SECONDS = 1  # a resync starts every second, so one is waiting on the apiserver when it stops answering


@pytest.fixture()
def running_operator(own_plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`inferop operator` reconciling the conv-net example on `own_plane`, with its log."""
    plane = own_plane
    kubectl = Kubectl(plane.kubeconfig, kube_tools())
    install_crd(kubectl, plane.release)
    kubectl.run("create", "namespace", NAMESPACE)
    assert kubectl.apply(NAMESPACE, EXAMPLES / "conv-net.yaml").returncode == 0
    log = tmp_path / "operator.log"
    process = operator_process(plane.kubeconfig, log, "--all-namespaces", resync_seconds=str(RESYNC_SECONDS))
    try:
        wait_reconciled(kubectl, process, log, NAMESPACE, "conv-net")
        yield process, log
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def stop(process: subprocess.Popen[bytes], log: Path) -> float:
    """SIGTERM, then seconds until the process is gone (killed, failing the test, past twice the bound)."""
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=STOP_BOUND_SECONDS * 2)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"still running {STOP_BOUND_SECONDS * 2:g} s after SIGTERM:\n{log.read_text()[-3000:]}")
    return time.monotonic() - started


@pytest.mark.parametrize(
    ("apiserver", "signum"),
    [("killed", signal.SIGKILL), ("frozen", signal.SIGSTOP)],
    ids=["apiserver killed", "apiserver frozen"],
)
def test_sigterm_stops_the_operator_in_time_whatever_the_apiserver_does(
    own_plane: ControlPlane,
    running_operator: tuple[subprocess.Popen[bytes], Path],
    apiserver: str,
    signum: signal.Signals,
) -> None:
    process, log = running_operator
    pid = own_plane.pids()["kube-apiserver"]
    os.kill(pid, signum)  # killed: connections refused; frozen: connections accepted and never answered
    # Not a wait for a condition: time for a resync to start against the server that is gone or hangs.
    time.sleep(RESYNC_SECONDS * 2)
    assert process.poll() is None, log.read_text()[-3000:]

    elapsed = stop(process, log)

    assert elapsed < STOP_BOUND_SECONDS, f"{elapsed:.1f} s after SIGTERM with the apiserver {apiserver}"
    assert process.returncode == 0, log.read_text()[-3000:]
    assert "SIGTERM received: stopping" in log.read_text()

"""`inferop operator` stops within STOP_BOUND_SECONDS of SIGTERM whatever the API server does: a pod gets
terminationGracePeriodSeconds, then SIGKILL.

Each test runs its own control plane, because it kills or freezes that apiserver under a running operator.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from inferop_devtools.cluster.controlplane import ClusterError, ControlPlane, kube_binaries, process_running
from inferop_devtools.cluster.tools import kube_tools
from inferop_operator.cli import STOP_BOUND_SECONDS
from tests.helpers import wait_for
from tests.kube.helpers import CRD_DIR, EXAMPLES, Kubectl

pytestmark = pytest.mark.integration

NAMESPACE = "models"
RESYNC_SECONDS = 1  # a resync starts every second, so one is waiting on the apiserver when it stops answering


@pytest.fixture()
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    try:  # `make test` builds it first (make tools): a missing or broken build fails, it is no reason to skip
        bin_dir = kube_binaries(build=False)
    except ClusterError as error:
        pytest.fail(f"Kubernetes is not built: {error}")
    with ControlPlane(tmp_path / "cluster", bin_dir=bin_dir) as control_plane:
        yield control_plane
        apiserver = (control_plane.state() or {})["processes"]["kube-apiserver"]
        if process_running(apiserver["pid"], apiserver["executable"]):
            os.kill(apiserver["pid"], signal.SIGCONT)  # a frozen apiserver must run again to stop


@pytest.fixture()
def running_operator(plane: ControlPlane, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`inferop operator` reconciling the conv-net example on `plane`, with its log."""
    kubectl = Kubectl(plane.kubeconfig, kube_tools())
    kubectl.run("apply", *plane.release.kubectl_crd_flags, "-f", str(CRD_DIR))
    wait_for(
        lambda: '"Established"' in kubectl.run("get", "crd/inferenceservices.inferop.dev", "-o", "json").stdout,
        what="the CRD to be established",
    )
    kubectl.run("create", "namespace", NAMESPACE)
    assert kubectl.apply(NAMESPACE, EXAMPLES / "conv-net.yaml").returncode == 0
    log = tmp_path / "operator.log"
    env = {
        **os.environ,
        "KUBECONFIG": str(plane.kubeconfig),
        "INFEROP_RESYNC_SECONDS": str(RESYNC_SECONDS),
        "INFEROP_LOG_FORMAT": "plain",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "inferop.cli", "operator", "--all-namespaces"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(
            lambda: (
                process.poll() is not None
                or (kubectl.get("infsvc", "conv-net", NAMESPACE) or {}).get("status", {}).get("threads")
            ),
            timeout=60,
            what="the operator to reconcile conv-net",
        )
        assert process.poll() is None, log.read_text()[-3000:]
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
    plane: ControlPlane, running_operator: tuple[subprocess.Popen[bytes], Path], apiserver: str, signum: signal.Signals
) -> None:
    process, log = running_operator
    pid = plane.pids()["kube-apiserver"]
    os.kill(pid, signum)  # killed: connections refused; frozen: connections accepted and never answered
    # Not a wait for a condition: time for a resync to start against the server that is gone or hangs.
    time.sleep(RESYNC_SECONDS * 2)
    assert process.poll() is None, log.read_text()[-3000:]

    elapsed = stop(process, log)

    assert elapsed < STOP_BOUND_SECONDS, f"{elapsed:.1f} s after SIGTERM with the apiserver {apiserver}"
    assert process.returncode == 0, log.read_text()[-3000:]
    assert "SIGTERM received: stopping" in log.read_text()

"""Fixtures of the tests on a real node: one `inferop cluster up` per test module (a module may take it down), its
`default` namespace emptied after each test, and the README's operator run from the shell with `up`'s environment.
The node runs on the current release only: 1.20's build has neither a scheduler nor a kubelet."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferop.paths import repo_root
from inferop_devtools.cluster.controlplane import KUBERNETES_1_37, ClusterError, Layout, kube_binaries
from inferop_devtools.cluster.images import Images
from inferop_devtools.cluster.local_images import busybox_image, images_cache
from inferop_devtools.cluster.node import CTR, NODE_SCRIPT, Node
from inferop_devtools.cluster.tools import built
from tests.kube.helpers import RESYNC_SECONDS
from tests.node.helpers import INFEROP, Cluster, cli, traces


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, str, dict[str, Any]]]:
    """`inferop cluster up` with a real node, busybox imported into its containerd; the host's traces before."""
    try:
        kube_binaries(build=False, release=KUBERNETES_1_37)
        files = built(NODE_SCRIPT, "the node's packages and files")
    except ClusterError as missing:  # make tools provides both before make test
        pytest.fail(str(missing))
    state_dir = tmp_path_factory.mktemp("node") / "cluster"
    before = traces(state_dir)
    up = cli("up", "--state-dir", str(state_dir))
    try:
        assert up.returncode == 0, up.stderr
        node = Node(Layout(state_dir))
        busybox = Images(images_cache(), str(CTR)).ensure(node.containerd_socket, [busybox_image(files)])
        yield Cluster(state_dir, up.stdout), busybox["busybox"], before
    finally:
        cli("down", "--state-dir", str(state_dir))


@pytest.fixture
def busybox(cluster: tuple[Cluster, str, dict[str, Any]]) -> str:
    return cluster[1]


@pytest.fixture
def kube(cluster: tuple[Cluster, str, dict[str, Any]]) -> Iterator[Cluster]:
    """The cluster, its `default` namespace emptied of the test's pods and services afterwards: a pod left
    behind holds CPU that the next test's pods may need."""
    yield cluster[0]
    cluster[0].run("delete", "pods,services", "--field-selector=metadata.name!=kubernetes")


@pytest.fixture
def operator(kube: Cluster, tmp_path: Path) -> Iterator[Path]:
    """The README's operator, for one test (the chart's test runs its own): the CRD applied, `inferop operator` in
    the background with `up`'s environment (the local Triton image its default, the local operator image its
    fetch image), resyncing every few seconds; its log's path."""
    kube.run("apply", "-f", str(repo_root() / "charts" / "inferop" / "crds"))
    log_path = tmp_path / "operator.log"
    env = {**kube.env, "INFEROP_RESYNC_SECONDS": str(RESYNC_SECONDS)}
    with log_path.open("wb") as log:
        process = subprocess.Popen([*INFEROP, "operator"], env=env, stdout=log, stderr=subprocess.STDOUT)
    yield log_path
    process.terminate()
    process.wait(timeout=30)

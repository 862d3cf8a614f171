"""The local control plane: pure builders (fast), then a real control plane of each release that is built."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from inferop_devtools.cluster.controlplane import (
    FRONT_PROXY_CLIENT,
    KUBELET_CLIENT,
    KUBERNETES_1_20,
    KUBERNETES_1_37,
    KUBERNETES_RELEASES,
    KUBERNETES_SERVICE_IP,
    SERVICE_CIDR,
    ClusterError,
    ControlPlane,
    KubernetesRelease,
    Layout,
    Ports,
    apiserver_command,
    commands,
    controller_manager_command,
    etcd_command,
    free_ports,
    kube_binaries,
    kubeconfig,
    openssl_commands,
    openssl_extensions,
    process_running,
    scheduler_command,
)
from inferop_devtools.cluster.node import NODE_NAME, Node
from inferop_devtools.cluster.tools import kube_tools, not_established
from tests.helpers import wait_for

BIN = Path("/opt/kube/bin")
LAYOUT = Layout(Path("/state"))
PORTS = Ports(etcd_client=2379, etcd_peer=2380, apiserver=6443, controller_manager=10257, scheduler=10259)
RELEASES = list(KUBERNETES_RELEASES.values())
each_release = pytest.mark.parametrize("release", RELEASES, ids=lambda release: release.name)


def flags(argv: list[str]) -> dict[str, str]:
    return dict(arg.removeprefix("--").split("=", 1) for arg in argv[1:])


class TestEtcdCommand:
    @each_release
    def test_listens_on_loopback_with_data_in_the_state_dir(self, release: KubernetesRelease) -> None:
        argv = etcd_command(release, BIN, LAYOUT, PORTS)
        assert argv[0] == "/opt/kube/bin/etcd"
        assert flags(argv)["listen-client-urls"] == "http://127.0.0.1:2379"
        assert flags(argv)["listen-peer-urls"] == "http://127.0.0.1:2380"
        assert flags(argv)["data-dir"] == "/state/etcd"


class TestApiserverCommand:
    @pytest.mark.parametrize(
        ("flag", "value"),
        [
            ("etcd-servers", "http://127.0.0.1:2379"),
            ("secure-port", "6443"),
            ("bind-address", "127.0.0.1"),
            ("advertise-address", "127.0.0.1"),
            ("authorization-mode", "Node,RBAC"),
            ("enable-admission-plugins", "NodeRestriction"),
            ("kubelet-preferred-address-types", "InternalIP"),
            ("kubelet-certificate-authority", "/state/pki/ca.pem"),
            ("endpoint-reconciler-type", "none"),
            ("client-ca-file", "/state/pki/ca.pem"),
            ("tls-cert-file", "/state/pki/apiserver.pem"),
            ("tls-private-key-file", "/state/pki/apiserver-key.pem"),
            ("service-account-key-file", "/state/pki/sa-pub.pem"),
            ("service-account-signing-key-file", "/state/pki/sa-key.pem"),
            ("service-cluster-ip-range", "10.96.0.0/12"),
            ("allow-privileged", "true"),
        ],
    )
    @each_release
    def test_flag(self, release: KubernetesRelease, flag: str, value: str) -> None:
        assert flags(apiserver_command(release, BIN, LAYOUT, PORTS))[flag] == value

    @each_release
    def test_serves_the_aggregation_layer_with_a_front_proxy_ca_of_its_own(self, release: KubernetesRelease) -> None:
        """What a metrics adapter needs: the apiserver proxies custom.metrics.k8s.io to it with the front proxy's
        client certificate, which the cluster CA did not sign (a cluster client must not pass as the proxy)."""
        apiserver = flags(apiserver_command(release, BIN, LAYOUT, PORTS))
        assert apiserver["requestheader-client-ca-file"] == "/state/pki/front-proxy-ca.pem"
        assert apiserver["requestheader-client-ca-file"] != apiserver["client-ca-file"]
        assert apiserver["requestheader-allowed-names"] == FRONT_PROXY_CLIENT
        assert apiserver["proxy-client-cert-file"] == f"/state/pki/{FRONT_PROXY_CLIENT}.pem"
        signing = [argv for argv in openssl_commands(LAYOUT) if argv[-1] == apiserver["proxy-client-cert-file"]]
        assert len(signing) == 1 and "/state/pki/front-proxy-ca.pem" in signing[0]
        assert any(f"/CN={FRONT_PROXY_CLIENT}" in argv for argv in openssl_commands(LAYOUT))

    @each_release
    def test_listens_where_a_node_reaches_it_and_advertises_that_address(self, release: KubernetesRelease) -> None:
        """With a node, pods reach the apiserver through the `kubernetes` Service, whose endpoint is the address it
        advertises: a loopback address is refused there, so it listens on the node's link and keeps the endpoint."""
        ports = Ports(**{**PORTS.__dict__, "address": "10.89.0.1"})
        apiserver = flags(apiserver_command(release, BIN, LAYOUT, ports))
        assert (apiserver["bind-address"], apiserver["advertise-address"]) == ("10.89.0.1", "10.89.0.1")
        assert "endpoint-reconciler-type" not in apiserver
        assert ports.server == "https://10.89.0.1:6443"
        assert "IP:10.89.0.1" in openssl_extensions("10.89.0.1")
        assert "IP:10.89.0.1" not in openssl_extensions()

    @each_release
    def test_calls_kubelets_as_a_user_who_may_read_logs_and_exec(self, release: KubernetesRelease) -> None:
        apiserver = flags(apiserver_command(release, BIN, LAYOUT, PORTS))
        (signing,) = [argv for argv in openssl_commands(LAYOUT) if argv[-1] == apiserver["kubelet-client-certificate"]]
        subject = next(argv for argv in openssl_commands(LAYOUT) if f"{LAYOUT.pki}/{KUBELET_CLIENT}.csr" in argv)
        assert "/O=system:masters/CN=apiserver-kubelet-client" in subject
        assert "/state/pki/ca.pem" in signing

    @each_release
    def test_has_a_service_account_issuer(self, release: KubernetesRelease) -> None:
        assert flags(apiserver_command(release, BIN, LAYOUT, PORTS))["service-account-issuer"].startswith("https://")


class TestControllerManagerCommand:
    @pytest.mark.parametrize(
        ("flag", "value"),
        [
            ("kubeconfig", "/state/kubeconfig"),
            ("leader-elect", "false"),
            ("controllers", "*,-csrsigning,-nodeipam"),
            ("service-account-private-key-file", "/state/pki/sa-key.pem"),
            ("root-ca-file", "/state/pki/ca.pem"),
            ("use-service-account-credentials", "true"),
            ("bind-address", "127.0.0.1"),
            ("secure-port", "10257"),
        ],
    )
    @each_release
    def test_flag(self, release: KubernetesRelease, flag: str, value: str) -> None:
        assert flags(controller_manager_command(release, BIN, LAYOUT, PORTS))[flag] == value


class TestSchedulerCommand:
    @pytest.mark.parametrize(
        ("flag", "value"),
        [
            ("kubeconfig", "/state/scheduler.kubeconfig"),
            ("leader-elect", "false"),
            ("bind-address", "127.0.0.1"),
            ("secure-port", "10259"),
            ("cert-dir", "/state/scheduler-certs"),
        ],
    )
    def test_flag(self, flag: str, value: str) -> None:
        argv = scheduler_command(KUBERNETES_1_37, BIN, LAYOUT, PORTS)
        assert argv[0] == "/opt/kube/bin/kube-scheduler"
        assert flags(argv)[flag] == value


class TestReleaseDifferences:
    def test_1_20_closes_its_plain_http_ports(self) -> None:
        assert flags(apiserver_command(KUBERNETES_1_20, BIN, LAYOUT, PORTS))["insecure-port"] == "0"
        assert flags(controller_manager_command(KUBERNETES_1_20, BIN, LAYOUT, PORTS))["port"] == "0"

    def test_1_37_passes_none_of_the_flags_removed_in_1_24(self) -> None:
        """kube-apiserver 1.37 refuses to start on an unknown flag."""
        assert "insecure-port" not in flags(apiserver_command(KUBERNETES_1_37, BIN, LAYOUT, PORTS))
        assert "port" not in flags(controller_manager_command(KUBERNETES_1_37, BIN, LAYOUT, PORTS))

    @pytest.mark.parametrize(
        ("release", "components"),
        [
            (KUBERNETES_1_20, ["etcd", "kube-apiserver", "kube-controller-manager"]),
            (KUBERNETES_1_37, ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"]),
        ],
        ids=["1.20", "1.37"],
    )
    def test_components_in_start_order(self, release: KubernetesRelease, components: list[str]) -> None:
        argvs = commands(release, BIN, LAYOUT, PORTS)
        assert list(argvs) == components
        assert [Path(argv[0]).name for argv in argvs.values()] == components


class TestKubeconfig:
    def test_points_at_the_server_with_admin_certificates(self) -> None:
        config = kubeconfig("https://127.0.0.1:6443", LAYOUT)
        (cluster,) = config["clusters"]
        (user,) = config["users"]
        (context,) = config["contexts"]
        assert cluster["cluster"] == {
            "server": "https://127.0.0.1:6443",
            "certificate-authority": "/state/pki/ca.pem",
        }
        assert user["user"] == {
            "client-certificate": "/state/pki/admin.pem",
            "client-key": "/state/pki/admin-key.pem",
        }
        assert context["context"] == {"cluster": cluster["name"], "user": user["name"]}
        assert config["current-context"] == context["name"]

    def test_the_scheduler_signs_in_with_its_own_certificate(self) -> None:
        (user,) = kubeconfig("https://127.0.0.1:6443", LAYOUT, user="scheduler")["users"]
        assert user["user"] == {
            "client-certificate": "/state/pki/scheduler.pem",
            "client-key": "/state/pki/scheduler-key.pem",
        }


class TestHelpers:
    def test_serving_certificate_covers_loopback_and_the_service_names(self) -> None:
        extensions = openssl_extensions()
        for name in ("IP:127.0.0.1", "DNS:localhost", "DNS:kubernetes.default.svc"):
            assert name in extensions

    def test_serving_certificate_names_the_kubernetes_service_ip_of_the_range(self) -> None:
        assert KUBERNETES_SERVICE_IP == "10.96.0.1"
        assert f"IP:{KUBERNETES_SERVICE_IP}," in openssl_extensions()

    def test_free_ports_are_distinct(self) -> None:
        ports = free_ports(8)
        assert len(set(ports)) == 8
        assert all(1024 <= port <= 65535 for port in ports)


# ------------------------------------------------------------------------------------------ integration


@pytest.fixture(scope="module", params=RELEASES, ids=lambda release: release.name)
def release(request: pytest.FixtureRequest) -> KubernetesRelease:
    """Every integration test runs on each release whose binaries are built."""
    chosen: KubernetesRelease = request.param
    return chosen


@pytest.fixture(scope="module")
def bin_dir(release: KubernetesRelease) -> Path:
    # `make test` builds every release first (make tools): a missing or broken build is a failure here, not a skip.
    try:
        return kube_binaries(build=False, release=release)
    except ClusterError as error:
        pytest.fail(f"Kubernetes {release.name} is not built: {error}")


@pytest.fixture(scope="module")
def cluster(
    release: KubernetesRelease, bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ControlPlane]:
    # A failed start stops what it started; leaving the block, even on error, stops the rest.
    with ControlPlane(tmp_path_factory.mktemp("cluster"), bin_dir=bin_dir, release=release) as control_plane:
        yield control_plane


@pytest.fixture
def api(cluster: ControlPlane) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(cluster.kubeconfig))


@pytest.mark.integration
def test_version_is_that_of_the_binaries(cluster: ControlPlane, bin_dir: Path, api: client.ApiClient) -> None:
    built = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"], capture_output=True, text=True, check=True
    ).stdout.split()[-1]
    assert client.VersionApi(api).get_code().git_version == built == cluster.version()["gitVersion"]


@pytest.mark.integration
def test_controller_manager_creates_a_replicaset_for_a_deployment(api: client.ApiClient) -> None:
    # Any: the bodies below are plain dicts, which the client accepts but its annotations do not.
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    namespace = "test-deployment"
    core.create_namespace({"metadata": {"name": namespace}})
    labels = {"app": "web"}
    deployment = apps.create_namespaced_deployment(
        namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]},
                },
            },
        },
    )

    def owned_replicasets() -> list[Any]:
        items = apps.list_namespaced_replica_set(namespace).items
        uid = deployment.metadata.uid
        return [rs for rs in items if any(owner.uid == uid for owner in rs.metadata.owner_references or [])]

    (replicaset,) = wait_for(owned_replicasets, 30, "a ReplicaSet owned by the Deployment")
    assert replicaset.spec.replicas == 2
    # The ReplicaSet controller goes on to create the Pods (Pending: there is no kubelet).
    pods = wait_for(lambda: core.list_namespaced_pod(namespace).items, 30, "Pods of the ReplicaSet")
    assert {pod.status.phase for pod in pods} == {"Pending"}


@pytest.mark.integration
def test_the_service_range_outgrows_a_slash_24(cluster: ControlPlane, api: client.ApiClient) -> None:
    """A /24 ran out at 254 Services: the 255th InferenceService failed with "range is full"."""
    core: Any = client.CoreV1Api(api)
    assert core.read_namespaced_service("kubernetes", "default").spec.cluster_ip == KUBERNETES_SERVICE_IP
    # ...and the apiserver's certificate is valid for that address.
    port = (cluster.state() or {})["ports"]["apiserver"]
    context = ssl.create_default_context(cafile=str(cluster.layout.pem("ca")))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as sock,
        context.wrap_socket(sock, server_hostname="127.0.0.1") as tls,
    ):
        certificate = tls.getpeercert()
    assert certificate is not None
    assert ("IP Address", KUBERNETES_SERVICE_IP) in certificate["subjectAltName"]

    namespace = "test-service-range"
    core.create_namespace({"metadata": {"name": namespace}})
    service = {"spec": {"ports": [{"port": 8000}]}}
    ips = {
        core.create_namespaced_service(namespace, {"metadata": {"name": f"s{i}"}, **service}).spec.cluster_ip
        for i in range(300)
    }
    assert len(ips) == 300
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(SERVICE_CIDR) for ip in ips)


def cli(*args: str, bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """`inferop cluster ...` in a fresh interpreter, as a user runs it."""
    env = {**os.environ, "KUBEBUILDER_ASSETS": str(bin_dir)}
    command = [sys.executable, "-m", "inferop_core.cli", "cluster", *args]
    # A first `up` on a fresh machine writes the node's images (docs/operations/local-cluster.md): minutes, once.
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, check=False)


@pytest.mark.integration
def test_cli_up_is_idempotent_and_down_leaves_no_process(
    release: KubernetesRelease, bin_dir: Path, tmp_path: Path
) -> None:
    """`up` gives a cluster with a real node (tests/node/ runs pods on it) on a release with a
    scheduler, and says that pods stay Pending on one without; a second `up` finds it running; `down` stops
    everything it started."""
    state_dir = tmp_path / "cluster"
    up = ("up", "--state-dir", str(state_dir), "--kubernetes", release.name)
    node = Node(Layout(state_dir))
    try:
        first = cli(*up, bin_dir=bin_dir)
        assert first.returncode == 0, first.stderr
        exports = first.stdout.splitlines()
        assert exports[0] == f"export KUBECONFIG={state_dir / 'kubeconfig'}"
        assert exports[1] == f'export PATH={kube_tools()}:"$PATH"'  # the project's kubectl and helm
        pids = ControlPlane(state_dir).pids()
        assert set(pids) == set(release.components)
        recorded = node.recorded()
        if release.schedules_pods:
            assert re.search(
                rf"node {NODE_NAME} Ready in [0-9.]+ s \(control plane [0-9.]+ s, containerd", first.stderr
            )
            assert recorded is not None and node.running()
            images = node.images()
            assert exports[2:] == [
                f"export INFEROP_TRITON_IMAGE={images['triton']}",
                f"export INFEROP_FETCH_IMAGE={images['operator']}",
                f"export INFEROP_CHART_VALUES={node.layout.chart_values}",
            ]
        else:
            assert "pods stay Pending" in first.stderr and recorded is None and exports[2:] == []

        again = cli(*up, bin_dir=bin_dir)
        assert again.stdout == first.stdout
        assert ControlPlane(state_dir).pids() == pids
        assert node.recorded() == recorded  # the same node

        other = next(candidate.name for candidate in RELEASES if candidate != release)
        clash = cli("up", "--state-dir", str(state_dir), "--kubernetes", other, bin_dir=bin_dir)
        assert clash.returncode == 1
        assert f"Kubernetes {release.name} runs in {state_dir}" in clash.stderr
        assert ControlPlane(state_dir).pids() == pids

        status = cli("status", "--state-dir", str(state_dir), bin_dir=bin_dir)
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"release:    {release.name}\n" in status.stdout
        assert f"kubernetes: v{release.name}." in status.stdout
        said = f"node:       {NODE_NAME} at {node.site.node_address}, running" if recorded else "node:       none"
        assert said in status.stdout

        assert cli("down", "--state-dir", str(state_dir), bin_dir=bin_dir).returncode == 0
        executables = {name: str(bin_dir / name) for name in pids}
        for name, process in (recorded or {}).get("processes", {}).items():
            pids, executables = pids | {name: process["pid"]}, executables | {name: process["executable"]}
        assert not [name for name, pid in pids.items() if process_running(pid, executables[name])]
        assert not state_dir.exists()
        assert cli("status", "--state-dir", str(state_dir), bin_dir=bin_dir).returncode == 1
        assert cli("down", "--state-dir", str(state_dir), bin_dir=bin_dir).returncode == 0
    finally:
        node.stop()
        ControlPlane(state_dir).down()
        node.down()


@pytest.mark.integration
def test_cli_up_without_a_node_leaves_pods_pending(tmp_path: Path) -> None:
    release = KUBERNETES_1_37  # the release that gets a node
    state_dir = tmp_path / "cluster"
    bin_dir = kube_binaries(build=False, release=release)
    try:
        result = cli("up", "--state-dir", str(state_dir), "--kubernetes", release.name, "--no-node", bin_dir=bin_dir)
        assert result.returncode == 0, result.stderr
        assert "no node: pods stay Pending" in result.stderr
        assert Node(Layout(state_dir)).recorded() is None
        assert (ControlPlane(state_dir).state() or {})["server"].startswith("https://127.0.0.1:")
    finally:
        ControlPlane(state_dir).down()


def test_a_crd_without_conditions_or_still_installing_is_not_established() -> None:
    def crd(name: str, *conditions: tuple[str, str]) -> dict[str, Any]:
        found = [{"type": kind, "status": status} for kind, status in conditions]
        return {"metadata": {"name": name}, "status": {"conditions": found} if found else {}}

    listing = {
        "kind": "List",
        "items": [
            crd("new.example.com"),
            crd("installing.example.com", ("NamesAccepted", "True"), ("Established", "False")),
            crd("served.example.com", ("NamesAccepted", "True"), ("Established", "True")),
        ],
    }
    assert not_established(listing) == ["new.example.com", "installing.example.com"]
    assert not_established(crd("served.example.com", ("Established", "True"))) == []

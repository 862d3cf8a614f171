"""A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on 127.0.0.1.

No kubelet and no container runtime: objects, RBAC, admission, garbage collection and the workload
controllers are real, Pods stay Pending. That is what an operator and a chart need to be tested against,
and it starts in seconds without Docker. Kubernetes 1.20 by default here (`inferop cluster up` starts 1.37);
1.37, the current release, also runs a kube-scheduler, which places Pods on kwok's fake nodes where kwok runs
(inferop_devtools.cluster.addons) and otherwise finds no node and says so on each Pod.

The builders at the top (file layout, command lines, kubeconfig) are pure; `ControlPlane` below them runs
the processes. Every process runs in its own session, so it outlives the command that started it, and is
recorded in a JSON state file that `down` and `status` read.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from inferop.paths import cache_dir, log_tail, repo_root
from inferop_core.errors import InferopError

log = logging.getLogger(__name__)

# Every component any release runs, in start order; `down` stops them in reverse.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
# kubeadm's default: about a million ClusterIPs (a /24 ran out at 254 Services: "range is full"). A /12 is the
# largest range the apiserver accepts for IPv4.
SERVICE_CIDR = "10.96.0.0/12"
# The `kubernetes` Service takes the range's first address; the serving certificate names it.
KUBERNETES_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
# The common name of the certificate the apiserver presents to aggregated API servers.
FRONT_PROXY_CLIENT = "front-proxy-client"
# The certificate the apiserver presents to kubelets (logs, exec, port-forward); system:masters may do all of it.
KUBELET_CLIENT = "apiserver-kubelet-client"
LOOPBACK = "127.0.0.1"


class ClusterError(InferopError, RuntimeError):
    """The control plane could not be started or reached; the message says why and what to do."""


def default_state_dir() -> Path:
    """`$INFEROP_CLUSTER_DIR`, else `<cache>/cluster`."""
    env = os.environ.get("INFEROP_CLUSTER_DIR")
    return Path(env) if env else cache_dir() / "cluster"


# ---------------------------------------------------------------------------------------------- builders


@dataclass(frozen=True)
class KubernetesRelease:
    """A release the control plane can run: where its binaries come from and what differs between releases.

    The command builders take it as an argument, so each release's command lines stay pure and testable.
    """

    name: str
    # In scripts/: prints the directory holding the binaries on its last stdout line; --no-build exits 3.
    binaries_script: str
    components: tuple[str, ...]
    apiserver_flags: tuple[str, ...]
    controller_manager_flags: tuple[str, ...]
    # $KUBEBUILDER_ASSETS names a directory, not a release: only 1.20, whose script always took it, uses it.
    honours_kubebuilder_assets: bool
    # What applying the chart's CRD takes: before 1.23 kubectl's client-side check against the server's OpenAPI
    # refuses its x-kubernetes-validations (the apiserver, given the CRD unchecked, drops them), and helm's
    # server-side apply fails on them the same way.
    kubectl_crd_flags: tuple[str, ...] = ()
    helm_install_flags: tuple[str, ...] = ()

    @property
    def schedules_pods(self) -> bool:
        """Whether pods get a node: a kube-scheduler places them (on kwok's fake nodes); without one they stay
        Pending."""
        return "kube-scheduler" in self.components

    @property
    def how_to_get_binaries(self) -> str:
        """What to run when the binaries are missing, for error messages."""
        envtest = ", or honours $KUBEBUILDER_ASSETS" if self.honours_kubebuilder_assets else ""
        return f"scripts/{self.binaries_script} (builds Kubernetes {self.name} once{envtest})"


KUBERNETES_1_20 = KubernetesRelease(
    name="1.20",
    binaries_script="kube-binaries.sh",
    # No scheduler: kube-binaries.sh builds none, and without nodes there is nothing to place.
    components=("etcd", "kube-apiserver", "kube-controller-manager"),
    # Plain-HTTP ports, open unless set to 0; both flags are gone since 1.24.
    apiserver_flags=("--insecure-port=0",),
    controller_manager_flags=("--port=0",),
    honours_kubebuilder_assets=True,
    kubectl_crd_flags=("--validate=false",),
    helm_install_flags=("--server-side=false",),
)
KUBERNETES_1_37 = KubernetesRelease(
    name="1.37",
    binaries_script="kube-current.sh",
    # With a scheduler, each Pod carries the reason it waits (PodScheduled=False), as on a real cluster.
    components=COMPONENTS,
    apiserver_flags=(),
    controller_manager_flags=(),
    honours_kubebuilder_assets=False,
)
KUBERNETES_RELEASES = {release.name: release for release in (KUBERNETES_1_20, KUBERNETES_1_37)}


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    address: str = LOOPBACK  # where the apiserver listens, and what it advertises

    @classmethod
    def free(cls, address: str) -> Ports:
        """Ports free on this machine now, the apiserver listening at `address`."""
        etcd_client, etcd_peer, apiserver, controller_manager, scheduler = free_ports(5)
        return cls(etcd_client, etcd_peer, apiserver, controller_manager, scheduler, address)

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self.apiserver}"


@dataclass(frozen=True)
class Layout:
    """Where everything lives inside a state directory."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd"

    @property
    def controller_manager_certs(self) -> Path:
        return self.root / "cm-certs"

    @property
    def scheduler_kubeconfig(self) -> Path:
        return self.root / "scheduler.kubeconfig"

    @property
    def scheduler_certs(self) -> Path:
        return self.root / "scheduler-certs"

    def log(self, component: str) -> Path:
        return self.root / f"{component}.log"

    def pem(self, name: str) -> Path:
        return self.pki / f"{name}.pem"

    def created(self) -> list[Path]:
        """Everything `up` may create, for `down` to remove (and nothing else in the directory)."""
        logs = [self.log(c) for c in COMPONENTS]
        created = [self.state_file, self.kubeconfig, self.pki, self.etcd_data, self.controller_manager_certs]
        return [*created, self.scheduler_kubeconfig, self.scheduler_certs, *logs]


def etcd_command(release: KubernetesRelease, bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    client = f"http://127.0.0.1:{ports.etcd_client}"
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    return [
        str(bin_dir / "etcd"),
        "--name=inferop",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=inferop={peer}",
        "--logger=zap",
    ]


def apiserver_command(release: KubernetesRelease, bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        f"--bind-address={ports.address}",
        f"--advertise-address={ports.address}",
        f"--secure-port={ports.apiserver}",
        *release.apiserver_flags,
        f"--cert-dir={layout.pki}",
        f"--tls-cert-file={layout.pem('apiserver')}",
        f"--tls-private-key-file={layout.pem('apiserver-key')}",
        f"--client-ca-file={layout.pem('ca')}",
        # Node: a kubelet reads and writes only what its own pods need (with NodeRestriction), as on any cluster.
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # Logs, exec and port-forward: the apiserver calls a node's kubelet at its InternalIP (the node's name
        # resolves nowhere), with a client certificate, and checks the kubelet's serving certificate.
        f"--kubelet-client-certificate={layout.pem(KUBELET_CLIENT)}",
        f"--kubelet-client-key={layout.pem(f'{KUBELET_CLIENT}-key')}",
        f"--kubelet-certificate-authority={layout.pem('ca')}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={layout.pem('sa-pub')}",
        f"--service-account-signing-key-file={layout.pem('sa-key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        # The aggregation layer, as a real cluster has it: the apiserver proxies APIServices (e.g. a metrics
        # adapter's custom.metrics.k8s.io) with the front proxy's client certificate, and the extension server
        # trusts the user in its headers because that certificate is signed by the front-proxy CA.
        f"--requestheader-client-ca-file={layout.pem('front-proxy-ca')}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={layout.pem('front-proxy-client')}",
        f"--proxy-client-key-file={layout.pem('front-proxy-client-key')}",
        # The `kubernetes` Service's endpoints cannot hold a loopback address: without a node nothing in-cluster
        # needs them; with one, pods reach the apiserver through them at the address it advertises.
        *(["--endpoint-reconciler-type=none"] if ports.address == LOOPBACK else []),
        "--profiling=false",
    ]


def controller_manager_command(release: KubernetesRelease, bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"),
        f"--kubeconfig={layout.kubeconfig}",
        "--leader-elect=false",
        # csrsigning needs a signing CA and nodeipam a pod CIDR; neither matters without nodes.
        "--controllers=*,-csrsigning,-nodeipam",
        f"--service-account-private-key-file={layout.pem('sa-key')}",
        f"--root-ca-file={layout.pem('ca')}",
        "--use-service-account-credentials=true",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.controller_manager}",
        *release.controller_manager_flags,
        f"--cert-dir={layout.controller_manager_certs}",
        "--profiling=false",
    ]


def scheduler_command(release: KubernetesRelease, bin_dir: Path, layout: Layout, ports: Ports) -> list[str]:
    return [
        str(bin_dir / "kube-scheduler"),
        # Its own identity: the built-in RBAC role system:kube-scheduler is what a real cluster grants it.
        f"--kubeconfig={layout.scheduler_kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={layout.scheduler_certs}",
        "--profiling=false",
    ]


COMMAND_BUILDERS: dict[str, Callable[[KubernetesRelease, Path, Layout, Ports], list[str]]] = {
    "etcd": etcd_command,
    "kube-apiserver": apiserver_command,
    "kube-controller-manager": controller_manager_command,
    "kube-scheduler": scheduler_command,
}


def commands(release: KubernetesRelease, bin_dir: Path, layout: Layout, ports: Ports) -> dict[str, list[str]]:
    """The command line of each of the release's components."""
    return {name: COMMAND_BUILDERS[name](release, bin_dir, layout, ports) for name in release.components}


def kubeconfig(server: str, layout: Layout, name: str = "inferop", user: str = "admin") -> dict[str, Any]:
    """A kubeconfig that points at files in the layout: by default the admin's (client certificate in
    `system:masters`), with `user="scheduler"` the scheduler's."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority": str(layout.pem("ca"))}}],
        "users": [
            {
                "name": f"{name}-{user}",
                "user": {
                    "client-certificate": str(layout.pem(user)),
                    "client-key": str(layout.pem(f"{user}-key")),
                },
            }
        ],
        "contexts": [{"name": name, "context": {"cluster": name, "user": f"{name}-{user}"}}],
        "current-context": name,
    }


def openssl_extensions(address: str = LOOPBACK) -> str:
    """x509 extension sections for the leaf certificates, written beside them as `extensions.cnf`; the apiserver's
    names `address` too, where it listens."""
    sans = ",".join(
        [
            "IP:127.0.0.1",
            *([f"IP:{address}"] if address != LOOPBACK else []),
            f"IP:{KUBERNETES_SERVICE_IP}",
            "DNS:localhost",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    leaf = "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
    return (
        f"[apiserver]\n{leaf}extendedKeyUsage = serverAuth\nsubjectAltName = {sans}\n"
        f"[admin]\n{leaf}extendedKeyUsage = clientAuth\n"
        f"[scheduler]\n{leaf}extendedKeyUsage = clientAuth\n"
        f"[front-proxy-client]\n{leaf}extendedKeyUsage = clientAuth\n"
        f"[{KUBELET_CLIENT}]\n{leaf}extendedKeyUsage = clientAuth\n"
    )


def key_command(pki: Path, name: str) -> list[str]:
    # ECDSA P-256: generated in milliseconds where RSA takes a good part of a second per key.
    ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]
    return ["openssl", "genpkey", *ec, "-out", f"{pki}/{name}.pem"]


def signed_commands(
    pki: Path, name: str, subject: str, by: str = "ca", extensions: str = "extensions.cnf"
) -> list[list[str]]:
    """A key, a request, and a certificate signed by the CA `by` in `pki` with the `[name]` section of the
    `extensions` file there."""
    key_file, csr, cert = f"{pki}/{name}-key.pem", f"{pki}/{name}.csr", f"{pki}/{name}.pem"
    ca = ["-CA", f"{pki}/{by}.pem", "-CAkey", f"{pki}/{by}-key.pem", "-CAcreateserial", "-days", "3650"]
    extfile = ["-extfile", f"{pki}/{extensions}", "-extensions", name]
    return [
        key_command(pki, f"{name}-key"),
        ["openssl", "req", "-new", "-key", key_file, "-subj", subject, "-out", csr],
        ["openssl", "x509", "-req", "-in", csr, *ca, *extfile, "-out", cert],
    ]


def openssl_commands(layout: Layout) -> list[list[str]]:
    """A CA, the apiserver's serving certificate, admin and scheduler client certificates, the front proxy's CA
    and client certificate, the apiserver's client certificate for kubelets, a service-account key pair.

    Run in order, after `openssl_extensions()` is written to `pki/extensions.cnf`.
    """
    pki = layout.pki

    def authority(name: str) -> list[list[str]]:
        self_signed = [
            "openssl",
            "req",
            "-x509",
            "-new",
            "-key",
            f"{pki}/{name}-key.pem",
            "-subj",
            f"/CN=inferop-{name}",
        ]
        return [key_command(pki, f"{name}-key"), [*self_signed, "-days", "3650", "-out", f"{pki}/{name}.pem"]]

    return [
        *authority("ca"),
        *signed_commands(pki, "apiserver", "/CN=kube-apiserver"),
        # Kubernetes maps the certificate's O to groups: system:masters is bound to cluster-admin.
        *signed_commands(pki, "admin", "/O=system:masters/CN=inferop-admin"),
        # The user the built-in RBAC binds to the role system:kube-scheduler.
        *signed_commands(pki, "scheduler", "/CN=system:kube-scheduler"),
        # A CA of its own, as kubeadm makes: a certificate of the cluster CA must not pass as the front proxy.
        *authority("front-proxy-ca"),
        *signed_commands(pki, FRONT_PROXY_CLIENT, f"/CN={FRONT_PROXY_CLIENT}", by="front-proxy-ca"),
        *signed_commands(pki, KUBELET_CLIENT, f"/O=system:masters/CN={KUBELET_CLIENT}"),
        key_command(pki, "sa-key"),
        ["openssl", "pkey", "-in", f"{pki}/sa-key.pem", "-pubout", "-out", f"{pki}/sa-pub.pem"],
    ]


# --------------------------------------------------------------------------------------------- processes


def missing_binaries(bin_dir: Path, release: KubernetesRelease) -> list[str]:
    return [name for name in release.components if not os.access(bin_dir / name, os.X_OK)]


def kube_binaries(build: bool = True, release: KubernetesRelease = KUBERNETES_1_20) -> Path:
    """The directory holding the release's binaries, from its script in `scripts/`.

    With `build=False` nothing is built: a missing build raises instead of taking minutes.
    """
    script = repo_root() / "scripts" / release.binaries_script
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if release.honours_kubebuilder_assets and assets and not missing_binaries(Path(assets), release):
        return Path(assets)
    if not script.is_file():
        if release.honours_kubebuilder_assets:
            hint = f"set KUBEBUILDER_ASSETS to a directory holding {', '.join(release.components)}"
        else:
            hint = f"Kubernetes {release.name} is built by that script only"
        raise ClusterError(f"{script} not found (inferop is installed without its source checkout): {hint}")
    argv = [str(script)] if build else [str(script), "--no-build"]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)  # progress: stderr
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        status = result.returncode
        raise ClusterError(
            f"no Kubernetes binaries ({script.name} exited with {status}): run {release.how_to_get_binaries}"
        )
    bin_dir = Path(lines[-1])
    if missing := missing_binaries(bin_dir, release):
        raise ClusterError(f"{', '.join(missing)} missing in {bin_dir}: run {release.how_to_get_binaries}")
    return bin_dir


def free_ports(count: int) -> list[int]:
    """Distinct ports free on 127.0.0.1 right now (held open together so the kernel cannot repeat one)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def http_get(url: str, context: ssl.SSLContext | None = None, timeout: float = 2.0) -> tuple[int, str]:
    """(status, body); status 0 when nothing answers."""
    # A proxy from the environment must not see requests to 127.0.0.1.
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def process_running(pid: int, executable: str) -> bool:
    """True while `pid` is alive and still runs `executable` (a recycled pid is not ours)."""
    proc = Path(f"/proc/{pid}")
    if not Path("/proc/self").exists():  # no procfs: trust the pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    try:
        state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        argv0 = (proc / "cmdline").read_bytes().split(b"\0", 1)[0].decode()
    except (OSError, IndexError):
        return False
    return state != "Z" and argv0 == executable


def _reap(pid: int) -> None:
    """Collect an exited child of this Python process, so no zombie keeps its pid."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def stop_process(pid: int, executable: str, timeout: float = 10.0) -> None:
    """SIGTERM the process's group (it leads its own session), SIGKILL after `timeout` seconds."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        _reap(pid)
        if not process_running(pid, executable):
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            if not process_running(pid, executable):
                return
            time.sleep(0.05)
    raise ClusterError(f"{executable} (pid {pid}) survived SIGKILL")


def insecure_context() -> ssl.SSLContext:
    """For the controller-manager's and scheduler's health endpoints, served with certificates they made up."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


class ControlPlane:
    """The components of a Kubernetes release on 127.0.0.1, state kept in `state_dir`.

    `release` is what `up` starts; `down`, `status` and `restart` act on the release the state file records.

    >>> with ControlPlane(tmp) as cluster:
    ...     kubernetes.config.load_kube_config(str(cluster.kubeconfig))
    """

    def __init__(
        self,
        state_dir: Path | str | None = None,
        bin_dir: Path | None = None,
        release: KubernetesRelease = KUBERNETES_1_20,
        address: str = LOOPBACK,
    ) -> None:
        self.layout = Layout(Path(state_dir) if state_dir is not None else default_state_dir())
        self.bin_dir = bin_dir
        self.release = release
        self.address = address  # where `up` has the apiserver listen: a node's pods reach it there
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def kubeconfig(self) -> Path:
        return self.layout.kubeconfig

    def state(self) -> dict[str, Any] | None:
        """What `up` recorded: release, server, ports, bin_dir and the processes' pids; None when down."""
        try:
            state: dict[str, Any] = json.loads(self.layout.state_file.read_text())
        except (OSError, ValueError):
            return None
        return state

    def running_release(self) -> KubernetesRelease | None:
        """The release the state file records; None when down."""
        state = self.state()
        if state is None:
            return None
        # State files written before releases were recorded all ran 1.20.
        return KUBERNETES_RELEASES[state.get("kubernetes", KUBERNETES_1_20.name)]

    def pids(self) -> dict[str, int]:
        state = self.state() or {}
        return {name: proc["pid"] for name, proc in state.get("processes", {}).items()}

    def _api_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.layout.pem("ca")))
        context.load_cert_chain(str(self.layout.pem("admin")), str(self.layout.pem("admin-key")))
        return context

    def api_get(self, path: str, timeout: float = 2.0) -> tuple[int, str]:
        """GET a path on the apiserver as the admin; (0, "") when it does not answer."""
        state = self.state()
        if state is None:
            return 0, ""
        try:
            context = self._api_context()
        except (OSError, ssl.SSLError):
            return 0, ""
        return http_get(state["server"] + path, context, timeout)

    def healthy(self) -> bool:
        """All recorded processes run and the apiserver answers /readyz."""
        state, release = self.state(), self.running_release()
        if state is None or release is None:
            return False
        processes = state.get("processes", {})
        if set(processes) != set(release.components):
            return False
        if not all(process_running(p["pid"], p["executable"]) for p in processes.values()):
            return False
        return self.api_get("/readyz")[0] == 200

    def version(self) -> dict[str, Any]:
        """The apiserver's /version (gitVersion, platform...)."""
        status, body = self.api_get("/version")
        if status != 200:
            raise ClusterError(f"GET /version answered {status or 'nothing'}: is the cluster up?")
        version: dict[str, Any] = json.loads(body)
        return version

    def status(self) -> dict[str, Any]:
        """A summary for people: up or not, server, component versions and pids."""
        state, release = self.state(), self.running_release()
        summary: dict[str, Any] = {"healthy": self.healthy(), "state_dir": str(self.layout.root)}
        if state is None or release is None:
            return summary
        summary["server"] = state["server"]
        summary["release"] = release.name
        summary["kubeconfig"] = str(self.kubeconfig)
        summary["processes"] = {
            name: {"pid": p["pid"], "running": process_running(p["pid"], p["executable"])}
            for name, p in state.get("processes", {}).items()
        }
        if summary["healthy"]:
            summary["kubernetes"] = self.version().get("gitVersion")
            status, body = http_get(f"http://127.0.0.1:{state['ports']['etcd_client']}/version")
            if status == 200:
                summary["etcd"] = json.loads(body).get("etcdserver")
        return summary

    def refuse_another_release(self) -> None:
        """Raise when a healthy control plane of another release runs in the state dir: `up` never replaces it."""
        running = self.running_release()
        if self.healthy() and running != self.release:
            raise ClusterError(
                f"Kubernetes {running.name if running else '?'} runs in {self.layout.root}: "
                f"`inferop cluster down` it before starting {self.release.name} there"
            )

    def up(self, timeout: float = 60.0) -> Path:
        """Start the control plane, or find it already running; returns the admin kubeconfig."""
        if self.healthy():
            self.refuse_another_release()
            listening = (self.state() or {}).get("ports", {}).get("address", LOOPBACK)
            if listening != self.address:
                raise ClusterError(
                    f"the control plane in {self.layout.root} listens on {listening}, not {self.address} (started "
                    "with or without a node): `inferop cluster down` it first"
                )
            log.info("control plane already up at %s", (self.state() or {}).get("server"))
            return self.kubeconfig
        self.down()  # leftovers of a crash or a reboot
        bin_dir = self.bin_dir or kube_binaries(release=self.release)
        if missing := missing_binaries(bin_dir, self.release):
            raise ClusterError(f"{', '.join(missing)} missing in {bin_dir}: run {self.release.how_to_get_binaries}")
        started = time.monotonic()
        deadline = started + timeout
        try:
            self._start_all(bin_dir, deadline)
        except BaseException:
            self._stop_all()  # the logs stay, for a look at what went wrong
            raise
        elapsed = time.monotonic() - started
        log.info("control plane up at %s in %.1f s", (self.state() or {}).get("server"), elapsed)
        return self.kubeconfig

    def _start_all(self, bin_dir: Path, deadline: float) -> None:
        layout = self.layout
        layout.pki.mkdir(parents=True, exist_ok=True)
        (layout.pki / "extensions.cnf").write_text(openssl_extensions(self.address))
        for argv in openssl_commands(layout):
            result = subprocess.run(argv, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                raise ClusterError(f"{shlex.join(argv)} failed:\n{result.stderr}")
        ports = Ports.free(self.address)
        layout.kubeconfig.write_text(yaml.safe_dump(kubeconfig(ports.server, layout), sort_keys=False))
        scheduler = kubeconfig(ports.server, layout, user="scheduler")
        layout.scheduler_kubeconfig.write_text(yaml.safe_dump(scheduler, sort_keys=False))
        state: dict[str, Any] = {
            "kubernetes": self.release.name,
            "server": ports.server,
            "ports": asdict(ports),
            "bin_dir": str(bin_dir),
            "processes": {},
        }
        argvs = commands(self.release, bin_dir, layout, ports)
        checks = self._readiness(ports)
        for name in self.release.components:
            self._start(name, argvs[name], state)
            self._wait_ready(name, checks[name], deadline)

    def _readiness(self, ports: Ports) -> dict[str, Callable[[], bool]]:
        """How each component says it is ready to serve."""
        return {
            "etcd": lambda: http_get(f"http://127.0.0.1:{ports.etcd_client}/health")[0] == 200,
            "kube-apiserver": lambda: self.api_get("/readyz")[0] == 200,
            "kube-controller-manager": lambda: (
                http_get(f"https://127.0.0.1:{ports.controller_manager}/healthz", insecure_context())[0] == 200
            ),
            "kube-scheduler": lambda: (
                http_get(f"https://127.0.0.1:{ports.scheduler}/healthz", insecure_context())[0] == 200
            ),
        }

    def _start(self, name: str, argv: list[str], state: dict[str, Any]) -> None:
        log.info("starting %s", name)
        with self.layout.log(name).open("wb") as log_file:
            child = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self.layout.root,
                start_new_session=True,  # outlives `inferop cluster up`, and Ctrl-C in its terminal
            )
        self._children[name] = child
        state["processes"][name] = {"pid": child.pid, "executable": argv[0]}
        _write_json(self.layout.state_file, state)

    def _wait_ready(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        while not ready():
            for started, child in self._children.items():
                if child.poll() is not None:
                    tail = log_tail(self.layout.log(started))
                    hint = ""
                    if busy := re.search(r"127\.0\.0\.1:(\d+): bind: address already in use", tail):
                        hint = f": port {busy[1]} was taken since it was picked (run `up` again)"
                    raise ClusterError(f"{started} exited with status {child.returncode}{hint}\n{tail}")
            if time.monotonic() > deadline:
                tails = [log_tail(self.layout.log(n)) for n in ("etcd", name) if n in self._children]
                message = f"{name} not ready before the timeout (a slow machine? `up --timeout`)"
                raise ClusterError("\n".join([message, *dict.fromkeys(tails)]))
            time.sleep(0.1)

    def _stop_all(self, timeout: float = 10.0) -> None:
        state = self.state() or {}
        processes: Mapping[str, Any] = state.get("processes", {})
        for name in reversed(COMPONENTS):
            if name in processes:
                stop_process(processes[name]["pid"], processes[name]["executable"], timeout)
        for child in self._children.values():
            if child.poll() is None:
                child.kill()
            child.wait()
        self._children.clear()
        self.layout.state_file.unlink(missing_ok=True)

    def restart(self, names: tuple[str, ...] = COMPONENTS, pause: float = 0.0) -> float:
        """Stop `names` (SIGTERM, then SIGKILL), wait `pause` seconds, and start them again on the same ports with
        the same data, as a control-plane upgrade or a crashed etcd does; returns the seconds they were away.
        (kube-controller-manager exits when it loses the apiserver, as its leader election requires: a node's
        kubelet restarts it, so a restart of the apiserver here restarts it too.)"""
        state, release = self.state(), self.running_release()
        if state is None or release is None:
            raise ClusterError("the control plane is not up")
        argvs = commands(release, Path(state["bin_dir"]), self.layout, Ports(**state["ports"]))
        order = [name for name in release.components if name in names]
        stopped = time.monotonic()
        for name in reversed(order):
            process = state["processes"][name]
            stop_process(process["pid"], process["executable"])
            if child := self._children.pop(name, None):
                child.wait()
        time.sleep(pause)
        checks = self._readiness(Ports(**state["ports"]))
        deadline = time.monotonic() + 60
        for name in order:
            self._start(name, argvs[name], state)
            self._wait_ready(name, checks[name], deadline)
        return time.monotonic() - stopped

    def down(self, timeout: float = 10.0) -> None:
        """Stop every recorded process and remove what `up` created; nothing to do when already down."""
        self._stop_all(timeout)
        for path in self.layout.created():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.layout.root.rmdir()  # only when nothing else lives there

    def __enter__(self) -> ControlPlane:
        self.up()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.down()


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write atomically, so a reader never sees half a state file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)

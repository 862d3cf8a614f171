"""One real node for the local control plane: containerd, runc, the CNI plugins, the kubelet, kube-proxy, CoreDNS
and kube-router's network policy controller, all of them the released programs, in namespaces of their own.

Like a kind node (a container holding a kubelet and containerd), the node lives apart from the host:
- its network namespace is joined to the host by one veth pair: the host end holds the address the apiserver
  binds, the node end the node's InternalIP (`NodeSite`: a /30 of LINKS). The pods' bridge, their
  routes, kube-proxy's iptables rules and the sysctls the CNI plugins set all live in that namespace, so the host
  gets no route, rule or chain; the host reaches pods through the apiserver (`kubectl port-forward`, logs, exec).
- its mount namespace, held open by a holder process, has directories of the state dir bound over /run, /var/lib
  and /var/log, the paths where containerd, the kubelet and the CNI plugins keep what their configuration cannot
  move (shim sockets, device-plugin sockets, /var/log/containers, the CNI cache): every mount they make stays inside.
- every process of the node (the holder, containerd and its shims, the kubelet, kube-proxy, the pods' containers)
  lives in cgroups under the node's cgroup root, in each hierarchy: `down` kills what is there, removes the cgroups,
  the network namespace (and with it the veth) and the state.

The builders at the top are pure (configs, command lines, the CNI network); `Node` below them runs the processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import ipaddress
import json
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from inferop.limits import LimitsError, remove_cgroups
from inferop.paths import log_tail
from inferop_devtools.cluster.addons import addon_binaries
from inferop_devtools.cluster.controlplane import (
    SERVICE_CIDR,
    ClusterError,
    ControlPlane,
    Layout,
    kube_binaries,
    kubeconfig,
    process_running,
    signed_commands,
    stop_process,
)
from inferop_devtools.cluster.images import Images
from inferop_devtools.cluster.local_images import (
    images_cache,
    onnxruntime_cpu,
    operator_image,
    operator_packages,
    pause_image,
    triton_image,
)
from inferop_devtools.cluster.tools import built

NODE_NAME = "inferop-node-0"
CLUSTER_CIDR = "10.244.0.0/16"  # the pods' addresses; this node's share is POD_CIDR
POD_CIDR = "10.244.0.0/24"
BRIDGE = "cni0"  # in the node's network namespace
# Where the links of nodes take their /30 from: one per node, chosen by its cluster's state dir.
LINKS = ipaddress.ip_network("10.89.0.0/16")
# Where the node's mount namespace binds directories of its state dir: what lands there stays out of the host's.
PRIVATE_PATHS = ("/run", "/var/lib", "/var/log")
NODE_SCRIPT = "kube-node.sh"
# Debian's packages (scripts/kube-node.sh installs them): the runtime, runc and the CNI plugins.
CONTAINERD = Path("/usr/bin/containerd")
CTR = Path("/usr/bin/ctr")
CNI_BIN_DIR = Path("/usr/lib/cni")
# containerd's socket in the node's mount namespace, at its default path: the kubelet's cAdvisor finds the containers
# there (at any other path, its series have no container: only the pods' cgroups are named).
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
DAEMONS = ("containerd", "kubelet", "kube-proxy", "coredns", "kube-router")
POLICY_CHAIN = "KUBE-ROUTER-FORWARD"  # where kube-router's rules for forwarded traffic start
KUBELET_PORT = 10250  # the kubelet's API on the node's address: logs, exec, port-forward, metrics
CLONE_NEWNET = 0x40000000  # <sched.h>: setns(2)'s type of a network namespace
# The cgroup v1 hierarchies the kubelet needs for pods' limits and accounting.
REQUIRED_CONTROLLERS = frozenset({"cpu", "cpuacct", "cpuset", "memory", "pids"})
CLUSTER_DOMAIN = "cluster.local"
# The node's programs that the built-in RBAC does not know, each a user of its own: what each may read. CoreDNS:
# what kubeadm's system:coredns role lets it read; kube-router: what its own firewall DaemonSet's role lets it read
# (daemonset/generic-kuberouter.yaml, v2.1.0), less the writes that only its router and service proxy make.
NODE_USERS = {
    "coredns": [
        {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ],
    "kube-router": [
        {"apiGroups": [""], "resources": ["namespaces", "pods", "services", "nodes", "endpoints"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
    ],
}  # fmt: skip


def node_user(program: str) -> str:
    """The user name the certificate of one of NODE_USERS' programs carries."""
    return f"inferop:{program}"


class NodeError(ClusterError):
    """The node cannot start here, or failed; the message names what is missing or what failed."""


@dataclass(frozen=True)
class NodeSite:
    """The names and addresses a node takes on this machine, derived from its cluster's state dir, so that the
    clusters of two state dirs (a user's and a test's) have nodes apart."""

    key: str  # hex digits of the state dir's digest

    @classmethod
    def of(cls, state_dir: Path) -> NodeSite:
        return cls(hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:8])

    @property
    def netns(self) -> str:
        return f"inferop-{self.key}"

    def in_network(self, *argv: str) -> list[str]:
        """`argv` run in the node's network namespace, where the pods' addresses are routed."""
        return ["ip", "netns", "exec", self.netns, *argv]

    @contextlib.contextmanager
    def network(self) -> Iterator[None]:
        """The calling thread, and what it starts meanwhile, in the node's network namespace, as a host-network
        process of the node: pod and Service addresses route there, the apiserver is across the link. Threads
        started before stay outside (enter it first); it goes back to its own namespace on leaving, where the node's
        link can be removed."""
        libc = ctypes.CDLL(None, use_errno=True)

        def join(path: Path, what: str) -> None:
            with path.open() as handle:
                if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                    raise NodeError(f"cannot enter {what}: {os.strerror(ctypes.get_errno())}")

        with Path("/proc/thread-self/ns/net").open() as own:
            join(Path("/run/netns") / self.netns, f"the node's network {self.netns}")
            try:
                yield
            finally:
                join(Path(f"/proc/self/fd/{own.fileno()}"), "this process's network again")

    def pin_pod(self, uid: str, cpus: str) -> bool:
        """Hold pod `uid` (its containers and whatever runs in them later, exec probes too) to `cpus` (a CPU list,
        e.g. "1"), through the cpuset cgroups the kubelet made for it under the node's root (cgroupfs:
        kubepods[/<QoS class>]/pod<uid>/<container>); False while it has none. A child's CPUs must lie within its
        parent's: the pod's are widened to the node's first, then its containers' set, then its own."""
        (hierarchy,) = (h for h in cgroup_hierarchies() if h.name == "cpuset")
        root = hierarchy / self.cgroup_root
        pods = list(root.glob(f"kubepods/**/pod{uid}"))
        if not pods:
            return False
        every = (root / "cpuset.cpus").read_text().strip()
        for pod in pods:
            (pod / "cpuset.cpus").write_text(every)
            for container in (child for child in pod.iterdir() if child.is_dir()):
                (container / "cpuset.cpus").write_text(cpus)
            (pod / "cpuset.cpus").write_text(cpus)
        return True

    def container_cgroups(self, uid: str, container_id: str) -> dict[str, Path]:
        """The cgroups the kubelet made for container `container_id` (a pod status's containerID, runtime:// prefix
        and all) of pod `uid`, by hierarchy (v1: cpu, cpuacct, memory, pids, ...); empty once they are gone."""
        name = f"kubepods/**/pod{uid}/{container_id.split('://')[-1]}"
        return {
            hierarchy.name: cgroup
            for hierarchy in cgroup_hierarchies()
            for cgroup in (hierarchy / self.cgroup_root).glob(name)
        }

    def container_pids(self, uid: str, container_id: str) -> list[int]:
        """The processes of container `container_id` of pod `uid`, from its pids cgroup: /proc/<pid>/root is the
        container's file system as its processes see it."""
        cgroup = self.container_cgroups(uid, container_id).get("pids")
        return [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()] if cgroup else []

    @property
    def host_link(self) -> str:
        """The host's end of the veth (at most 15 characters); the node's end is eth0 in `netns`."""
        return f"inferop{self.key}"

    @property
    def link(self) -> ipaddress.IPv4Network:
        links = list(LINKS.subnets(new_prefix=30))
        return links[int(self.key, 16) % len(links)]  # type: ignore[return-value]

    @property
    def host_address(self) -> str:
        """The host's address on the link, where the apiserver listens for the node and its pods."""
        return str(next(self.link.hosts()))

    @property
    def node_address(self) -> str:
        """The node's InternalIP."""
        return str(list(self.link.hosts())[1])

    @property
    def cgroup_root(self) -> str:
        return f"inferop-node-{self.key}"

    @property
    def system_cgroup(self) -> str:
        """The node's own processes, beside the pods' `kubepods` that the kubelet makes under `cgroup_root`."""
        return f"{self.cgroup_root}/system"


@dataclass(frozen=True)
class NodeLayout:
    """Where the node keeps everything, under the control plane's state dir."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "node.json"

    @property
    def private(self) -> Path:
        """The directories bound over PRIVATE_PATHS in the node's mount namespace."""
        return self.root / "private"

    def bound(self, path: str) -> Path:
        return self.private / path.strip("/").replace("/", "-")

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni"

    @property
    def chart_values(self) -> Path:
        """Values for `helm install charts/inferop` on this node: the local operator and Triton images."""
        return self.root / "chart-values.yaml"

    def config(self, name: str) -> Path:
        return self.root / name

    def log(self, name: str) -> Path:
        return self.root / f"{name}.log"


# --------------------------------------------------------------------------------------------- builders


def network_commands(site: NodeSite) -> list[list[str]]:
    """The node's network namespace and its link to the host, in order."""
    node = ["ip", "-n", site.netns]
    prefix = site.link.prefixlen
    return [
        ["ip", "netns", "add", site.netns],
        ["ip", "link", "add", site.host_link, "type", "veth", "peer", "name", "eth0", "netns", site.netns],
        ["ip", "addr", "add", f"{site.host_address}/{prefix}", "dev", site.host_link],
        ["ip", "link", "set", site.host_link, "up"],
        [*node, "link", "set", "lo", "up"],
        [*node, "addr", "add", f"{site.node_address}/{prefix}", "dev", "eth0"],
        [*node, "link", "set", "eth0", "up"],
        [*node, "route", "add", "default", "via", site.host_address],
    ]


# Set in the node's network namespace only: routing between the pods' bridge and the link, and bridged traffic
# through iptables, which kube-proxy's Service rules need for a pod calling a Service that lands on the same bridge.
NODE_SYSCTLS = {"net.ipv4.ip_forward": "1", "net.bridge.bridge-nf-call-iptables": "1"}


def cni_network() -> dict[str, Any]:
    """The pods' network: a bridge in the node's namespace, addresses from POD_CIDR, the bridge their gateway, and
    traffic leaving the node (to the apiserver) masqueraded as the node, which the host can answer."""
    return {
        "cniVersion": "1.0.0",
        "name": "inferop",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": True,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def containerd_config(layout: NodeLayout, sandbox_image: str) -> str:
    """containerd's configuration (version 2, containerd 1.6), as TOML."""
    runc = 'plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc'
    return "\n".join(
        [
            "version = 2",
            f'root = "{layout.containerd_root}"',
            'state = "/run/containerd"',
            "[grpc]",
            f'  address = "{CONTAINERD_SOCKET}"',
            '[plugins."io.containerd.grpc.v1.cri"]',
            f'  sandbox_image = "{sandbox_image}"',
            # Without CAP_SYS_RESOURCE (these machines lack it) runc cannot lower a process's OOM score below its
            # parent's, and every sandbox fails: "can't get final child's PID from pipe: EOF".
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            "  enable_unprivileged_ports = true",
            '[plugins."io.containerd.grpc.v1.cri".containerd]',
            '  default_runtime_name = "runc"',
            '  snapshotter = "overlayfs"',
            f"[{runc}]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{runc}.options]",
            "  SystemdCgroup = false",
            '[plugins."io.containerd.grpc.v1.cri".cni]',
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{layout.cni_conf_dir}"',
            "",
        ]
    )


def kubelet_config(site: NodeSite, layout: NodeLayout, control: Layout) -> dict[str, Any]:
    """The kubelet's KubeletConfiguration: the node's certificates, webhook authentication and authorization (the
    apiserver decides who may read logs or exec), the cgroupfs driver under the site's cgroup root on cgroup v1,
    containerd."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": site.node_address,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "tlsCertFile": str(control.pem("kubelet")),
        "tlsPrivateKeyFile": str(control.pem("kubelet-key")),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(control.pem("ca"))},
        },
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{site.cgroup_root}",
        # These machines are cgroup v1 (hybrid); since 1.35 the kubelet refuses v1 unless told otherwise.
        "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "resolvConf": "/etc/resolv.conf",
        "clusterDomain": CLUSTER_DOMAIN,
        "clusterDNS": [site.node_address],  # CoreDNS, on the node
        "failSwapOn": False,
        # The node shares this machine's disk: evict only when it is nearly full, not at the default 10-15% free.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1Gi", "imagefs.available": "1Gi"},
        "imageGCHighThresholdPercent": 100,
        "serializeImagePulls": False,
        "registerNode": True,
    }


def kube_proxy_config(site: NodeSite, layout: NodeLayout) -> dict[str, Any]:
    """kube-proxy in iptables mode, its rules in the node's network namespace; it leaves the conntrack table's size
    (a sysctl of the whole host) as it is."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(layout.config("kube-proxy.kubeconfig"))},
        "mode": "iptables",
        "clusterCIDR": CLUSTER_CIDR,
        "hostnameOverride": NODE_NAME,
        "bindAddress": site.node_address,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
    }


def kubelet_scrape_job(site: NodeSite, control: Layout, interval: str = "2s") -> dict[str, Any]:
    """Prometheus' scrape of the kubelet's cAdvisor series, as kube-prometheus-stack's kubelet job scrapes them
    (https on the kubelet's port, /metrics/cadvisor), as a client the kubelet's webhook lets read them: here the
    admin, by its certificate."""
    tls = {"ca_file": str(control.pem("ca")), "cert_file": str(control.pem("admin")),
           "key_file": str(control.pem("admin-key"))}  # fmt: skip
    return {
        "job_name": "kubelet",
        "scheme": "https",
        "metrics_path": "/metrics/cadvisor",
        "scrape_interval": interval,
        "tls_config": tls,
        "static_configs": [{"targets": [f"{site.node_address}:{KUBELET_PORT}"]}],
    }


def daemon_commands(site: NodeSite, layout: NodeLayout, kube_bin: Path, addon_bin: Path) -> dict[str, list[str]]:
    """The node's daemons' command lines, each run inside the node's namespaces."""
    return {
        "containerd": [str(CONTAINERD), f"--config={layout.config('containerd.toml')}"],
        "kubelet": [
            str(kube_bin / "kubelet"),
            f"--config={layout.config('kubelet.yaml')}",
            f"--kubeconfig={layout.config('kubelet.kubeconfig')}",
            f"--hostname-override={NODE_NAME}",
            f"--node-ip={site.node_address}",
        ],
        "kube-proxy": [str(kube_bin / "kube-proxy"), f"--config={layout.config('kube-proxy.yaml')}"],
        "coredns": [str(addon_bin / "coredns"), "-conf", str(layout.config("Corefile"))],
        # NetworkPolicies enforced in the node's iptables (ipsets of the pods each policy selects), beside the
        # bridge CNI, which enforces none; its router and service proxy are left off (the bridge routes the pods,
        # kube-proxy the Services), and so is its health port (the node's processes are watched by their pids).
        "kube-router": [
            str(addon_bin / "kube-router"),
            f"--kubeconfig={layout.config('kube-router.kubeconfig')}",
            f"--hostname-override={NODE_NAME}",
            "--run-firewall=true",
            "--run-router=false",
            "--run-service-proxy=false",
            "--enable-cni=false",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--health-port=0",
        ],
    }


def corefile(site: NodeSite, layout: NodeLayout) -> str:
    """CoreDNS's configuration: Service and Pod names of the cluster from the API server, answered on the node's
    address (the kubelet's clusterDNS); no forwarding (these machines reach no outside resolver from the node)."""
    return "\n".join(
        [
            ".:53 {",
            f"    bind {site.node_address}",
            "    errors",
            "    health 127.0.0.1:8080",
            "    ready 127.0.0.1:8181",
            f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{",
            f"        kubeconfig {layout.config('coredns.kubeconfig')}",
            "        pods insecure",
            "        fallthrough in-addr.arpa ip6.arpa",
            "    }",
            "    cache 30",
            "    loadbalance",
            "}",
            "",
        ]
    )


def node_users_access() -> list[dict[str, Any]]:
    """A ClusterRole and binding for each of NODE_USERS: what its user may read."""
    rbac = "rbac.authorization.k8s.io/v1"
    documents: list[dict[str, Any]] = []
    for program, rules in NODE_USERS.items():
        name = node_user(program)
        role = {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules}
        binding = {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}],
        }
        documents += [role, binding]
    return documents


def holder_command(site: NodeSite, layout: NodeLayout) -> list[str]:
    """The process that holds the node's mount namespace: it enters the node's network namespace, makes a mount
    namespace that sees the host's mounts but shows none of its own to the host, binds the private directories
    and waits."""
    binds = " && ".join(f"mount --bind {layout.bound(path)} {path}" for path in PRIVATE_PATHS)
    return [
        "nsenter",
        f"--net=/run/netns/{site.netns}",
        "--",
        "unshare",
        "--mount",
        "--propagation=slave",
        "--",
        "sh",
        "-c",
        f"{binds} && exec sleep infinity",
    ]


def chart_values(operator: str, triton: str) -> dict[str, Any]:
    """The chart's values that run it on the local node: its images, imported there, never pulled; and no CPU
    request for the operator, still limited as the chart limits it: the node is this machine, and `inferop export`
    plans a model for all of the machine's CPUs, so the README's model would stay Pending beside a request of 100m."""
    repository, _, tag = operator.rpartition(":")
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "IfNotPresent"},
        "tritonImage": triton,
        "resources": {"requests": {"cpu": "0"}},
    }


def node_extensions(site: NodeSite) -> str:
    """x509 sections of the node's certificates, written beside the cluster's as `node-extensions.cnf`."""
    leaf = "basicConstraints = critical, CA:FALSE\nkeyUsage = critical, digitalSignature\n"
    return (
        f"[kubelet]\n{leaf}extendedKeyUsage = serverAuth\nsubjectAltName = IP:{site.node_address},DNS:{NODE_NAME}\n"
        f"[kubelet-client]\n{leaf}extendedKeyUsage = clientAuth\n"
        f"[kube-proxy]\n{leaf}extendedKeyUsage = clientAuth\n"
        + "".join(f"[{program}]\n{leaf}extendedKeyUsage = clientAuth\n" for program in NODE_USERS)
    )


def node_certificates(pki: Path) -> list[list[str]]:
    """The kubelet's serving and client certificates and kube-proxy's, signed by the cluster's CA: the users the
    Node authorizer and the built-in RBAC know (system:node:<name> in system:nodes; system:kube-proxy); and those of
    NODE_USERS."""
    return [
        *signed_commands(pki, "kubelet", f"/CN={NODE_NAME}", extensions=NODE_EXTENSIONS),
        *signed_commands(
            pki, "kubelet-client", f"/O=system:nodes/CN=system:node:{NODE_NAME}", extensions=NODE_EXTENSIONS
        ),
        *signed_commands(pki, "kube-proxy", "/CN=system:kube-proxy", extensions=NODE_EXTENSIONS),
        *(
            argv
            for program in NODE_USERS
            for argv in signed_commands(pki, program, f"/CN={node_user(program)}", extensions=NODE_EXTENSIONS)
        ),
    ]


NODE_EXTENSIONS = "node-extensions.cnf"


# --------------------------------------------------------------------------------------------- processes


def probe_runs(metrics: str, pod: str, probe_type: str = "Liveness") -> Counter[str]:
    """How many times the kubelet has run `pod`'s probes of `probe_type`, by result, from its probe metrics (the
    text of /metrics/probes)."""
    runs: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("prober_probe_total{") and f'probe_type="{probe_type}"' in line and f'pod="{pod}"' in line:
            result = re.search(r'result="(\w+)"', line)
            runs[result.group(1) if result else "?"] += int(float(line.rsplit(" ", 1)[1]))
    return runs


def cgroup_hierarchies(unified: bool = False) -> list[Path]:
    """The mount points of the cgroup v1 hierarchies, each of which gets the node's cgroup root (the kubelet's
    cgroupfs driver works in all of them); with `unified`, the cgroup2 mount of a hybrid host too, where runc adds
    the containers."""
    hierarchies = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        _, mount_point, kind, *_ = line.split()
        if kind == "cgroup" or (unified and kind == "cgroup2"):
            hierarchies.append(Path(mount_point))
    return hierarchies


def _run(argv: Sequence[str], what: str) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise NodeError(f"{what}: `{' '.join(argv)}` failed: {result.stderr.strip()[-600:]}")
    return result.stdout


class Node:
    """The node of the control plane whose state dir is `control.root`, running the kubelet and kube-proxy of
    `kube_bin` and the images made of `files` (what scripts/kube-node.sh provides): `up` starts it, `down` removes
    every trace of it. Its link must exist before the apiserver binds the site's host address: `link_up` first,
    then the control plane, then `up`."""

    def __init__(
        self, control: Layout, kube_bin: Path | None = None, addon_bin: Path | None = None, files: Path | None = None
    ) -> None:
        self.control = control
        self.layout = NodeLayout(control.root / "node")
        self.site = NodeSite.of(control.root)
        self.kube_bin = kube_bin
        self.addon_bin = addon_bin
        self.files = files
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    # -- what the host must offer

    @staticmethod
    def missing() -> list[str]:
        """What this machine lacks for a node, each with how to get it; empty when nothing."""
        missing = []
        if os.geteuid() != 0:
            missing.append("root: the node makes network namespaces, mounts and cgroups (run as root)")
        for tool, package in (("ip", "iproute2"), ("iptables", "iptables"), ("nsenter", "util-linux"),
                              ("unshare", "util-linux"), ("mount", "mount")):  # fmt: skip
            if shutil.which(tool) is None:
                missing.append(f"the `{tool}` command (Debian package {package})")
        for program in (CONTAINERD, CTR, CNI_BIN_DIR / "bridge", CNI_BIN_DIR / "host-local", CNI_BIN_DIR / "portmap"):
            if not program.exists():
                missing.append(f"{program} (run scripts/{NODE_SCRIPT}: Debian's containerd, runc and CNI plugins)")
        if shutil.which("runc") is None:
            missing.append(f"runc (run scripts/{NODE_SCRIPT})")
        hierarchies = cgroup_hierarchies()
        names = {path.name for path in hierarchies}
        if not names >= REQUIRED_CONTROLLERS:
            found = ", ".join(sorted(names)) or "none"
            wanted = ", ".join(sorted(REQUIRED_CONTROLLERS))
            missing.append(f"cgroup v1 hierarchies {wanted} (mounted here: {found})")
        elif not all(os.access(path, os.W_OK) for path in hierarchies):
            missing.append("writable cgroup hierarchies under /sys/fs/cgroup")
        return missing

    # -- state

    def recorded(self) -> dict[str, Any] | None:
        """The node's processes as `up` recorded them; None when it has none."""
        try:
            found: dict[str, Any] = json.loads(self.layout.state_file.read_text())
        except (OSError, ValueError):
            return None
        return found

    def running(self) -> bool:
        """Whether every process of the node runs."""
        processes = (self.recorded() or {}).get("processes", {})
        return set(processes) == {"holder", *DAEMONS} and all(
            process_running(p["pid"], p["executable"]) for p in processes.values()
        )

    # -- up

    @classmethod
    def check_host(cls) -> None:
        """Raise, naming all that is missing, unless this machine can run a node."""
        if missing := cls.missing():
            raise NodeError("this machine cannot run a node; it lacks:\n- " + "\n- ".join(missing))

    def link_up(self) -> None:
        """The node's network namespace and its link to the host, made anew."""
        self.check_host()
        self.down()
        site = self.site
        taken = subprocess.run(["ip", "-o", "addr", "show", "to", str(site.link)], capture_output=True, text=True)
        if taken.stdout.strip():
            raise NodeError(f"the node's link {site.link} is taken on this machine: {taken.stdout.strip()}")
        for argv in network_commands(site):
            _run(argv, "the node's network")
        for key, value in NODE_SYSCTLS.items():
            _run(site.in_network("sysctl", "-q", "-w", f"{key}={value}"), "the node's network")

    def up(self, server: str, kubeconfig_path: Path, timeout: float = 120.0) -> dict[str, float]:
        """Start the node against the apiserver at `server` (its link made by `link_up`): containerd, the images,
        the kubelet and kube-proxy; returns once the node is Ready (as the admin's `kubeconfig_path` reads it),
        with the seconds each part took."""
        if self.kube_bin is None or self.addon_bin is None or self.files is None:
            raise NodeError("the node needs the kubelet's and CoreDNS's directories and scripts/kube-node.sh's files")
        took: dict[str, float] = {}
        mark = time.monotonic()

        def part(name: str) -> None:
            nonlocal mark
            took[name] = round(time.monotonic() - mark, 1)
            mark = time.monotonic()

        deadline = time.monotonic() + timeout
        images = Images(images_cache(), str(CTR))
        try:
            _, sandbox = images.archive(pause_image(self.files))
            self._write_files(server, sandbox)
            self._make_cgroups()
            holder = self._start("holder", holder_command(self.site, self.layout), "sleep")
            self._wait(lambda: self._bound(holder.pid), "the node's mount namespace", deadline)
            commands = daemon_commands(self.site, self.layout, self.kube_bin, self.addon_bin)
            self._start("containerd", *self._inside(holder.pid, commands["containerd"]))
            self._wait(self._containerd_answers, "containerd", deadline)
            part("containerd")
            specs = [
                pause_image(self.files),
                triton_image(self.files, onnxruntime_cpu()),
                operator_image(self.files, operator_packages()),
            ]
            self._record_images(images.ensure(self.containerd_socket, specs))
            part("images")
            self._apply(kubeconfig_path, node_users_access())
            for name in ("kubelet", "kube-proxy", "coredns"):
                self._start(name, *self._inside(holder.pid, commands[name]))
            self._wait(lambda: self._ready(kubeconfig_path), f"node {NODE_NAME} Ready", deadline)
            part("kubelet")
            # kube-router exits unless it finds its Node, which the kubelet registers.
            self._start("kube-router", *self._inside(holder.pid, commands["kube-router"]))
            self._wait(self._policies_enforced, "kube-router's network policy chains", deadline)
            part("kube-router")
        except BaseException:
            self.down(keep_logs=True)
            raise
        return took

    @property
    def containerd_socket(self) -> Path:
        """containerd's socket as this machine reaches it: CONTAINERD_SOCKET through the holder's root, the node's
        mount namespace. A short path whatever the state dir's (a unix socket's path has at most 107 bytes, and a
        test's state dir under the node's private /run came to 124)."""
        holder = ((self.recorded() or {}).get("processes") or {}).get("holder")
        if holder is None:
            raise NodeError(f"the node of {self.layout.root} is not running: nothing holds its mounts")
        return Path(f"/proc/{holder['pid']}/root") / CONTAINERD_SOCKET.lstrip("/")

    def images(self) -> dict[str, str]:
        """The references of the images `up` imported, by name (pause, triton, operator)."""
        return dict((self.recorded() or {}).get("images", {}))

    def _record_images(self, references: dict[str, str]) -> None:
        state = self.recorded() or {"processes": {}}
        state["images"] = references
        self.layout.state_file.write_text(json.dumps(state, indent=2))
        values = chart_values(references["operator"], references["triton"])
        self.layout.chart_values.write_text(yaml.safe_dump(values, sort_keys=False))

    def _write_files(self, server: str, sandbox_image: str) -> None:
        layout, control = self.layout, self.control
        for path in PRIVATE_PATHS:
            layout.bound(path).mkdir(parents=True, exist_ok=True)
        layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (layout.cni_conf_dir / "10-inferop.conflist").write_text(json.dumps(cni_network(), indent=2))
        (control.pki / NODE_EXTENSIONS).write_text(node_extensions(self.site))
        for argv in node_certificates(control.pki):
            _run(argv, "the node's certificates")
        layout.config("containerd.toml").write_text(containerd_config(layout, sandbox_image))
        layout.config("Corefile").write_text(corefile(self.site, layout))
        documents = {
            "kubelet.yaml": kubelet_config(self.site, layout, control),
            "kube-proxy.yaml": kube_proxy_config(self.site, layout),
            "kubelet.kubeconfig": kubeconfig(server, control, user="kubelet-client"),
            "kube-proxy.kubeconfig": kubeconfig(server, control, user="kube-proxy"),
            **{f"{program}.kubeconfig": kubeconfig(server, control, user=program) for program in NODE_USERS},
        }
        for name, document in documents.items():
            layout.config(name).write_text(yaml.safe_dump(document, sort_keys=False))

    def _make_cgroups(self) -> None:
        for hierarchy in cgroup_hierarchies():
            (hierarchy / self.site.system_cgroup).mkdir(parents=True, exist_ok=True)
            if hierarchy.name == "cpuset":  # a cpuset cgroup takes no process before it has CPUs and memory nodes
                for key in ("cpuset.cpus", "cpuset.mems"):
                    value = (hierarchy / key).read_text()
                    for cgroup in (hierarchy / self.site.cgroup_root, hierarchy / self.site.system_cgroup):
                        (cgroup / key).write_text(value)

    @staticmethod
    def _inside(holder: int, argv: list[str]) -> tuple[list[str], str]:
        """`argv` run in the node's mount and network namespaces (the holder's), and the program it becomes."""
        return ["nsenter", f"--target={holder}", "--mount", "--net", "--", *argv], argv[0]

    def _start(self, name: str, argv: list[str], becomes: str) -> subprocess.Popen[bytes]:
        """Start `argv` in its own session, in the node's system cgroup, its output in the node's log of `name`;
        it is recorded as the program it `becomes` (nsenter and unshare exec what they run)."""
        procs = [hierarchy / self.site.system_cgroup / "cgroup.procs" for hierarchy in cgroup_hierarchies()]

        def join() -> None:  # in the child, before exec: it and all it starts belong to the node
            for path in procs:
                path.write_text("0")

        with self.layout.log(name).open("wb") as log_file:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=join,
            )
        self._children[name] = process
        state = self.recorded() or {"processes": {}}
        state["processes"][name] = {"pid": process.pid, "executable": becomes}
        self.layout.state_file.write_text(json.dumps(state, indent=2))
        return process

    def _wait(self, ready: Callable[[], bool], what: str, deadline: float) -> None:
        while not ready():
            for name, process in self._children.items():
                if process.poll() is not None:
                    tail = log_tail(self.layout.log(name))
                    raise NodeError(f"{name} exited ({process.returncode}) while waiting for {what}\n{tail}")
            if time.monotonic() > deadline:
                logs = "\n".join(log_tail(self.layout.log(name)) for name in ("kubelet", "containerd"))
                raise NodeError(f"{what} not ready before the timeout\n{logs}")
            time.sleep(0.2)

    def _bound(self, holder: int) -> bool:
        """Whether the holder's mount namespace has the private directories bound (read from its mountinfo)."""
        try:
            mounts = Path(f"/proc/{holder}/mountinfo").read_text()
        except OSError:
            return False
        points = {line.split()[4] for line in mounts.splitlines()}
        return set(PRIVATE_PATHS) <= points and "sleep" in Path(f"/proc/{holder}/cmdline").read_text()

    def _apply(self, kubeconfig_path: Path, documents: list[dict[str, Any]]) -> None:
        """Server-side apply `documents` as the admin (what the node's own programs need to be allowed)."""
        assert self.kube_bin is not None
        listing = json.dumps({"apiVersion": "v1", "kind": "List", "items": documents})
        argv = [str(self.kube_bin / "kubectl"), "--kubeconfig", str(kubeconfig_path), "apply", "--server-side",
                "--field-manager=inferop-node", "-f", "-"]  # fmt: skip
        result = subprocess.run(argv, input=listing, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise NodeError(f"applying the node's RBAC failed: {result.stderr.strip()[-600:]}")

    def _policies_enforced(self) -> bool:
        """Whether kube-router has hooked its chain into the node's FORWARD chain (its first sync)."""
        listed = subprocess.run(self.site.in_network("iptables", "-S", "FORWARD"), capture_output=True, text=True)
        return f"-j {POLICY_CHAIN}" in listed.stdout

    def _containerd_answers(self) -> bool:
        argv = [str(CTR), "--address", str(self.containerd_socket), "version"]
        return subprocess.run(argv, capture_output=True, check=False).returncode == 0

    def _ready(self, kubeconfig_path: Path) -> bool:
        from kubernetes import client, config
        from kubernetes.client.exceptions import ApiException

        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig_path)))
        try:
            node = core.read_node(NODE_NAME)
            # A pod in `default` is refused until the controller-manager has made its service account.
            core.read_namespaced_service_account("default", "default")
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        conditions = (node.status and node.status.conditions) or []
        return any(c.type == "Ready" and c.status == "True" for c in conditions)

    # -- down

    def stop(self, timeout: float = 20.0) -> None:
        """Stop every process of the node (the holder, the daemons, the shims, the pods: their mounts go with the
        holder's mount namespace) and remove its cgroups; its link stays, for an apiserver that still listens there
        (which, told to stop, first deletes its lease through that address)."""
        roots = [hierarchy / self.site.cgroup_root for hierarchy in cgroup_hierarchies(unified=True)]
        try:
            remove_cgroups(roots, timeout, f"the node's cgroups ({self.site.cgroup_root})")
        except LimitsError as error:
            raise NodeError(str(error)) from None
        for process in ((self.recorded() or {}).get("processes", {})).values():
            stop_process(process["pid"], process["executable"])  # one outside the cgroups (it failed to join)
        for child in self._children.values():
            child.wait()
        self._children.clear()

    def down(self, keep_logs: bool = False) -> None:
        """Stop the node and remove its namespaces and state (logs too, unless `keep_logs`); nothing to do when
        there is no node."""
        self.stop()
        site = self.site
        if (Path("/run/netns") / site.netns).exists():
            _run(["ip", "netns", "delete", site.netns], "removing the node's network")
        if (Path("/sys/class/net") / site.host_link).exists():  # the namespace's end gone, the host's follows
            subprocess.run(["ip", "link", "delete", site.host_link], capture_output=True, check=False)
            if (Path("/sys/class/net") / site.host_link).exists():
                raise NodeError(f"the node's link could not be removed: `ip link delete {site.host_link}`")
        if self.layout.root.exists():
            logs = {path.name: path.read_bytes() for path in self.layout.root.glob("*.log")} if keep_logs else {}
            shutil.rmtree(self.layout.root)
            for name, content in logs.items():
                self.layout.root.mkdir(exist_ok=True)
                (self.layout.root / name).write_bytes(content)
        with contextlib.suppress(OSError):
            self.control.root.rmdir()  # the control plane's state dir, once nothing else lives there


def start_with_node(cluster: ControlPlane, timeout: float = 60.0) -> tuple[Node, Path, dict[str, float]]:
    """Start `cluster` (a control plane at its node site's host address) and its node, both anew: the node, its
    kubeconfig and the seconds each part took. A failure leaves neither running, the node's logs kept."""
    Node.check_host()  # before anything stops or starts
    stop_with_node(cluster)
    files = built(NODE_SCRIPT, "the node's packages and files", build=True)
    node = Node(cluster.layout, kube_binaries(release=cluster.release), addon_binaries(build=True), files)
    try:
        node.link_up()
        mark = time.monotonic()
        kubeconfig_path = cluster.up(timeout=timeout)
        took = {"control plane": round(time.monotonic() - mark, 1)}
        took |= node.up((cluster.state() or {})["server"], kubeconfig_path, timeout=max(timeout, 120.0))
    except BaseException:
        node.stop()
        cluster.down()
        node.down(keep_logs=True)
        raise
    return node, kubeconfig_path, took


def stop_with_node(cluster: ControlPlane, timeout: float = 10.0) -> None:
    """Stop the node of `cluster`, then its control plane, then remove the node's namespaces and state; in that
    order, so the apiserver still reaches its address while it stops."""
    node = Node(cluster.layout)
    node.stop()
    cluster.down(timeout=timeout)
    node.down()

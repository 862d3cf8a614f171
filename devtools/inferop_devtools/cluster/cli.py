"""`inferop cluster up|down|status`: a local cluster, `eval "$(inferop cluster up)"` to use it.

On the current release `up` starts one real node beside the control plane (inferop_devtools.cluster.node):
containerd, runc, the CNI plugins, the kubelet and kube-proxy, in namespaces of their own, with the local Triton image
imported, so an applied InferenceService runs and answers. Only `up`'s `export` lines go to stdout (KUBECONFIG; PATH
with the project's kubectl and helm first; INFEROP_TRITON_IMAGE and INFEROP_FETCH_IMAGE for an operator run from the
same shell; INFEROP_CHART_VALUES for helm); progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
import time
from pathlib import Path

from inferop_devtools.cluster.controlplane import (
    KUBERNETES_1_37,
    KUBERNETES_RELEASES,
    LOOPBACK,
    ClusterError,
    ControlPlane,
    default_state_dir,
    process_running,
)
from inferop_devtools.cluster.node import NODE_NAME, Node, NodeSite, start_with_node, stop_with_node
from inferop_devtools.cluster.tools import kube_tools


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "action",
        choices=["up", "down", "status"],
        help="up: start (or find running) and print `export KUBECONFIG=...`; down: stop and remove the "
        "state; status: exit 0 when healthy, 1 when not",
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="certificates, etcd data, logs, pids and kubeconfig "
        "(default: $INFEROP_CLUSTER_DIR, else ~/.cache/inferop/cluster)",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for readiness (up) or exit (down)")
    parser.add_argument(
        "--kubernetes",
        choices=list(KUBERNETES_RELEASES),
        default=KUBERNETES_1_37.name,
        help="the release `up` starts (default: the current one), its binaries built once by its script in "
        "scripts/ (1.20: kube-binaries.sh, from Debian's source package; 1.37: kube-current.sh, from the Go module "
        "proxy); "
        "down and status act on whichever release runs",
    )
    parser.add_argument(
        "--no-node",
        action="store_true",
        help="up: start no node (pods then stay Pending; the apiserver listens on 127.0.0.1 only); without it the "
        "current release gets a real one: containerd, the kubelet and kube-proxy (scripts/kube-node.sh and "
        "scripts/kube-current.sh provide them, as root)",
    )


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    state_dir = args.state_dir or default_state_dir()
    release = KUBERNETES_RELEASES[args.kubernetes]
    with_node = args.action == "up" and not args.no_node and release.schedules_pods
    address = NodeSite.of(state_dir).host_address if with_node else LOOPBACK
    cluster = ControlPlane(state_dir, release=release, address=address)
    node = Node(cluster.layout)
    try:
        if args.action == "up":
            return _up(cluster, node, with_node, args.timeout)
        if args.action == "down":
            stop_with_node(cluster, timeout=min(args.timeout, 10.0))
            print(f"control plane and node down ({cluster.layout.root} cleaned)", file=sys.stderr)
            return 0
        return _print_status(cluster, node)
    except ClusterError as error:
        print(f"inferop cluster {args.action}: {error}", file=sys.stderr)
        return 1


def _up(cluster: ControlPlane, node: Node, with_node: bool, timeout: float) -> int:
    """Start what is not running (a node needs its control plane listening where the node reaches it, so a change
    of either starts both anew) and print the export line."""
    cluster.refuse_another_release()
    started = time.monotonic()
    if with_node and not (cluster.healthy() and node.running()):
        node, kubeconfig, took = start_with_node(cluster, timeout)
        parts = ", ".join(f"{part} {seconds:g} s" for part, seconds in took.items())
        print(f"node {NODE_NAME} Ready in {time.monotonic() - started:.1f} s ({parts})", file=sys.stderr)
    else:
        if not with_node:
            node.down()
        kubeconfig = cluster.up(timeout=timeout)
        if not with_node:
            print("no node: pods stay Pending", file=sys.stderr)
    print(f"export KUBECONFIG={shlex.quote(str(kubeconfig))}")
    print(f'export PATH={shlex.quote(str(kube_tools()))}:"$PATH"')  # kubectl and helm (scripts/helm-kubectl.sh)
    images = node.images()
    if triton := images.get("triton"):  # the operator's default for services that name no image
        print(f"export INFEROP_TRITON_IMAGE={shlex.quote(triton)}")
        # the image whose `inferop fetch` brings a model from object storage into its pod: the operator's own
        print(f"export INFEROP_FETCH_IMAGE={shlex.quote(images['operator'])}")
        # `helm install ... -f "$INFEROP_CHART_VALUES"`: the chart with the node's own operator and Triton images
        print(f"export INFEROP_CHART_VALUES={shlex.quote(str(node.layout.chart_values))}")
    return 0


def _print_status(cluster: ControlPlane, node: Node) -> int:
    summary = cluster.status()
    print(f"state dir:  {summary['state_dir']}")
    if "server" not in summary:
        print("status:     down")
        return 1
    health = "up" if summary["healthy"] else "NOT HEALTHY (`inferop cluster up` restarts it)"
    print(f"status:     {health}")
    print(f"release:    {summary['release']}")
    print(f"server:     {summary['server']}")
    print(f"kubeconfig: {summary['kubeconfig']}")
    if summary["healthy"]:
        print(f"kubernetes: {summary.get('kubernetes')}")
        print(f"etcd:       {summary.get('etcd')}")
    for name, proc in summary["processes"].items():
        print(f"{name + ':':<25}pid {proc['pid']} {'running' if proc['running'] else 'GONE'}")
    recorded = node.recorded()
    if recorded is None:
        print("node:       none (pods stay Pending; `inferop cluster up` adds one on the current release)")
        return 0 if summary["healthy"] else 1
    state = "running" if node.running() else "NOT RUNNING (`inferop cluster up` starts it again)"
    print(f"node:       {NODE_NAME} at {node.site.node_address}, {state}")
    for name, proc in recorded.get("processes", {}).items():
        alive = "running" if process_running(proc["pid"], proc["executable"]) else "GONE"
        print(f"{name + ':':<25}pid {proc['pid']} {alive}")
    return 0 if summary["healthy"] and node.running() else 1

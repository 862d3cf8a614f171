"""`inferop cluster up|down|status`: a local control plane, `eval "$(inferop cluster up)"` to use it.

On the current release `up` also starts one fake node (kwok), where the kube-scheduler places pods and kwok reports
them Running and Ready, so an applied InferenceService becomes Ready; no container runs. Only `up`'s
`export KUBECONFIG=...` line goes to stdout; progress and errors go to stderr.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from pathlib import Path

from inferop_devtools.cluster.addons import LocalNode
from inferop_devtools.cluster.controlplane import (
    KUBERNETES_1_37,
    KUBERNETES_RELEASES,
    ClusterError,
    ControlPlane,
    default_state_dir,
)


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
        help="up: start no fake node (pods then stay Pending); without it the current release gets one, played by "
        "kwok (built by scripts/kube-addons.sh)",
    )


def run(args: argparse.Namespace) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    cluster = ControlPlane(args.state_dir or default_state_dir(), release=KUBERNETES_RELEASES[args.kubernetes])
    node = LocalNode(cluster.layout.root)
    try:
        if args.action == "up":
            if not cluster.healthy():
                node.down()  # a node of an earlier control plane watches ports that are gone
            kubeconfig = cluster.up(timeout=args.timeout)
            release = cluster.release
            if args.no_node:
                node.down()
                print("no node (--no-node): pods stay Pending", file=sys.stderr)
            elif not release.schedules_pods:
                print(
                    f"no node: Kubernetes {release.name} here runs no kube-scheduler, so pods stay Pending",
                    file=sys.stderr,
                )
            else:
                node.up(kubeconfig, timeout=args.timeout)
                print(
                    f"node {LocalNode.NAME} Ready (kwok: pods are scheduled and reported Running and Ready, no "
                    "container runs)",
                    file=sys.stderr,
                )
            print(f"export KUBECONFIG={shlex.quote(str(kubeconfig))}")
            return 0
        if args.action == "down":
            node.down()
            cluster.down(timeout=min(args.timeout, 10.0))
            print(f"control plane down ({cluster.layout.root} cleaned)", file=sys.stderr)
            return 0
        return _print_status(cluster, node)
    except ClusterError as error:
        print(f"inferop cluster {args.action}: {error}", file=sys.stderr)
        return 1


def _print_status(cluster: ControlPlane, node: LocalNode) -> int:
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
    else:
        state = "running" if node.running() else "GONE (`inferop cluster up` starts it again)"
        print(f"node:       {LocalNode.NAME}, played by kwok (no container runs)")
        print(f"{'kwok:':<25}pid {recorded['pid']} {state}")
    return 0 if summary["healthy"] else 1

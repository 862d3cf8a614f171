"""What the tests on the local cluster's real node share: `inferop cluster up|down`, kubectl with the environment
`up` gives, what a node may leave on the host, and an exported model as a service that fits beside the operator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferop_devtools.cluster.controlplane import KUBERNETES_1_37, kube_binaries
from inferop_devtools.cluster.node import NodeSite, cgroup_hierarchies
from inferop_export.manifest import build_manifest
from inferop_operator.plan import memory_limit, plan_service
from inferop_operator.spec import Threads, parse_spec
from tests.helpers import ExportedRepo

INFEROP = [sys.executable, "-m", "inferop_core.cli"]
# How long a test waits for `kubectl delete --wait=true` of an InferenceService: the operator's finalizer runs, then
# its pods end within their grace (5 + 10 + 15 s for a serving pod); 60 s ran out once on a loaded machine (the
# Inception pipeline's teardown in a 63-minute make test, its checks all passed).
DELETE_SECONDS = 180


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [*INFEROP, "cluster", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=False)


def traces(state_dir: Path) -> dict[str, Any]:
    """What a node of `state_dir` may leave on this machine: processes in its cgroups, its cgroups, its network
    namespace and link, mounts of its state dir, the host's iptables rules."""
    site = NodeSite.of(state_dir)
    roots = [hierarchy / site.cgroup_root for hierarchy in cgroup_hierarchies(unified=True)]
    mounts = Path("/proc/self/mountinfo").read_text()
    rules = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
    return {
        "cgroups": [str(root) for root in roots if root.exists()],
        "netns": (Path("/run/netns") / site.netns).exists(),
        "link": (Path("/sys/class/net") / site.host_link).exists(),
        "mounts": [line for line in mounts.splitlines() if str(state_dir) in line],
        "iptables": [line for line in rules.splitlines() if not line.startswith("#")],
        "host paths": [p for p in ("/run/containerd", "/var/lib/kubelet", "/var/log/pods") if Path(p).exists()],
    }


class Cluster:
    """A cluster that `inferop cluster up` started in `state_dir`, and kubectl against it, with the environment
    `eval "$(inferop cluster up)"` gives (`exports`, the lines `up` printed)."""

    def __init__(self, state_dir: Path, exports: str) -> None:
        self.state_dir = state_dir
        self.kubectl = str(kube_binaries(build=False, release=KUBERNETES_1_37) / "kubectl")
        variables = dict(line.removeprefix("export ").split("=", 1) for line in exports.splitlines())
        variables["PATH"] = variables["PATH"].replace('"$PATH"', os.environ["PATH"])  # as the shell expands it
        self.env = {**os.environ, **variables}

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> str:
        result = subprocess.run(
            [self.kubectl, *args], capture_output=True, text=True, env=self.env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)}: {result.stderr}")
        return result.stdout + result.stderr

    def apply(self, *documents: dict[str, Any]) -> None:
        subprocess.run(
            [self.kubectl, "apply", "-f", "-"],
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": list(documents)}),
            text=True,
            env=self.env,
            check=True,
            capture_output=True,
        )

    def ready_pod(self, service: str) -> dict[str, Any]:
        """The one pod of InferenceService `service`, once the service is Ready (what both say, where it is not)."""
        ready = self.run(
            "wait", "--for=condition=Ready", f"infsvc/{service}", "--timeout=120s", check=False, timeout=130
        )
        assert "condition met" in ready, self.run("describe", "infsvc,pods", check=False)
        selector = f"app.kubernetes.io/instance={service}"
        (pod,) = json.loads(self.run("get", "pods", "-l", selector, "-o", "json"))["items"]
        return dict(pod)

    def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.run("get", "pod", name, "-o", "json"))
        return found

    def run_in_node(self, *argv: str, timeout: float = 60) -> str:
        """`argv`'s output, run in the node's network namespace (a caller of a pod's address)."""
        argv_in_node = NodeSite.of(self.state_dir).in_network(*argv)
        result = subprocess.run(argv_in_node, capture_output=True, text=True, timeout=timeout, check=False)
        if result.returncode != 0:
            pytest.fail(f"{' '.join(argv)} in the node's network: {result.stderr}")
        return result.stdout


def one_cpu(name: str, repo: ExportedRepo, model: str, changes: dict[str, Any] | None = None) -> dict[str, Any]:
    """`model` of `repo` as an InferenceService at one thread and one CPU (a 2-CPU node holds it beside the
    operator's pod), with `changes` to its spec's sections, its memory limit the plan's for them."""
    spec = repo.reports[model].spec.model_copy(update={"threads": Threads(intra_op=1, inter_op=1)})
    manifest = build_manifest(spec, name, "1")
    manifest["spec"]["model"]["storageUri"] = f"hostpath://{repo.path / model}"
    for section, fields in (changes or {}).items():
        place = manifest["spec"]
        for key in section.split("."):
            place = place.setdefault(key, {})
        place.update(fields)
    planned = plan_service(parse_spec(manifest["spec"])).memory.required_bytes
    manifest["spec"]["resources"]["requests"]["memory"] = memory_limit(planned)
    manifest["spec"]["resources"]["limits"]["memory"] = memory_limit(planned)
    return manifest

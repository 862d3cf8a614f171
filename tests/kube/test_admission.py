"""Admission of an InferenceService the spec model refuses: the CRD's CEL rules (tests/operator/test_crd.py) refuse it
at `kubectl apply` on a release that evaluates them, in the model's words; on one that predates them (1.20: the
apiserver drops x-kubernetes-validations from the CRD) the object is stored and the operator says the same in its
Valid condition."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.controlplane import KubernetesRelease
from inferop_operator.identity import CRD_NAME
from inferop_operator.spec import SpecError, parse_spec
from tests.helpers import wait_for
from tests.kube.helpers import EXAMPLES, Kubectl

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]

# Whether the release's apiserver evaluates a CRD's x-kubernetes-validations (beta and on by default since 1.25).
EVALUATES_CEL_RULES = {"1.20": False, "1.37": True}


def conv_net(name: str, **spec: Any) -> dict[str, Any]:
    """The conv net example as `name`, `spec` fields laid over its spec (a `model` dict over its model)."""
    service = yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())
    service["metadata"]["name"] = name
    service["spec"]["model"].update(spec.pop("model", {}))
    service["spec"].update(spec)
    return dict(service)


REFUSED = [
    pytest.param(conv_net("bad-range", autoscaling={"minReplicas": 3, "maxReplicas": 2, "target": 50}), id="replicas"),
    pytest.param(
        conv_net("tensors-with-mean", model={"processing": {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2]}}),
        id="processing",
    ),
    pytest.param(conv_net("short-rollout", rollout={"steps": [5, 25]}), id="rollout"),
]


def model_refusal(service: dict[str, Any]) -> tuple[str, str]:
    """The field path and message the spec model refuses `service` with."""
    with pytest.raises(SpecError) as refused:
        parse_spec(service["spec"])
    path, _, message = str(refused.value).partition(": ")
    return path, message


@pytest.mark.parametrize("service", REFUSED)
def test_a_spec_the_model_refuses_is_refused_with_its_message(
    kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease, service: dict[str, Any]
) -> None:
    path, message = model_refusal(service)
    name = service["metadata"]["name"]
    result = kubectl.run("apply", "-n", namespace, "-f", "-", stdin=yaml.safe_dump(service), check=False)

    if EVALUATES_CEL_RULES[kubernetes.name]:
        assert result.returncode != 0
        # 1.37 says `spec.autoscaling: Invalid value: <message>` (earlier releases put "object": before it).
        assert re.search(
            rf'{re.escape(path)}: Invalid value: ("object": )?{re.escape(message)}$', result.stderr, re.M
        ), result.stderr
        assert kubectl.get("infsvc", name, namespace) is None
        return

    assert result.returncode == 0, result.stderr
    crd = kubectl.get("crd", CRD_NAME, "")
    assert crd is not None and "x-kubernetes-validations" not in str(crd["spec"]), "1.20 drops the rules"

    def valid() -> dict[str, Any] | None:
        service = kubectl.get("infsvc", name, namespace) or {}
        conditions = (service.get("status") or {}).get("conditions", [])
        return next((c for c in conditions if c["type"] == "Valid"), None)

    condition = wait_for(valid, what="the Valid condition")
    assert (condition["status"], condition["reason"]) == ("False", "InvalidSpec")
    assert f"{path}: {message}" in condition["message"]
    assert kubectl.get("deployment", name, namespace) is None

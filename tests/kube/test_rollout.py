"""Rollouts on the real control plane, without a data plane (tests/devtools/test_rollout_dataplane.py has one): a
changed spec runs as a candidate beside the stable pods, which it never replaces unasked; header matches and
mirroring are refused without a gateway; with Gateway API's CRDs (1.37) the operator's HTTPRoute is what their schema
admits, and a Gateway that does not exist is named. Pods run on kwok (1.37) at loopback addresses where nothing
serves: the agreement check cannot reach them, so a candidate waits at its agreement and no traffic ever moves."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.controlplane import KubernetesRelease
from inferop_operator.identity import CONFIG_HASH_ANNOTATION
from tests.helpers import WebhookReceiver, wait_for
from tests.kube.helpers import GATEWAY_API, Kubectl, apply_text, condition, manifest, runs_pods

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]
ROLLOUT = {"steps": [50, 100], "stepSeconds": 5}


def rollout_of(kubectl: Kubectl, name: str, namespace: str) -> dict[str, Any]:
    return dict(((kubectl.get("infsvc", name, namespace) or {}).get("status") or {}).get("rollout") or {})


def patch(kubectl: Kubectl, name: str, namespace: str, spec: dict[str, Any]) -> None:
    kubectl.run("patch", "infsvc", name, "-n", namespace, "--type=merge", "-p", json.dumps({"spec": spec}))


def config_hash(deployment: dict[str, Any]) -> str:
    return str(deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])


def test_a_change_runs_as_a_candidate_beside_the_stable_pods_until_aborted(
    kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
) -> None:
    name = "rolled"
    apply_text(kubectl, namespace, manifest(name, rollout=ROLLOUT))
    stable = wait_for(lambda: kubectl.get("deployment", name, namespace), what="the stable Deployment")
    wait_for(lambda: rollout_of(kubectl, name, namespace).get("stable"), what="the stable revision in the status")
    patch(kubectl, name, namespace, {"batching": {"maxBatchSize": 8}})

    state = wait_for(
        lambda: (s := rollout_of(kubectl, name, namespace)).get("phase") == "Agreement" and s, what="Agreement"
    )
    assert state["candidate"] != state["stable"] and state["weight"] == 0
    candidate = wait_for(lambda: kubectl.get("deployment", f"{name}-canary", namespace), what="the candidate")
    assert candidate["spec"]["replicas"] == 1
    assert candidate["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "canary"
    config = kubectl.get("configmap", f"{name}-canary-config", namespace)
    assert config is not None and "max_batch_size: 8" in config["data"]["config.pbtxt"]
    # The stable pods serve what they served; the one Service still selects them alone.
    assert config_hash(kubectl.get("deployment", name, namespace) or {}) == config_hash(stable)
    service = kubectl.get("service", name, namespace) or {}
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "predictor"
    # No gateway is named: no HTTPRoute is written (checked where Gateway API is served at all).
    served = kubectl.run("api-resources", f"--api-group={GATEWAY_API}", "-o", "name", check=False).stdout
    if "httproutes" in served:
        assert kubectl.get(f"httproutes.{GATEWAY_API}", name, namespace) is None

    if runs_pods(kubernetes):  # the candidate's pod runs, at an address where nothing answers
        waiting = wait_for(
            lambda: (s := rollout_of(kubectl, name, namespace)).get("reason") == "AgreementPending" and s,
            what="the agreement check to wait",
            timeout=60,
        )
        assert "agreement check waits" in waiting["message"] and waiting["weight"] == 0

    patch(kubectl, name, namespace, {"rollout": {"abort": state["candidate"]}})
    back = wait_for(
        lambda: (s := rollout_of(kubectl, name, namespace)).get("phase") in ("RollingBack", "RolledBack") and s,
        what="the abort",
    )
    assert (back["reason"], back["weight"]) == ("Aborted", 0)
    if runs_pods(kubernetes):  # both Deployments ready: the candidate drains, then goes
        wait_for(
            lambda: rollout_of(kubectl, name, namespace).get("phase") == "RolledBack", what="RolledBack", timeout=60
        )
        wait_for(lambda: kubectl.get("deployment", f"{name}-canary", namespace) is None, what="the candidate gone")
        rolled = kubectl.get("infsvc", name, namespace)
        assert (condition(rolled, "Rollout") or {}).get("status") == "False"
    assert config_hash(kubectl.get("deployment", name, namespace) or {}) == config_hash(stable)


def inferop_rollout(kubectl: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
    inferop = Path(sys.executable).with_name("inferop")
    return subprocess.run(
        [str(inferop), "rollout", *args], env=kubectl.env, capture_output=True, text=True, timeout=90, check=False
    )


def test_inferop_rollout_sees_and_steers_the_rollout(
    kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease, measured: Callable[[str], None]
) -> None:
    """pause, a promote the phase refuses, status, abort and retry, each through the spec field the operator acts
    on; the webhook receives each move."""
    name = "steered"
    receiver = WebhookReceiver(failures=1)  # the operator runs on this machine: 127.0.0.1 reaches it
    apply_text(kubectl, namespace, manifest(name, rollout={**ROLLOUT, "webhook": {"url": receiver.url}}))
    wait_for(lambda: rollout_of(kubectl, name, namespace).get("stable"), what="the stable revision in the status")
    patch(kubectl, name, namespace, {"batching": {"maxBatchSize": 8}})
    state = wait_for(
        lambda: (s := rollout_of(kubectl, name, namespace)).get("phase") == "Agreement" and s, what="Agreement"
    )

    paused = inferop_rollout(kubectl, "pause", name, "-n", namespace)
    assert paused.returncode == 0 and "held at its step" in paused.stdout, paused.stderr
    assert (kubectl.get("infsvc", name, namespace) or {})["spec"]["rollout"]["paused"] is True
    refused = inferop_rollout(kubectl, "promote", name, "-n", namespace)
    assert refused.returncode == 2
    assert f"cannot promote {name}: its rollout is Agreement (only in Paused, Progressing)" in refused.stderr
    written = (kubectl.get("infsvc", name, namespace) or {})["spec"]["rollout"]
    assert not {"endStep", "promote"} & set(written)  # nothing written
    shown = inferop_rollout(kubectl, "status", name, "-n", namespace)
    assert shown.stdout.startswith("Agreement:") and f"candidate {state['candidate']}" in shown.stdout, shown.stderr

    aborted = inferop_rollout(kubectl, "abort", name, "-n", namespace)
    assert aborted.returncode == 0, aborted.stderr + aborted.stdout
    assert (rollout_of(kubectl, name, namespace)["reason"]) == "Aborted"
    measured(aborted.stdout.strip())
    if runs_pods(kubernetes):  # the candidate drains, then goes: the rollout ends, and may be retried
        wait_for(
            lambda: rollout_of(kubectl, name, namespace).get("phase") == "RolledBack", what="RolledBack", timeout=60
        )
        retried = inferop_rollout(kubectl, "retry", name, "-n", namespace)
        assert retried.returncode == 0, retried.stderr + retried.stdout
        again = rollout_of(kubectl, name, namespace)
        assert (again["phase"], again["candidate"]) == ("Agreement", state["candidate"])
        assert again["retried"].startswith(f"{state['candidate']}/")
        assert "abort" not in (kubectl.get("infsvc", name, namespace) or {})["spec"]["rollout"]
        measured(retried.stdout.strip())

    def phases() -> list[tuple[str, str, str | None]]:
        posted = receiver.accepted
        return [(each["name"], each["rollout"]["phase"], each["rollout"].get("reason")) for each in posted]

    wait_for(lambda: (name, "RollingBack", "Aborted") in phases(), what="the abort posted to the webhook")
    assert phases()[0] == (name, "Agreement", "CandidateStarting"), phases()  # its first post failed, then retried
    receiver.server.shutdown()
    missing = inferop_rollout(kubectl, "status", "nowhere", "-n", namespace)
    assert (missing.returncode, missing.stderr.strip()) == (
        2,
        f"inferop: InferenceService nowhere not found in namespace {namespace}",
    )


def test_header_matches_and_mirroring_need_a_gateway(kubectl: Kubectl, namespace: str) -> None:
    name = "no-gateway"
    rollout = {**ROLLOUT, "header": {"name": "x-ab", "value": "b"}, "shadow": {"percent": 20}}
    apply_text(kubectl, namespace, manifest(name, rollout=rollout))
    refused = wait_for(
        lambda: (c := condition(kubectl.get("infsvc", name, namespace), "Rollout")) and c["status"] == "False" and c,
        what="the Rollout condition",
    )
    assert refused["reason"] == "NeedsGateway"
    assert "spec.rollout.header and spec.rollout.shadow need a Gateway API implementation" in refused["message"]
    assert "install Gateway API's CRDs and an implementation" in refused["message"]
    assert kubectl.get("deployment", name, namespace) is None  # nothing deployed for a spec that cannot run


@pytest.mark.usefixtures("gateway_api")
def test_the_route_attaches_to_the_gateway_named_and_its_schema_admits_it(kubectl: Kubectl, namespace: str) -> None:
    name = "routed"
    gateway = {"name": "missing", "hostnames": ["routed.example.com"]}
    apply_text(kubectl, namespace, manifest(name, gateway=gateway, rollout=ROLLOUT))
    missing = wait_for(
        lambda: (
            (c := condition(kubectl.get("infsvc", name, namespace), "ChildrenApplied")) and c["status"] == "False" and c
        ),
        what="the missing Gateway named",
    )
    assert missing["reason"] == "GatewayNotFound"
    assert f"spec.gateway.name: Gateway missing does not exist in namespace {namespace}" in missing["message"]
    assert (kubectl.get("infsvc", name, namespace) or {})["status"]["phase"] == "Pending"

    gateway_object = {
        "apiVersion": f"{GATEWAY_API}/v1",
        "kind": "Gateway",
        "metadata": {"name": "public"},
        "spec": {"gatewayClassName": "any", "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}]},
    }
    apply_text(kubectl, namespace, yaml.safe_dump(gateway_object))
    patch(kubectl, name, namespace, {"gateway": {**gateway, "name": "public"}})
    # Retried 5, 10, 20 s after the Gateway was found missing: the route follows within that.
    route = wait_for(lambda: kubectl.get(f"httproutes.{GATEWAY_API}", name, namespace), what="the route", timeout=60)
    assert route["spec"]["parentRefs"][0]["name"] == "public"
    assert route["spec"]["parentRefs"][0]["namespace"] == namespace
    assert route["spec"]["hostnames"] == ["routed.example.com"]
    (rule,) = route["spec"]["rules"]
    # Every request to the stable Service: the second backendRef, a rollout's candidate, is parked on it.
    assert [(b["name"], b["port"], b["weight"]) for b in rule["backendRefs"]] == [(name, 8000, 10_000), (name, 8000, 1)]
    assert route["metadata"]["ownerReferences"][0]["name"] == name

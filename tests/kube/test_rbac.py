"""The chart's RBAC really suffices and really limits.

The chart is installed, a token of its ServiceAccount is requested (TokenRequest API), and `inferop
operator` runs out of cluster with nothing but that token, exactly as the chart starts it. It must
reconcile the examples without a single forbidden request; `kubectl auth can-i --as` shows what the
account cannot do.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.controlplane import ControlPlane, KubernetesRelease, free_ports
from inferop_devtools.cluster.tools import kube_tools
from inferop_operator.identity import CRD_NAME
from tests.helpers import wait_for
from tests.kube.helpers import (
    AUTOSCALING,
    CONV_NET_THREADS,
    DISRUPTION_BUDGET,
    EXAMPLES,
    GATEWAY_API,
    Kubectl,
    OperatorRunner,
)
from tests.kube.test_chart import CHART, Helm

pytestmark = pytest.mark.integration

# Rules every authenticated account has (system:basic-user, system:discovery): not the chart's doing.
# What every authenticated account may do, by the release's own default roles (system:basic-user and kin), not by
# the chart: asking about itself on every release; since 1.28 `kubectl auth whoami`, and since 1.33 reading
# ClusterTrustBundles (public CA certificates).
BASELINE = {
    "selfsubjectaccessreviews.authorization.k8s.io",
    "selfsubjectrulesreviews.authorization.k8s.io",
    "selfsubjectreviews.authentication.k8s.io",
    "clustertrustbundles.certificates.k8s.io",
}


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(kube_tools(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="module")
def sole_operator(request: pytest.FixtureRequest) -> Iterator[None]:
    """The session's operator runs with admin credentials and would reconcile our examples too: it is
    stopped while this module runs, so the chart's identity is the only one acting."""
    runner: OperatorRunner = request.getfixturevalue("operator")
    runner.stop()
    yield
    runner.start()


@dataclass
class Installed:
    release: str
    namespace: str  # the release's: the operator's Deployment and ServiceAccount live here
    watched: str  # where the examples go
    other: str  # a namespace the operator has no business in
    kubeconfig: Path  # the ServiceAccount's token and nothing else
    log: Path
    account: str = ""  # the chart's ServiceAccount unless set

    def __post_init__(self) -> None:
        self.account = self.account or f"{self.release}-inferop"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


def token_kubeconfig(admin_kubeconfig: Path, token: str, path: Path) -> Path:
    """Same server and CA as the admin's kubeconfig, the ServiceAccount's bearer token as the user."""
    admin = yaml.safe_load(admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "inferop", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "inferop", "user": "operator"}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def health(port: int) -> int:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
            return int(response.status)
    except OSError:
        return 0


@contextlib.contextmanager
def operator_process(installed: Installed, *scope: str) -> Iterator[subprocess.Popen[bytes]]:
    """`inferop operator` as the chart runs it (liveness endpoint included), with the token kubeconfig."""
    port = free_ports(1)[0]
    env = {
        **os.environ,
        "KUBECONFIG": str(installed.kubeconfig),
        "INFEROP_LOG_FORMAT": "plain",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "inferop_core.cli", "operator", f"--liveness=http://127.0.0.1:{port}/healthz", *scope]
    with installed.log.open("wb") as log:
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or health(port) == 200, timeout=30, what="liveness endpoint")
        assert process.poll() is None, installed.log.read_text()[-3000:]
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def install(helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, tmp: Path, *values: str) -> Installed:
    suffix = uuid.uuid4().hex[:6]
    installed = Installed(
        release=f"rbac-{suffix}",
        namespace=f"rbac-{suffix}",
        watched=f"rbac-{suffix}-models",
        other=f"rbac-{suffix}-other",
        kubeconfig=tmp / "operator.kubeconfig",
        log=tmp / "operator.log",
    )
    for name in (installed.namespace, installed.watched, installed.other):
        kubectl.run("create", "namespace", name)
    values = tuple(v.replace("WATCHED", installed.watched) for v in values)
    helm.run(
        "install",
        installed.release,
        str(CHART),
        "-n",
        installed.namespace,
        *values,
        *control_plane.release.helm_install_flags,
        kubeconfig=control_plane.kubeconfig,
    )
    login(kubectl, control_plane, installed)
    return installed


def login(kubectl: Kubectl, control_plane: ControlPlane, installed: Installed) -> None:
    """A short-lived token of the account (`kubectl create token` posts a TokenRequest to
    serviceaccounts/token, which Kubernetes 1.20 serves) written into the account's kubeconfig."""
    token = kubectl.run("create", "token", installed.account, "-n", installed.namespace, "--duration=1h").stdout
    token_kubeconfig(control_plane.kubeconfig, token.strip(), installed.kubeconfig)


def uninstall(helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, installed: Installed) -> None:
    helm.run(
        "uninstall", installed.release, "-n", installed.namespace, kubeconfig=control_plane.kubeconfig, check=False
    )
    for name in (installed.namespace, installed.watched, installed.other):
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


def forbidden_lines(installed: Installed) -> list[str]:
    """Requests the API server's authorizer refused to the account (RBAC's words: `User "..." cannot`)."""
    text = installed.log.read_text(errors="replace")
    return [
        line
        for line in text.splitlines()
        if f'User \\"{installed.user}\\" cannot' in line or f'User "{installed.user}" cannot' in line
    ]


def as_operator(kubectl: Kubectl, installed: Installed, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl with the operator's own token: proof the kubeconfig holds that identity and no other."""
    return kubectl.run("--kubeconfig", str(installed.kubeconfig), *args, check=False)


def can_i(kubectl: Kubectl, installed: Installed, verb: str, resource: str, namespace: str | None) -> bool:
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    result = kubectl.run("auth", "can-i", verb, resource, *scope, f"--as={installed.user}", check=False)
    assert result.stdout.strip() in ("yes", "no"), result.stderr
    return result.stdout.strip() == "yes"


def granted(kubectl: Kubectl, installed: Installed, namespace: str) -> dict[str, set[str]]:
    """resource -> verbs the account holds in `namespace` (`kubectl auth can-i --list`), baseline removed."""
    out = kubectl.run("auth", "can-i", "--list", "-n", namespace, f"--as={installed.user}").stdout
    rules: dict[str, set[str]] = {}
    for line in out.splitlines()[1:]:
        if line.startswith(" "):
            continue  # non-resource URLs (discovery, health) every account may read
        resource, verbs = line.split()[0], line[line.rindex("[") + 1 : line.rindex("]")].split()
        if resource not in BASELINE:
            rules.setdefault(resource, set()).update(verbs)
    return rules


def condition(service: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    return next((c for c in ((service or {}).get("status") or {}).get("conditions", []) if c["type"] == kind), None)


def events(kubectl: Kubectl, namespace: str, name: str) -> dict[str, str]:
    """reason -> type of the Events about InferenceService `name`."""
    items = json.loads(kubectl.run("get", "events", "-n", namespace, "-o", "json").stdout)["items"]
    return {e["reason"]: e["type"] for e in items if e["involvedObject"]["name"] == name}


@pytest.fixture(scope="module")
def namespaced(
    helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    installed = install(
        helm, kubectl, control_plane, tmp_path_factory.mktemp("rbac-ns"), "--set", "watchNamespace=WATCHED"
    )
    yield installed
    uninstall(helm, kubectl, control_plane, installed)


@pytest.fixture(scope="module")
def cluster_wide(
    helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Installed]:
    installed = install(helm, kubectl, control_plane, tmp_path_factory.mktemp("rbac-cw"))
    yield installed
    uninstall(helm, kubectl, control_plane, installed)


@pytest.mark.usefixtures("sole_operator")
class TestNamespaced:
    @pytest.fixture()
    def installed(self, namespaced: Installed) -> Installed:
        return namespaced

    def test_the_token_is_the_accounts_and_holds_nothing_more(self, kubectl: Kubectl, installed: Installed) -> None:
        assert as_operator(kubectl, installed, "get", "infsvc", "-n", installed.watched).returncode == 0
        refused = as_operator(kubectl, installed, "get", "secrets", "-n", installed.watched)
        assert refused.returncode != 0
        assert f'User "{installed.user}" cannot list resource "secrets"' in refused.stderr

    def test_examples_reconcile_with_the_charts_identity(self, kubectl: Kubectl, installed: Installed) -> None:
        ns = installed.watched
        with operator_process(installed, f"--namespace={ns}"):
            assert kubectl.apply(installed.other, EXAMPLES / "conv-net.yaml").returncode == 0
            applied = kubectl.apply(ns, EXAMPLES / "conv-net.yaml", EXAMPLES / "refused" / "oversubscribed.yaml")
            assert applied.returncode == 0, applied.stderr

            deployment = wait_for(lambda: kubectl.get("deployment", "conv-net", ns), timeout=30, what="Deployment")
            assert deployment["metadata"]["ownerReferences"][0]["name"] == "conv-net"
            assert kubectl.get("configmap", "conv-net-config", ns) is not None
            assert kubectl.get("service", "conv-net", ns) is not None
            status = wait_for(
                lambda: (kubectl.get("infsvc", "conv-net", ns) or {}).get("status", {}).get("threads"), what="status"
            )
            assert status == CONV_NET_THREADS
            assert wait_for(lambda: events(kubectl, ns, "conv-net").get("Reconciled"), what="event") == "Normal"

            budget = wait_for(
                lambda: condition(kubectl.get("infsvc", "oversubscribed", ns), "ThreadBudget"), what="refusal"
            )
            assert (budget["status"], budget["reason"]) == ("False", "Oversubscribed")
            assert (
                wait_for(lambda: events(kubectl, ns, "oversubscribed").get("Oversubscribed"), what="event") == "Warning"
            )
            assert kubectl.get("deployment", "oversubscribed", ns) is None

            # The namespace it does not watch is left alone: no children, no status.
            assert kubectl.get("deployment", "conv-net", installed.other) is None
            assert "status" not in (kubectl.get("infsvc", "conv-net", installed.other) or {})
        assert forbidden_lines(installed) == []

    def test_a_disruption_budget_comes_with_the_second_replica_and_goes_with_it(
        self, kubectl: Kubectl, installed: Installed, kubernetes: KubernetesRelease
    ) -> None:
        ns = installed.watched
        pdb = DISRUPTION_BUDGET[kubernetes.name]
        paired = yaml.safe_load((EXAMPLES / "conv-net.yaml").read_text())
        paired["metadata"]["name"] = "paired"
        paired["spec"]["replicas"] = 2
        with operator_process(installed, f"--namespace={ns}"):
            kubectl.run("apply", "-n", ns, "-f", "-", stdin=yaml.safe_dump(paired))
            budget = wait_for(lambda: kubectl.get(pdb, "paired", ns), timeout=30, what="PodDisruptionBudget")
            assert budget["spec"]["maxUnavailable"] == 1
            assert budget["metadata"]["ownerReferences"][0]["name"] == "paired"
            deployment = wait_for(lambda: kubectl.get("deployment", "paired", ns), what="Deployment")
            assert budget["spec"]["selector"] == deployment["spec"]["selector"]

            patch = json.dumps({"spec": {"replicas": 1}})
            kubectl.run("patch", "infsvc", "paired", "-n", ns, "--type=merge", "-p", patch)
            wait_for(lambda: kubectl.get(pdb, "paired", ns) is None, what="PodDisruptionBudget deleted")
            assert wait_for(lambda: events(kubectl, ns, "paired").get("DisruptionBudgetRemoved"), what="event")
        assert forbidden_lines(installed) == []

    def test_the_same_operator_without_the_charts_roles_is_refused(
        self, kubectl: Kubectl, control_plane: ControlPlane, installed: Installed, tmp_path: Path
    ) -> None:
        """The control: an account of the same namespace without the chart's bindings gets nowhere, and the
        log check above would have seen it."""
        kubectl.run("create", "serviceaccount", "bare", "-n", installed.namespace)
        bare = dataclasses.replace(
            installed, account="bare", kubeconfig=tmp_path / "bare.kubeconfig", log=tmp_path / "bare.log"
        )
        login(kubectl, control_plane, bare)
        with operator_process(bare, f"--namespace={bare.watched}"):
            refused = wait_for(lambda: forbidden_lines(bare), what="forbidden requests in the log")
        assert any("inferenceservices" in line or "namespaces" in line for line in refused), refused

    @pytest.mark.parametrize(
        ("verb", "resource", "where", "allowed"),
        [
            ("patch", "deployments.apps", "watched", True),
            ("create", "deployments.apps", "watched", True),
            ("patch", f"{CRD_NAME}/status", "watched", True),
            ("delete", "horizontalpodautoscalers.autoscaling", "watched", True),
            ("patch", "poddisruptionbudgets.policy", "watched", True),
            ("delete", "poddisruptionbudgets.policy", "watched", True),
            ("delete", "poddisruptionbudgets.policy", "other", False),
            ("create", "events", "watched", True),
            ("get", "secrets", "watched", False),
            ("list", "secrets", "watched", False),
            ("list", "pods", "watched", True),
            ("watch", "pods", "watched", True),
            ("get", "pods", "watched", False),  # everything about pods comes from the watch
            ("create", "pods", "watched", False),
            ("delete", "pods", "watched", False),
            ("patch", "pods", "watched", False),
            ("get", "pods/log", "watched", False),
            ("create", "pods/exec", "watched", False),
            ("list", "pods", "other", False),
            ("create", "networkpolicies.networking.k8s.io", "watched", True),
            ("delete", "networkpolicies.networking.k8s.io", "watched", True),
            ("delete", "deployments.apps", "watched", True),  # a rollout's candidate, once it is over
            ("update", "deployments.apps", "watched", False),
            ("delete", "configmaps", "watched", True),
            ("create", "httproutes.gateway.networking.k8s.io", "watched", True),
            ("patch", "httproutes.gateway.networking.k8s.io", "watched", True),
            ("delete", "httproutes.gateway.networking.k8s.io", "watched", True),
            ("get", "gateways.gateway.networking.k8s.io", "watched", True),
            ("patch", "gateways.gateway.networking.k8s.io", "watched", False),
            ("create", "httproutes.gateway.networking.k8s.io", "other", False),
            ("delete", CRD_NAME, "watched", False),
            ("get", CRD_NAME, "watched", False),  # owners come from kopf's index
            ("patch", "deployments.apps", "other", False),
            ("list", CRD_NAME, "other", False),
            ("create", "events", "other", False),
            ("list", CRD_NAME, None, False),
            ("patch", "deployments.apps", None, False),
            ("create", "customresourcedefinitions.apiextensions.k8s.io", None, False),
            ("delete", "namespaces", None, False),
        ],
    )
    def test_can_i(
        self,
        kubectl: Kubectl,
        installed: Installed,
        verb: str,
        resource: str,
        where: str | None,
        allowed: bool,
        request: pytest.FixtureRequest,
    ) -> None:
        if resource.endswith(GATEWAY_API):  # kubectl resolves a resource through discovery: its CRDs must be there
            request.getfixturevalue("gateway_api")
        namespace = getattr(installed, where) if where else None
        assert can_i(kubectl, installed, verb, resource, namespace) is allowed

    def test_nothing_outside_the_namespace(self, kubectl: Kubectl, installed: Installed) -> None:
        # With an exact --namespace the operator scans nothing cluster-wide, so it is granted nothing there.
        assert granted(kubectl, installed, installed.other) == {}
        assert granted(kubectl, installed, installed.watched) == {
            CRD_NAME: {"list", "watch", "patch"},
            f"{CRD_NAME}/status": {"patch"},
            "deployments.apps": {"list", "watch", "create", "patch", "delete"},
            "configmaps": {"create", "patch", "delete"},
            "services": {"create", "patch", "delete"},
            "httproutes.gateway.networking.k8s.io": {"create", "patch", "delete"},
            "gateways.gateway.networking.k8s.io": {"get"},
            "backendtrafficpolicies.gateway.envoyproxy.io": {"create", "patch", "delete"},
            "horizontalpodautoscalers.autoscaling": {"create", "patch", "delete"},
            "poddisruptionbudgets.policy": {"create", "patch", "delete"},
            "networkpolicies.networking.k8s.io": {"create", "patch", "delete"},
            "pods": {"list", "watch"},
            "events": {"create"},
        }


@pytest.mark.usefixtures("sole_operator")
class TestClusterWide:
    @pytest.fixture()
    def installed(self, cluster_wide: Installed) -> Installed:
        return cluster_wide

    def test_any_namespace_reconciles_and_autoscaling_comes_and_goes(
        self, kubectl: Kubectl, installed: Installed, kubernetes: KubernetesRelease
    ) -> None:
        ns = installed.other
        with operator_process(installed, "--all-namespaces"):
            applied = kubectl.apply(ns, EXAMPLES / "conv-net.yaml", EXAMPLES / "inception-v3.yaml")
            assert applied.returncode == 0, applied.stderr
            status = wait_for(
                lambda: (kubectl.get("infsvc", "conv-net", ns) or {}).get("status", {}).get("threads"), what="status"
            )
            assert status == CONV_NET_THREADS
            hpa = AUTOSCALING[kubernetes.name]
            assert wait_for(lambda: kubectl.get(hpa, "inception-v3", ns), what="HPA")["spec"]["maxReplicas"] == 4

            patch = json.dumps({"spec": {"autoscaling": None}})
            kubectl.run("patch", "infsvc", "inception-v3", "-n", ns, "--type=merge", "-p", patch)
            wait_for(lambda: kubectl.get(hpa, "inception-v3", ns) is None, what="HPA deleted")
            assert wait_for(lambda: events(kubectl, ns, "inception-v3").get("AutoscalingRemoved"), what="event")
        assert forbidden_lines(installed) == []

    @pytest.mark.parametrize(
        ("verb", "resource", "allowed"),
        [
            ("patch", "deployments.apps", True),
            ("list", CRD_NAME, True),
            ("list", "customresourcedefinitions.apiextensions.k8s.io", True),
            ("list", "secrets", False),
            ("get", "secrets", False),
            ("list", "pods", True),
            ("watch", "pods", True),
            ("get", "pods", False),
            ("delete", "pods", False),
            ("patch", "pods", False),
            ("delete", "deployments.apps", True),
            ("delete", "services", True),  # a rollout's candidate, once it is over
            ("list", "namespaces", False),  # kopf lists namespaces only for --namespace patterns
            ("get", "customresourcedefinitions.apiextensions.k8s.io", False),
            ("create", "clusterroles.rbac.authorization.k8s.io", False),
        ],
    )
    def test_can_i(self, kubectl: Kubectl, installed: Installed, verb: str, resource: str, allowed: bool) -> None:
        assert can_i(kubectl, installed, verb, resource, None) is allowed

    @pytest.mark.parametrize(
        ("role", "verb", "allowed"),
        [("edit", "patch", True), ("edit", "get", True), ("admin", "delete", True), ("view", "watch", True),
         ("view", "patch", False), ("view", "create", False)],
    )  # fmt: skip
    def test_kubernetes_user_roles_take_in_inference_services(
        self, kubectl: Kubectl, installed: Installed, role: str, verb: str, allowed: bool
    ) -> None:
        """A RoleBinding to Kubernetes' own edit role lets a person steer a rollout (inferop rollout patches the
        spec) and one to view lets them watch it: the clusterrole-aggregation controller adds the chart's rules."""
        user, namespace = f"{role}-user", installed.other
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{role}-user", "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        kubectl.run("apply", "-f", "-", stdin=json.dumps(binding))

        def may(what: str) -> bool:
            result = kubectl.run("auth", "can-i", what, CRD_NAME, "-n", namespace, f"--as={user}", check=False)
            return result.stdout.strip() == "yes"

        # Each role reads them once the controller has aggregated the chart's rules (moments after the install).
        assert wait_for(lambda: may("get"), what=f"{role} to read InferenceServices", timeout=30)
        assert may(verb) is allowed

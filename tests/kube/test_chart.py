"""The Helm chart: lint, render, schema, validation against Kubernetes 1.20 and a current release, a
checkov scan, and install / upgrade / uninstall with the real helm on the real control plane."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.controlplane import ControlPlane, KubernetesRelease
from inferop_devtools.cluster.tools import kube_tools
from inferop_operator.builders import CHILDREN, OPERATOR_POD_LABELS
from inferop_operator.cli import STOP_BOUND_SECONDS
from inferop_operator.identity import CRD_NAME, GATEWAY_GROUP, GROUP, PLURAL
from tests.helpers import wait_for
from tests.kube.helpers import REPO, Kubectl, runs_pods
from tests.operator.test_operator_pod_security import restricted_violations

pytestmark = pytest.mark.integration

CHART = REPO / "charts" / "inferop"
CHECKOV_CONFIG = CHART / ".checkov.yaml"
TOOLS_SCRIPT = REPO / "scripts" / "tools-venv.sh"
# Renderings every static check runs on: cluster-wide, one namespace, and with the Prometheus Operator.
RENDERINGS: dict[str, list[str]] = {
    "default": [],
    "namespaced": ["--set", "watchNamespace=models"],
    "monitoring": ["--set", "monitoring.enabled=true", "--api-versions", "monitoring.coreos.com/v1"],
}
RELEASE_NAMESPACE = "inferop-system"
# Kinds the Prometheus Operator defines: no Kubernetes release ships their schemas, so kubernetes-validate
# cannot know them (TestRender checks what they say instead).
PROMETHEUS_KINDS = {("monitoring.coreos.com/v1", "PodMonitor"), ("monitoring.coreos.com/v1", "PrometheusRule")}


class Helm:
    """The real helm, with its cache and config kept out of the user's home."""

    def __init__(self, tools: Path, home: Path):
        self.binary = str(tools / "helm")
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }

    def run(self, *args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [self.binary, *args] + (["--kubeconfig", str(kubeconfig)] if kubeconfig else [])
        result = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
        return result

    def template(
        self, *args: str, release: str = "inferop", namespace: str = RELEASE_NAMESPACE
    ) -> list[dict[str, Any]]:
        out = self.run("template", release, str(CHART), "--namespace", namespace, *args).stdout
        return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(kube_tools(), tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def tools_bin() -> Path:
    """checkov and the kubernetes-validate release that still knows 1.20, in their own cached venv."""
    result = subprocess.run(["bash", str(TOOLS_SCRIPT)], capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        pytest.fail(f"checker venv unavailable (run {TOOLS_SCRIPT.relative_to(REPO)}): {result.stderr.strip()[-400:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def rendered(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each rendering written to its own directory (checkov and kubernetes-validate read files)."""
    root = tmp_path_factory.mktemp("rendered")
    files = {}
    for name, args in RENDERINGS.items():
        (root / name).mkdir()
        files[name] = root / name / "manifests.yaml"
        files[name].write_text(yaml.safe_dump_all(helm.template(*args)))
    return files


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = by_kind(docs)[("Deployment", "inferop")]
    return dict(deployment["spec"]["template"]["spec"]["containers"][0])


class TestLint:
    @pytest.mark.parametrize("values", [[], ["--set", "watchNamespace=models"], ["--set", "monitoring.enabled=true"]])
    def test_strict_lint_passes(self, helm: Helm, values: list[str]) -> None:
        result = helm.run("lint", "--strict", str(CHART), *values)
        assert "0 chart(s) failed" in result.stdout, result.stdout


class TestSchema:
    @pytest.mark.parametrize(
        ("values", "message"),
        [
            (["--set", "replicaCount=two"], "additional properties 'replicaCount' not allowed"),
            (["--set", "resyncSeconds=fast"], "at '/resyncSeconds': got string, want number"),
            (["--set", "watchNamespace=Models_A"], "at '/watchNamespace': 'Models_A' does not match pattern"),
            (["--set", "image.pullPolicy=Sometimes"], "at '/image/pullPolicy': value must be one of"),
            (["--set", "monitoring.interval=30"], "at '/monitoring/interval': got number, want string"),
        ],
    )
    def test_values_schema_rejects_with_helms_message(self, helm: Helm, values: list[str], message: str) -> None:
        result = helm.run("template", "inferop", str(CHART), *values, check=False)
        assert result.returncode != 0
        assert "values don't meet the specifications of the schema" in result.stderr
        assert message in result.stderr

    def test_kubernetes_older_than_1_20_is_refused(self, helm: Helm) -> None:
        result = helm.run("template", "inferop", str(CHART), "--kube-version", "1.19.16", check=False)
        assert result.returncode != 0
        assert "chart requires kubeVersion: >=1.20.0-0" in result.stderr
        helm.run("template", "inferop", str(CHART), "--kube-version", "1.20.2")


class TestRender:
    def test_default_is_cluster_wide_with_a_hardened_operator(self, helm: Helm) -> None:
        docs = helm.template()
        kinds = sorted(f"{kind}/{name}" for kind, name in by_kind(docs))
        assert kinds == [
            "ClusterRole/inferop-application",
            "ClusterRole/inferop-edit",
            "ClusterRole/inferop-framework",
            "ClusterRole/inferop-scanning",
            "ClusterRole/inferop-view",
            "ClusterRoleBinding/inferop-application",
            "ClusterRoleBinding/inferop-framework",
            "ClusterRoleBinding/inferop-scanning",
            "Deployment/inferop",
            "NetworkPolicy/inferop",
            "ServiceAccount/inferop",
        ]
        deployment = by_kind(docs)[("Deployment", "inferop")]
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == "inferop" and pod["automountServiceAccountToken"] is True
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        # The operator stops within STOP_BOUND_SECONDS (tests/kube/test_shutdown.py): SIGKILL never cuts it short.
        assert STOP_BOUND_SECONDS < pod["terminationGracePeriodSeconds"] <= 30
        assert by_kind(docs)[("ServiceAccount", "inferop")]["automountServiceAccountToken"] is False

        container = operator_container(docs)
        assert container["image"] == "inferop/operator:0.1.0"  # the appVersion
        assert container["command"] == ["inferop", "operator"]
        assert container["args"] == ["--liveness=http://0.0.0.0:8080/healthz", "--all-namespaces"]
        assert container["ports"] == [{"name": "healthz", "containerPort": 8080, "protocol": "TCP"}]
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "healthz"}
        env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
        assert env == {
            "INFEROP_LOG_FORMAT": "json",
            "INFEROP_TRITON_IMAGE": "nvcr.io/nvidia/tritonserver:25.01-py3",
            "INFEROP_FETCH_IMAGE": container["image"],  # models in object storage: fetched by this very image
            "INFEROP_RESYNC_SECONDS": "60",
            # services' NetworkPolicies let the operator's pods of this namespace call theirs
            "INFEROP_OPERATOR_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        }
        template = by_kind(docs)[("Deployment", "inferop")]["spec"]["template"]
        assert OPERATOR_POD_LABELS.items() <= template["metadata"]["labels"].items()
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"] == {"drop": ["ALL"]} and security["runAsUser"] > 0
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["resources"]["limits"] == {"cpu": "500m", "memory": "256Mi"}
        assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
        assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]

    def test_watch_namespace_gives_roles_there_and_the_flag(self, helm: Helm) -> None:
        docs = helm.template("--set", "watchNamespace=models")
        objects = by_kind(docs)
        for part in ("framework", "application"):
            assert objects[("Role", f"inferop-{part}")]["metadata"]["namespace"] == "models"
            binding = objects[("RoleBinding", f"inferop-{part}")]
            assert binding["metadata"]["namespace"] == "models"
            assert binding["subjects"] == [
                {"kind": "ServiceAccount", "name": "inferop", "namespace": RELEASE_NAMESPACE}
            ]
        # An exact namespace is all the operator watches: nothing cluster-scoped is granted to it (the ClusterRoles
        # left are what Kubernetes' own user roles take in).
        cluster_scoped = [(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"].startswith("Cluster")]
        assert cluster_scoped == [("ClusterRole", "inferop-edit"), ("ClusterRole", "inferop-view")]
        assert "--namespace=models" in operator_container(docs)["args"]

        scanning = by_kind(helm.template())[("ClusterRole", "inferop-scanning")]["rules"]
        assert {r["resources"][0]: r["verbs"] for r in scanning} == {"customresourcedefinitions": ["list", "watch"]}
        strict = helm.template("--set", "rbac.clusterScanning=false")
        assert ("ClusterRole", "inferop-scanning") not in by_kind(strict)

    def test_least_privilege_no_wildcards_no_secrets_pods_only_read(self, helm: Helm) -> None:
        """No Secret is granted because none is needed: Triton's admin token is drawn inside each pod at start
        (builders.start_script) and never stored; the operator reads nothing else secret."""
        seen = set()
        for args in RENDERINGS.values():
            for doc in helm.template(*args):
                for rule in doc.get("rules", []):
                    for field in ("apiGroups", "resources", "verbs"):
                        assert "*" not in rule[field], (doc["metadata"]["name"], rule)
                        assert not any("*" in item for item in rule[field]), (doc["metadata"]["name"], rule)
                    resources = set(rule["resources"])
                    seen |= resources
                    assert not {"secrets", "pods/exec", "pods/log", "pods/attach", "serviceaccounts/token"} & resources
                    assert not {"escalate", "bind", "impersonate", "update", "deletecollection"} & set(rule["verbs"])
                    if "pods" in resources:  # the advice conditions read pods and never change them
                        assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule
        assert "pods" in seen

    @pytest.mark.parametrize("rendering", ["default", "namespaced"])
    def test_what_kopf_watches_is_read_only(self, helm: Helm, rendering: str) -> None:
        """The framework's rules: the Deployments (readiness) and pods (PodsHealthy) the handlers watch are
        listed and watched, nothing more; the InferenceServices are also patched (kopf's annotations)."""
        kind = "Role" if rendering == "namespaced" else "ClusterRole"
        rules = by_kind(helm.template(*RENDERINGS[rendering]))[(kind, "inferop-framework")]["rules"]
        granted = {
            (group, resource): set(r["verbs"]) for r in rules for group in r["apiGroups"] for resource in r["resources"]
        }
        assert granted == {
            (GROUP, PLURAL): {"list", "watch", "patch"},
            ("apps", "deployments"): {"list", "watch"},
            ("", "pods"): {"list", "watch"},
            ("", "events"): {"create"},
        }

    @pytest.mark.parametrize("rendering", list(RENDERINGS))
    def test_the_operator_pod_meets_the_restricted_pod_security_standard(self, helm: Helm, rendering: str) -> None:
        deployment = by_kind(helm.template(*RENDERINGS[rendering]))[("Deployment", "inferop")]
        assert restricted_violations(deployment["spec"]["template"]) == []

    @pytest.mark.parametrize("rendering", ["default", "namespaced"])
    def test_each_child_gets_exactly_the_verbs_the_operator_uses(self, helm: Helm, rendering: str) -> None:
        """A child added to the operator's registry without its rule (or a rule left after a child is gone)
        fails here, before any cluster sees the forbidden request."""
        kind = "Role" if rendering == "namespaced" else "ClusterRole"
        rules = by_kind(helm.template(*RENDERINGS[rendering]))[(kind, "inferop-application")]["rules"]
        granted: dict[tuple[str, str], set[str]] = {}
        for rule in rules:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
        wanted: dict[tuple[str, str], set[str]] = {}
        for child in CHILDREN:
            wanted.setdefault((child.group, child.plural), set()).update(child.verbs)
        assert granted == {
            **wanted,
            (GROUP, f"{PLURAL}/status"): {"patch"},
            (GATEWAY_GROUP, "gateways"): {"get"},  # read only: does the Gateway a service names exist
        }

    def test_monitoring_needs_both_the_value_and_the_api(self, helm: Helm) -> None:
        without_api = helm.template("--set", "monitoring.enabled=true")
        assert not [d for d in without_api if d["apiVersion"].startswith("monitoring.coreos.com")]
        assert not [d for d in helm.template(*RENDERINGS["monitoring"][2:]) if "monitoring" in d["apiVersion"]]

        objects = by_kind(helm.template(*RENDERINGS["monitoring"], "--set", "watchNamespace=models"))
        monitor = objects[("PodMonitor", "inferop-triton")]["spec"]
        assert monitor["selector"] == {
            "matchLabels": {"app.kubernetes.io/managed-by": "inferop"},
            "matchExpressions": [
                {"key": "app.kubernetes.io/component", "operator": "In", "values": ["canary", "predictor"]}
            ],
        }
        assert monitor["podTargetLabels"] == ["app.kubernetes.io/instance", "app.kubernetes.io/component"]
        assert monitor["namespaceSelector"] == {"matchNames": ["models"]}
        assert [e["port"] for e in monitor["podMetricsEndpoints"]] == ["metrics"]
        rules = {r["alert"]: r for r in objects[("PrometheusRule", "inferop-triton")]["spec"]["groups"][0]["rules"]}
        job = f'job="{RELEASE_NAMESPACE}/inferop-triton"'
        stalled = rules["InferopQueueStalled"]["expr"]
        assert "nv_inference_pending_request_count{" + job + "}) > 0" in stalled
        assert "rate(nv_inference_request_success{" + job + "}[5m])) == 0" in stalled
        rising = rules["InferopQueueTimeRising"]["expr"]
        assert re.search(r"rate\(nv_inference_queue_duration_us\{.*\}\[5m\]\)\)\s*/\s*\(sum by", rising)
        assert rising.rstrip().endswith("> 100000")
        assert "{{ $labels.model }}" in rules["InferopQueueStalled"]["annotations"]["summary"]


VALIDATE_SCRIPT = """
import json, sys, yaml, kubernetes_validate
from kubernetes_validate.utils import SchemaNotFoundError
version, path = sys.argv[1], sys.argv[2]
results = []
for doc in yaml.safe_load_all(open(path)):
    if not doc:
        continue
    entry = {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "name": doc["metadata"]["name"]}
    try:
        kubernetes_validate.validate(doc, version, strict=True)
        entry["result"] = "valid"
    except SchemaNotFoundError:
        entry["result"] = "unknown"
    except kubernetes_validate.ValidationError as error:
        entry["result"] = f"invalid: {error.message} at {list(error.path)}"
    results.append(entry)
print(json.dumps(results))
"""


def validate(python: Path | str, version: str, path: Path) -> list[dict[str, str]]:
    out = subprocess.run(
        [str(python), "-c", VALIDATE_SCRIPT, version, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return list(json.loads(out.stdout))


class TestKubernetesSchemas:
    """Strict validation (unknown fields rejected) against the oldest supported and a current release."""

    def check(self, results: list[dict[str, str]]) -> None:
        invalid = [r for r in results if r["result"].startswith("invalid")]
        assert not invalid, invalid
        unknown = {(r["apiVersion"], r["kind"]) for r in results if r["result"] == "unknown"}
        assert unknown <= PROMETHEUS_KINDS, f"kubernetes-validate lacks schemas for {unknown - PROMETHEUS_KINDS}"
        assert sum(r["result"] == "valid" for r in results) >= 7

    @pytest.mark.parametrize("rendering", list(RENDERINGS))
    def test_current_release(self, rendered: dict[str, Path], rendering: str) -> None:
        import kubernetes_validate

        self.check(validate(sys.executable, kubernetes_validate.latest_version(), rendered[rendering]))

    @pytest.mark.parametrize("rendering", list(RENDERINGS))
    def test_kubernetes_1_20(self, rendered: dict[str, Path], tools_bin: Path, rendering: str) -> None:
        # The project's kubernetes-validate starts at 1.25; the tools venv holds the last release with 1.20.
        self.check(validate(tools_bin / "python", "1.20.0", rendered[rendering]))


def checkov(tools_bin: Path, directory: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [str(tools_bin / "checkov"), "-d", str(directory), "-o", "json", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=directory,
    )
    assert out.returncode in (0, 1), out.stderr[-2000:]
    report = json.loads(out.stdout)
    return dict(report[0] if isinstance(report, list) else report)


def skipped_checks() -> dict[str, str]:
    """check ID -> the reason written above it in .checkov.yaml."""
    skips, reason = {}, []
    in_list = False
    for line in CHECKOV_CONFIG.read_text().splitlines():
        if line.startswith("skip-check:"):
            in_list = True
        elif in_list and line.strip().startswith("#"):
            reason.append(line.strip().lstrip("# "))
        elif in_list and line.strip().startswith("- "):
            skips[line.strip()[2:]] = " ".join(reason)
            reason = []
        elif in_list and line and not line.startswith(" "):
            in_list = False
    return skips


class TestCheckov:
    def test_no_failed_check_with_the_charts_config(self, rendered: dict[str, Path], tools_bin: Path) -> None:
        report = checkov(tools_bin, rendered["default"].parent.parent, "--config-file", str(CHECKOV_CONFIG))
        failed = [(c["check_id"], c["check_name"], c["resource"]) for c in report["results"]["failed_checks"]]
        assert failed == []
        assert report["summary"]["passed"] > 100

    def test_every_skip_is_explained_and_still_needed(self, rendered: dict[str, Path], tools_bin: Path) -> None:
        skips = skipped_checks()
        assert skips and all(len(reason) > 40 for reason in skips.values()), skips
        report = checkov(tools_bin, rendered["default"].parent.parent, "--framework", "kubernetes", "--skip-download")
        assert {c["check_id"] for c in report["results"]["failed_checks"]} == set(skips)


# How helm 4 installs the chart on each release. Its default server-side apply of crds/ is refused by 1.20 (which
# predates the CRD's x-kubernetes-validations, 1.23: "field not declared in schema"); a client-side install creates
# the CRD and the apiserver drops the rules (the operator's Valid condition still refuses what they would).
@dataclass
class Release:
    name: str
    namespace: str


@pytest.fixture()
def release(helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, namespace: str) -> Iterator[Release]:
    installed = Release(name=f"chart-{namespace}", namespace=namespace)
    yield installed
    helm.run("uninstall", installed.name, "-n", namespace, kubeconfig=control_plane.kubeconfig, check=False)


class TestInstall:
    def test_install_upgrade_uninstall(
        self, helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, release: Release, kubernetes: KubernetesRelease
    ) -> None:
        kubeconfig, ns, name = control_plane.kubeconfig, release.namespace, release.name
        fullname = f"{name}-inferop"
        crd_before = kubectl.get("crd", CRD_NAME, "")
        assert crd_before is not None, "the kubectl fixture applies the CRD first"

        # --wait where kwok runs the pods: the operator's Deployment becomes available. On 1.20 its Pod stays Pending
        # and would never become Ready.
        wait = ("--wait", "--timeout=60s") if runs_pods(kubernetes) else ()
        result = helm.run(
            "install", name, str(CHART), "-n", ns, *wait, *kubernetes.helm_install_flags, kubeconfig=kubeconfig
        )
        assert "STATUS: deployed" in result.stdout
        assert "kubectl -n default apply -f operator/examples/conv-net.yaml" in result.stdout  # NOTES
        deployment = wait_for(lambda: kubectl.get("deployment", fullname, ns), what="operator Deployment")
        assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname
        assert kubectl.get("serviceaccount", fullname, ns) is not None
        for part in ("framework", "application", "scanning"):
            assert kubectl.get("clusterrolebinding", f"{fullname}-{part}", "") is not None
        # Helm 4 server-side-applies crds/ on install even when the CRD exists: from the same file that
        # changes nothing (a CRD from another revision would conflict: see the chart's README).
        crd_after = kubectl.get("crd", CRD_NAME, "")
        assert crd_after is not None and crd_after["spec"] == crd_before["spec"]
        established = [c for c in crd_after["status"]["conditions"] if c["type"] == "Established"]
        assert established[0]["status"] == "True"

        triton = "registry.example/triton:24.12-py3"
        upgrade = ["--set", f"watchNamespace={ns}", "--set", f"tritonImage={triton}"]
        helm.run("upgrade", name, str(CHART), "-n", ns, *upgrade, kubeconfig=kubeconfig)

        def upgraded() -> dict[str, Any] | None:
            current = kubectl.get("deployment", fullname, ns)
            container = (current or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", [{}])[0]
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            return current if env.get("INFEROP_TRITON_IMAGE") == triton else None

        container = wait_for(upgraded, what="upgraded Deployment")["spec"]["template"]["spec"]["containers"][0]
        assert f"--namespace={ns}" in container["args"] and "--all-namespaces" not in container["args"]
        for part in ("framework", "application"):
            assert kubectl.get("rolebinding", f"{fullname}-{part}", ns) is not None
            assert kubectl.get("clusterrolebinding", f"{fullname}-{part}", "") is None
            assert kubectl.get("clusterrole", f"{fullname}-{part}", "") is None

        helm.run("uninstall", name, "-n", ns, kubeconfig=kubeconfig)
        assert kubectl.get("deployment", fullname, ns) is None
        assert kubectl.get("serviceaccount", fullname, ns) is None
        assert kubectl.get("role", f"{fullname}-application", ns) is None
        assert kubectl.get("clusterrole", f"{fullname}-scanning", "") is None
        # CRDs outlive the release (helm never deletes crds/), so InferenceServices are not lost with it.
        assert kubectl.get("crd", CRD_NAME, "") is not None


# Whether the release's apiserver runs PodSecurity admission (alpha in 1.22, on by default since 1.23, GA in 1.25):
# on 1.20 a namespace's pod-security.kubernetes.io labels are only labels.
ENFORCES_POD_SECURITY = {"1.20": False, "1.37": True}


class TestPodSecurity:
    def test_the_operator_pod_is_admitted_in_a_restricted_namespace(
        self, helm: Helm, kubectl: Kubectl, control_plane: ControlPlane, release: Release, kubernetes: KubernetesRelease
    ) -> None:
        """The chart installs into a namespace that enforces the restricted Pod Security Standard, and its
        ReplicaSet gets the operator's Pod created there, while a Pod without the hardening is refused."""
        ns, name = release.namespace, release.name
        kubectl.run("label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
        wait_for(lambda: kubectl.get("serviceaccount", "default", ns), what="the namespace's default ServiceAccount")
        bare = kubectl.run("run", "bare", "-n", ns, "--image=busybox", "--restart=Never", check=False)
        if ENFORCES_POD_SECURITY[kubernetes.name]:
            assert bare.returncode != 0
            assert 'pods "bare" is forbidden: violates PodSecurity "restricted:latest"' in bare.stderr, bare.stderr
        else:
            assert bare.returncode == 0, bare.stderr

        helm.run(
            "install", name, str(CHART), "-n", ns, *kubernetes.helm_install_flags, kubeconfig=control_plane.kubeconfig
        )

        def operator_pods() -> list[dict[str, Any]]:
            selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=operator"
            listed = kubectl.run("get", "pods", "-n", ns, "-l", selector, "-o", "json")
            return list(json.loads(listed.stdout)["items"])

        (pod,) = wait_for(operator_pods, what="the operator's Pod")
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"].startswith(f"{name}-inferop-")) == ("ReplicaSet", True)
        events = json.loads(kubectl.run("get", "events", "-n", ns, "-o", "json").stdout)["items"]
        assert [e["message"] for e in events if e["reason"] == "FailedCreate"] == []

"""The operator against the real control plane: what `kubectl apply` of an InferenceService produces."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import pytest
import yaml

from inferop_core.quantity import format_bytes
from inferop_core.tritonconfig import parse_model_config
from inferop_devtools.cluster.controlplane import KubernetesRelease
from inferop_operator.identity import CONFIG_HASH_ANNOTATION, INSTANCE, label_selector
from tests.helpers import wait_for
from tests.kube.helpers import (
    AUTOSCALING,
    CONV_NET_THREADS,
    EXAMPLES,
    RESYNC_SECONDS,
    Kubectl,
    OperatorRunner,
    advice,
    apply_text,
    condition,
    env_of,
    manifest,
    pod_of,
    resynced,
    runs_pods,
    warnings_about,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]


class TestApplyExamples:
    def test_examples_become_configmap_deployment_service_and_hpa(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
    ) -> None:
        result = kubectl.apply(namespace, EXAMPLES / "conv-net.yaml", EXAMPLES / "inception-v3.yaml")
        assert result.returncode == 0, result.stderr

        deployment = wait_for(lambda: kubectl.get("deployment", "conv-net", namespace), what="conv-net Deployment")
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"] == {
            "requests": {"cpu": "2", "memory": "1Gi"},
            "limits": {"cpu": "2", "memory": "1Gi"},
        }
        assert {p["name"]: p["containerPort"] for p in container["ports"]} == {
            "http": 8000,
            "grpc": 8001,
            "metrics": 8002,
        }
        # 2 CPUs / 2 instances: one intra-op thread each, and every math library told the same.
        assert env_of(deployment) == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"
        assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 60
        assert deployment["spec"]["replicas"] == 1
        owner = deployment["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", "conv-net", True)

        config_map = wait_for(lambda: kubectl.get("configmap", "conv-net-config", namespace), what="ConfigMap")
        config = parse_model_config(config_map["data"]["config.pbtxt"])
        assert config.platform == "onnxruntime_onnx"
        assert config.max_batch_size == 16
        assert config.instance_group[0].count == 2
        assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds == 2_000_000
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 128
        assert config.parameters["intra_op_thread_count"].string_value == "1"

        service = wait_for(lambda: kubectl.get("service", "conv-net", namespace), what="Service")
        assert {p["name"] for p in service["spec"]["ports"]} == {"http", "grpc", "metrics"}

        # The operator discovered the version the release serves.
        hpa = wait_for(lambda: kubectl.get(AUTOSCALING[kubernetes.name], "inception-v3", namespace), what="HPA")
        assert hpa["spec"]["maxReplicas"] == 4
        assert hpa["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"] == 70
        wait_for(lambda: kubectl.get("deployment", "inception-v3", namespace), what="inception Deployment")
        shown = kubectl.run("-n", namespace, "get", "deployment", "inception-v3", "--show-managed-fields", "-o", "json")
        inception = json.loads(shown.stdout)
        ours = next(f for f in inception["metadata"]["managedFields"] if f["manager"] == "inferop")
        assert "f:replicas" not in json.dumps(ours["fieldsV1"]["f:spec"]), "the replica count is the HPA's"
        # The inception example asks for a NetworkPolicy; the conv net example does not.
        policy = wait_for(lambda: kubectl.get("networkpolicy", "inception-v3", namespace), what="NetworkPolicy")
        assert [rule["ports"][0]["port"] for rule in policy["spec"]["ingress"]] == [8000, 8002]
        assert kubectl.get("networkpolicy", "conv-net", namespace) is None

        status = wait_for(
            lambda: (kubectl.get("infsvc", "conv-net", namespace) or {}).get("status", {}).get("threads"), what="status"
        )
        assert status == CONV_NET_THREADS

    @pytest.mark.parametrize(
        ("example", "message"),
        [
            ("unknown-scheme.yaml", "spec.model.storageUri in body should match"),
            ("bad-autoscaling.yaml", 'spec.autoscaling.metric: Unsupported value: "gpuUtilisation"'),
            ("bad-autoscaling.yaml", "spec.batching.maxBatchSize in body should be greater than or equal to 0"),
        ],
    )
    def test_schema_rejects_invalid_examples_with_the_apiservers_message(
        self, kubectl: Kubectl, namespace: str, example: str, message: str
    ) -> None:
        result = kubectl.apply(namespace, EXAMPLES / "invalid" / example)
        assert result.returncode != 0
        assert message in result.stderr


class TestRefusals:
    def test_oversubscription_is_refused_with_arithmetic_and_no_pods(self, kubectl: Kubectl, namespace: str) -> None:
        assert kubectl.apply(namespace, EXAMPLES / "refused" / "oversubscribed.yaml").returncode == 0
        budget = wait_for(
            lambda: condition(kubectl.get("infsvc", "oversubscribed", namespace), "ThreadBudget"), what="ThreadBudget"
        )
        assert (budget["status"], budget["reason"]) == ("False", "Oversubscribed")
        assert "4 instance(s) x (2 intra-op + 1 inter-op - 1) = 8 threads on 2 CPU(s)" in budget["message"]
        assert "lower instances to 1" in budget["message"]  # 1 x (2 + 1 - 1) = 2 threads fit 2 CPUs
        service = kubectl.get("infsvc", "oversubscribed", namespace)
        assert service is not None and service["status"]["phase"] == "Failed"
        events = wait_for(lambda: _events(kubectl, namespace, "Oversubscribed"), what="Warning event")
        assert events[0]["type"] == "Warning"
        assert kubectl.get("deployment", "oversubscribed", namespace) is None

    def test_memory_that_cannot_fit_is_refused_with_what_would_fit(self, kubectl: Kubectl, namespace: str) -> None:
        assert kubectl.apply(namespace, EXAMPLES / "refused" / "out-of-memory.yaml").returncode == 0
        fit = wait_for(
            lambda: condition(kubectl.get("infsvc", "out-of-memory", namespace), "MemoryFit"), what="MemoryFit"
        )
        assert (fit["status"], fit["reason"]) == ("False", "InsufficientMemory")
        assert "= 6.79Gi, x 1.28 margin = 8.69Gi against 3Gi" in fit["message"]
        assert "batching.maxBatchSize <= 12" in fit["message"] and "instances <= 1" in fit["message"]
        assert _events(kubectl, namespace, "InsufficientMemory")
        assert kubectl.get("deployment", "out-of-memory", namespace) is None

    def test_a_misspelt_field_is_refused_at_apply(self, kubectl: Kubectl, namespace: str) -> None:
        """`maxBatchSizee` is never pruned in silence: `kubectl apply` refuses it, naming it, on every release (by
        the apiserver's strict field validation where it has one, else by kubectl's check against the schema the
        apiserver publishes), and nothing is created."""
        text = manifest("misspelt", batching={"maxBatchSizee": 8})
        result = kubectl.run("apply", "-n", namespace, "-f", "-", stdin=text, check=False)
        assert result.returncode != 0
        assert "maxBatchSizee" in result.stderr
        assert kubectl.get("inferenceservice", "misspelt", namespace) is None

    def test_a_users_model_without_a_batch_axis_and_with_a_varying_output(
        self, kubectl: Kubectl, namespace: str
    ) -> None:
        """What `inferop export onnx` writes for such a model passes the apiserver's schema and the operator, and
        the mounted config keeps both: max_batch_size 0 and an output dim of -1."""
        from inferop_core.tritonconfig import parse_model_config

        model = {
            "name": "own_model",
            "storageUri": "hostpath:///models/own_model",
            "profile": {
                "parameters": 54,
                "macsPerSample": 864,
                "weightBytes": 216,
                "activationBytesPerSample": 320,
                "samplesPerCpuSecond": 90000.0,
                "ioBytesPerSample": 96,
            },
            "weights": "own_model.onnx, sha256 0123456789abcdef",
            "inputs": [{"name": "x", "dims": [1, 2, 4, 4]}, {"name": "ids", "datatype": "INT64", "dims": [1, 2]}],
            "outputs": [{"name": "head", "dims": [1, -1]}],
            "processing": {"kind": "tensors"},
        }
        apply_text(kubectl, namespace, manifest("own-model", model=model, batching={"maxBatchSize": 0}))
        config_map = wait_for(lambda: kubectl.get("configmap", "own-model-config", namespace), what="ConfigMap")
        config = parse_model_config(config_map["data"]["config.pbtxt"])
        assert config.max_batch_size == 0
        assert [list(o.dims) for o in config.output] == [[1, -1]]
        assert config.parameters["inferop_processing"].string_value == '{"kind":"tensors"}'
        # The ConfigMap is applied before the status is written: wait for the condition, not the object.
        valid = wait_for(
            lambda: condition(kubectl.get("inferenceservice", "own-model", namespace), "Valid"), what="Valid"
        )
        assert valid["status"] == "True"

    def test_allowing_oversubscription_deploys_with_a_warning(self, kubectl: Kubectl, namespace: str) -> None:
        apply_text(
            kubectl, namespace, manifest("allowed", instances=4, threads={"intraOp": 2, "allowOversubscription": True})
        )
        deployment = wait_for(lambda: kubectl.get("deployment", "allowed", namespace), what="Deployment")
        assert env_of(deployment)["OMP_NUM_THREADS"] == "2"
        warnings = wait_for(
            lambda: [e for e in _events(kubectl, namespace, "Warning") if "oversubscription allowed" in e["message"]],
            what="warning",
        )
        assert "8 threads on 2 CPU(s)" in warnings[0]["message"]

    def test_invalid_spec_is_reported_and_does_not_stall_others(self, kubectl: Kubectl, namespace: str) -> None:
        # The schema and its admission rules accept it; the operator's own validation (distinct tensor names, which
        # CEL cannot check within its cost budget) does not.
        model = yaml.safe_load(manifest("x"))["spec"]["model"]
        model["outputs"] = [*model["outputs"], {"name": "board", "datatype": "FP32", "dims": [1]}]
        apply_text(kubectl, namespace, manifest("repeated-name", model=model))
        apply_text(kubectl, namespace, manifest("good"))
        valid = wait_for(
            lambda: condition(kubectl.get("infsvc", "repeated-name", namespace), "Valid"), what="Valid condition"
        )
        assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
        assert "spec.model" in valid["message"] and "repeated: ['board']" in valid["message"]
        assert wait_for(lambda: kubectl.get("deployment", "good", namespace), what="the valid service's Deployment")
        assert kubectl.get("deployment", "repeated-name", namespace) is None


class TestChildrenTheApiServerRefuses:
    def test_a_quota_forbidding_services_is_reported_and_retried(self, kubectl: Kubectl, namespace: str) -> None:
        quota = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-services"}}
        apply_text(kubectl, namespace, yaml.safe_dump({**quota, "spec": {"hard": {"services": "0"}}}))
        wait_for(
            lambda: (kubectl.get("resourcequota", "no-services", namespace) or {}).get("status", {}).get("hard"),
            what="the quota controller to count the namespace",
        )
        apply_text(kubectl, namespace, manifest("quota-check"))

        applied = wait_for(
            lambda: condition(kubectl.get("infsvc", "quota-check", namespace), "ChildrenApplied"),
            what="ChildrenApplied",
        )
        assert (applied["status"], applied["reason"]) == ("False", "Forbidden")
        assert applied["message"].startswith('apply Service quota-check: 403 Forbidden: services "quota-check" is ')
        assert "exceeded quota: no-services" in applied["message"]
        service = kubectl.get("infsvc", "quota-check", namespace)
        assert service is not None and service["status"]["phase"] == "Pending"
        assert condition(service, "Ready")["reason"] == "ChildrenNotApplied"  # type: ignore[index]
        events = wait_for(lambda: _events(kubectl, namespace, "Forbidden"), what="Warning event")
        assert events[0]["type"] == "Warning" and "exceeded quota: no-services" in events[0]["message"]
        assert kubectl.get("deployment", "quota-check", namespace) is None  # applied last, so never half-deployed

        # Lifted, the next attempt applies every child (a resync at the latest).
        kubectl.run("-n", namespace, "delete", "resourcequota", "no-services")
        wait_for(
            lambda: (
                (condition(kubectl.get("infsvc", "quota-check", namespace), "ChildrenApplied") or {}).get("status")
                == "True"
            ),
            timeout=RESYNC_SECONDS * 5 + 10,
            what="ChildrenApplied True once the quota is gone",
        )
        assert kubectl.get("service", "quota-check", namespace) is not None
        assert kubectl.get("deployment", "quota-check", namespace) is not None

    def test_a_name_no_service_can_have_fails_for_good(self, kubectl: Kubectl, namespace: str) -> None:
        # A valid name for an InferenceService (a DNS subdomain) but not for a Service (a DNS label: no dots; since
        # 1.34 a Service name may start with a digit, so "7-up" no longer fails on current releases).
        apply_text(kubectl, namespace, manifest("conv.net"))
        applied = wait_for(
            lambda: condition(kubectl.get("infsvc", "conv.net", namespace), "ChildrenApplied"), what="ChildrenApplied"
        )
        assert (applied["status"], applied["reason"]) == ("False", "Invalid")
        assert applied["message"].startswith(
            'apply Service conv.net: 422 Invalid: Service "conv.net" is invalid: metadata.name'
        )
        assert applied["message"].endswith("(not retried until the spec changes)")
        service = kubectl.get("infsvc", "conv.net", namespace)
        assert service is not None and service["status"]["phase"] == "Failed"
        events = wait_for(lambda: _events(kubectl, namespace, "Invalid"), what="Warning event")
        assert events[0]["type"] == "Warning" and 'Service "conv.net" is invalid' in events[0]["message"]
        assert kubectl.get("deployment", "conv.net", namespace) is None


class TestConvergence:
    def test_spec_edits_patch_the_children_and_roll_the_pods(self, kubectl: Kubectl, namespace: str) -> None:
        apply_text(kubectl, namespace, manifest("edited"))
        first = wait_for(lambda: kubectl.get("deployment", "edited", namespace), what="Deployment")
        first_hash = first["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION]

        apply_text(
            kubectl,
            namespace,
            manifest(
                "edited", instances=1, batching={"maxBatchSize": 4}, resources={"limits": {"cpu": "2", "memory": "2Gi"}}
            ),
        )

        def updated() -> dict[str, Any] | None:
            deployment = kubectl.get("deployment", "edited", namespace)
            return deployment if deployment and env_of(deployment)["OMP_NUM_THREADS"] == "2" else None

        deployment = wait_for(updated, what="threads recomputed for 1 instance on 2 CPUs")
        assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"] == {
            "limits": {"cpu": "2", "memory": "2Gi"}
        }
        assert deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION] != first_hash
        config = parse_model_config(kubectl.get("configmap", "edited-config", namespace)["data"]["config.pbtxt"])  # type: ignore[index]
        assert (config.max_batch_size, config.instance_group[0].count) == (4, 1)

    def test_autoscaling_added_then_removed(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
    ) -> None:
        apply_text(
            kubectl,
            namespace,
            manifest(
                "scaled", autoscaling={"minReplicas": 1, "maxReplicas": 3, "metric": "pendingRequests", "target": 4}
            ),
        )
        hpa = wait_for(lambda: kubectl.get(AUTOSCALING[kubernetes.name], "scaled", namespace), what="HPA")
        assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "inferop_pending_requests"
        apply_text(kubectl, namespace, manifest("scaled"))
        wait_for(lambda: kubectl.get("hpa", "scaled", namespace) is None, what="HPA deleted")

    def test_manual_edits_of_children_are_reverted(self, kubectl: Kubectl, namespace: str) -> None:
        apply_text(kubectl, namespace, manifest("drift"))
        wait_for(lambda: kubectl.get("deployment", "drift", namespace), what="Deployment")
        kubectl.run("-n", namespace, "set", "env", "deployment/drift", "OMP_NUM_THREADS=16")
        kubectl.run("-n", namespace, "scale", "deployment/drift", "--replicas=5")
        kubectl.run(
            "-n",
            namespace,
            "patch",
            "configmap",
            "drift-config",
            "--type=merge",
            "-p",
            '{"data":{"config.pbtxt":"name: \\"x\\""}}',
        )

        def reverted() -> bool:
            deployment = kubectl.get("deployment", "drift", namespace) or {}
            config_map = kubectl.get("configmap", "drift-config", namespace) or {}
            return (
                env_of(deployment).get("OMP_NUM_THREADS") == "1"
                and deployment["spec"]["replicas"] == 1
                and config_map["data"]["config.pbtxt"].startswith('name: "conv_net"')
            )

        wait_for(reverted, timeout=RESYNC_SECONDS * 5 + 10, what="drift reverted")

    def test_deleting_the_service_removes_its_children(self, kubectl: Kubectl, namespace: str) -> None:
        apply_text(kubectl, namespace, manifest("doomed"))
        wait_for(lambda: kubectl.get("service", "doomed", namespace), what="Service")
        kubectl.run("-n", namespace, "delete", "infsvc", "doomed")
        for kind, name in (("deployment", "doomed"), ("configmap", "doomed-config"), ("service", "doomed")):
            wait_for(
                lambda kind=kind, name=name: kubectl.get(kind, name, namespace) is None,
                what=f"{kind} garbage-collected",
            )


class TestStatus:
    def test_status_follows_the_deployment_to_ready(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
    ) -> None:
        """The pod becomes ready (kwok runs it; on 1.20 the test writes what a kubelet would into its status), and
        the ReplicaSet and Deployment controllers carry that up to the Deployment's status, and the operator to the
        service's."""
        apply_text(kubectl, namespace, manifest("ready-check"))
        service = wait_for(
            lambda: (
                kubectl.get("infsvc", "ready-check", namespace)
                if condition(kubectl.get("infsvc", "ready-check", namespace), "Ready")
                else None
            ),
            what="status",
        )
        assert service["status"]["url"] == f"http://ready-check.{namespace}.svc:8000"
        assert service["status"]["observedGeneration"] == service["metadata"]["generation"]
        if not runs_pods(kubernetes):
            # Pending until its status says otherwise.
            assert service["status"]["phase"] == "Progressing"
            assert condition(service, "Ready")["reason"] == "ReplicasNotReady"  # type: ignore[index]
            pod = wait_for(lambda: pod_of(kubectl, namespace, "ready-check"), what="Pod")
            conditions = [{"type": "Ready", "status": "True"}, {"type": "ContainersReady", "status": "True"}]
            patch = json.dumps({"status": {"phase": "Running", "conditions": conditions}})
            kubectl.run("-n", namespace, "patch", "pod", pod, "--subresource=status", "--type=merge", "-p", patch)

        def is_ready() -> dict[str, Any] | None:
            current = kubectl.get("infsvc", "ready-check", namespace)
            return current if (condition(current, "Ready") or {}).get("status") == "True" else None

        service = wait_for(is_ready, what="Ready condition")
        assert service["status"]["phase"] == "Ready"
        assert (service["status"]["replicas"], service["status"]["readyReplicas"]) == (1, 1)
        assert condition(service, "Available")["status"] == "True"  # type: ignore[index]
        printed = kubectl.run("-n", namespace, "get", "infsvc", "ready-check").stdout
        assert "2x(1+1)/2cpu" in printed and f"http://ready-check.{namespace}.svc:8000" in printed

    def test_restarting_the_operator_changes_nothing(
        self, kubectl: Kubectl, namespace: str, operator: OperatorRunner, kubernetes: KubernetesRelease
    ) -> None:
        apply_text(kubectl, namespace, manifest("steady"))
        # Converged: the Deployment controller has reported (its pod runs where kwok does, and stays Pending on
        # 1.20) and the operator has followed it.
        settled = "MinimumReplicasAvailable" if runs_pods(kubernetes) else "MinimumReplicasUnavailable"
        wait_for(
            lambda: (condition(kubectl.get("infsvc", "steady", namespace), "Available") or {}).get("reason") == settled,
            what="status following the Deployment",
        )

        def versions() -> dict[str, str]:
            return {
                kind: (kubectl.get(kind, name, namespace) or {})["metadata"]["resourceVersion"]
                for kind, name in (
                    ("deployment", "steady"),
                    ("configmap", "steady-config"),
                    ("service", "steady"),
                    ("infsvc", "steady"),
                )
            }

        before = versions()
        snapshot = kubectl.get("infsvc", "steady", namespace)
        operator.restart()
        # Nothing happening can only be observed over time: the restarted operator resumes and
        # re-applies everything at least twice in this window.
        time.sleep(RESYNC_SECONDS * 3)
        after = kubectl.get("infsvc", "steady", namespace)
        assert versions() == before, (snapshot, after)
        # ...and it is alive: an edit made now is applied.
        apply_text(kubectl, namespace, manifest("steady", instances=1))
        wait_for(
            lambda: env_of(kubectl.get("deployment", "steady", namespace) or {}).get("OMP_NUM_THREADS") == "2",
            what="edit applied",
        )


class TestWarningsOnChange:
    def test_warnings_are_posted_once_across_resyncs_and_restarts(
        self, kubectl: Kubectl, namespace: str, operator: OperatorRunner, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A spec without a CPU limit deploys with a warning, and an oversubscribed one is refused with one: each is
        posted when it first holds, not again on every resync nor when a restarted operator resumes."""
        no_cpu = manifest("no-cpu", instances=1, resources={"limits": {"memory": "1Gi"}})
        apply_text(kubectl, namespace, no_cpu)
        assert kubectl.apply(namespace, EXAMPLES / "refused" / "oversubscribed.yaml").returncode == 0
        wait_for(lambda: _warnings(kubectl, namespace, "no-cpu", NO_CPU_WARNING), what="the no-CPU warning")
        wait_for(lambda: _warnings(kubectl, namespace, "oversubscribed", "thread budget"), what="the refusal")

        def drift_reverted() -> None:
            """Proof that a resync ran: only a reconcile reverts a manual scale of the Deployment."""
            kubectl.run("-n", namespace, "scale", "deployment/no-cpu", "--replicas=3")

            def reverted() -> bool:
                deployment = kubectl.get("deployment", "no-cpu", namespace)
                return deployment is not None and deployment["spec"]["replicas"] == 1

            wait_for(reverted, timeout=RESYNC_SECONDS * 5 + 10, what="a resync to revert the scale")

        for _ in range(3):
            drift_reverted()
        resumed = len(_handler_runs(caplog, namespace, "no-cpu", "Handler 'on_change' succeeded"))
        refusals_handled = len(_handler_failures(caplog, namespace, "oversubscribed"))
        operator.restart()
        # The restarted operator resumes both services: its log says so.
        wait_for(
            lambda: len(_handler_runs(caplog, namespace, "no-cpu", "Handler 'on_change' succeeded")) > resumed,
            what="no-cpu resumed",
        )
        wait_for(
            lambda: len(_handler_failures(caplog, namespace, "oversubscribed")) > refusals_handled,
            what="oversubscribed resumed",
        )
        drift_reverted()

        assert _warnings(kubectl, namespace, "no-cpu", NO_CPU_WARNING) == 1
        assert _warnings(kubectl, namespace, "oversubscribed", "thread budget") == 1


# How a container fails, as kwok plays it (the annotations of scripts/kwok/pod-crashloop.yaml) and as the test
# writes it into the pod's status on 1.20, where no kubelet runs: (annotations, state, last state).
FAILURES: dict[str, tuple[dict[str, str], dict[str, Any], dict[str, Any]]] = {
    "OOMKilled": (
        {"reason": "OOMKilled", "exit-code": "137"},
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
        {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
    ),
    "CrashLoopBackOff": (
        {"reason": "Error", "exit-code": "1", "message": "E: failed to load model conv_net"},
        {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
        {"terminated": {"reason": "Error", "exitCode": 1, "message": "E: failed to load model conv_net"}},
    ),
}
CRASHLOOP = "pod-container-crashloop.stage.kwok.x-k8s.io"


def fail_container(kubectl: Kubectl, kubernetes: KubernetesRelease, namespace: str, pod: str, failure: str) -> None:
    """Make the pod's triton container fail as `failure` says: kwok crash-loops it where it runs the pods (the back-off
    held long, so the status stays put while the test looks), the test writes a kubelet's report on 1.20."""
    annotations, state, last_state = FAILURES[failure]
    if not runs_pods(kubernetes):
        _set_triton_state(kubectl, namespace, pod, state, last_state)
        return
    settings = {f"{CRASHLOOP}/{key}": value for key, value in {**annotations, "backoff": "1h"}.items()}
    kubectl.run("-n", namespace, "annotate", "pod", pod, *[f"{key}={value}" for key, value in settings.items()])
    kubectl.run("-n", namespace, "label", "pod", pod, f"{CRASHLOOP}=true")


class TestAdvice:
    """Why pods fail, with the fix, in the status (PodsHealthy, Progressing) and one Warning event per change. kwok
    crash-loops containers where it runs the pods; what it cannot play (an image pull, a rollout past its deadline)
    and everything on 1.20 the test writes into the status of the pod the Deployment's ReplicaSet created, or of
    the Deployment, as a kubelet or the Deployment controller would."""

    @pytest.mark.parametrize("failure", list(FAILURES))
    def test_a_failing_container_is_explained_once(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease, failure: str
    ) -> None:
        name = failure.lower()
        apply_text(kubectl, namespace, manifest(name))
        wait_for(lambda: condition(kubectl.get("infsvc", name, namespace), "PodsHealthy"), what="PodsHealthy")
        pod = wait_for(lambda: pod_of(kubectl, namespace, name), what="the ReplicaSet's pod")
        memory = kubectl.get("infsvc", name, namespace)["status"]["memory"]  # type: ignore[index]
        assert memory["availableBytes"] == 2**30  # the example's 1Gi limit, above the estimate
        expected = {
            "OOMKilled": [
                f"container triton of pod {pod} was OOM-killed at its memory limit of 1Gi",
                "set resources.limits",
            ],
            "CrashLoopBackOff": ["last exited with code 1 (Error): E: failed to load model conv_net"],
        }[failure]
        fail_container(kubectl, kubernetes, namespace, pod, failure)
        found = wait_for(
            lambda: advice(kubectl, namespace, name, "PodsHealthy", failure), what=f"PodsHealthy {failure}"
        )
        assert found["status"] == "False"
        for words in expected:
            assert words in found["message"], found["message"]
        resynced(kubectl, namespace, name)
        resynced(kubectl, namespace, name)
        assert warnings_about(kubectl, namespace, name, failure) == 1

    def test_an_image_pull_and_a_stuck_rollout_are_explained_once_each(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
    ) -> None:
        name = "advice"
        apply_text(kubectl, namespace, manifest(name))
        wait_for(lambda: condition(kubectl.get("infsvc", name, namespace), "PodsHealthy"), what="PodsHealthy")
        pod = wait_for(lambda: pod_of(kubectl, namespace, name), what="the ReplicaSet's pod")
        if runs_pods(kubernetes):  # what the test writes comes after kwok's report, not before it
            wait_for(
                lambda: (kubectl.get("deployment", name, namespace) or {}).get("status", {}).get("readyReplicas"),
                what="kwok to run the pod",
            )

        _set_triton_state(kubectl, namespace, pod, {"waiting": {"reason": "ImagePullBackOff", "message": "x"}}, {})
        found = wait_for(
            lambda: advice(kubectl, namespace, name, "PodsHealthy", "ImagePullFailed"), what="PodsHealthy ImagePull"
        )
        assert found["status"] == "False"
        for words in ("cannot pull image", "registry is reachable", "imagePullSecrets"):
            assert words in found["message"], found["message"]
        resynced(kubectl, namespace, name)
        resynced(kubectl, namespace, name)
        assert warnings_about(kubectl, namespace, name, "ImagePullFailed") == 1

        # Meanwhile the rollout passes its deadline (the Deployment controller keeps a timed-out condition as it is
        # while the pod is not ready).
        deployment = kubectl.get("deployment", name, namespace)
        assert deployment is not None
        assert deployment["spec"]["progressDeadlineSeconds"] == 60 + 300  # the example's startupSeconds + 300
        stuck = {
            "type": "Progressing",
            "status": "False",
            "reason": "ProgressDeadlineExceeded",
            "message": f'ReplicaSet "{name}-x" has timed out progressing.',
            "lastUpdateTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        patch = json.dumps({"status": {"conditions": [stuck]}})
        kubectl.run("-n", namespace, "patch", "deployment", name, "--subresource=status", "--type=merge", "-p", patch)
        found = wait_for(
            lambda: advice(kubectl, namespace, name, "Progressing", "ProgressDeadlineExceeded"),
            what="Progressing ProgressDeadlineExceeded",
        )
        assert "no progress for 360s" in found["message"] and "timeouts.startupSeconds" in found["message"]
        resynced(kubectl, namespace, name)
        resynced(kubectl, namespace, name)
        assert warnings_about(kubectl, namespace, name, "ProgressDeadlineExceeded") == 1

        # Then the pod recovers: ready, nothing in its last state. The condition clears.
        _set_triton_state(kubectl, namespace, pod, {"running": {}}, {}, ready=True)
        cleared = wait_for(
            lambda: advice(kubectl, namespace, name, "PodsHealthy", "NoFailures"), what="PodsHealthy cleared"
        )
        assert cleared["status"] == "True"

    def test_oom_advice_above_the_estimate_says_by_how_much(
        self, kubectl: Kubectl, namespace: str, kubernetes: KubernetesRelease
    ) -> None:
        name = "oom"
        apply_text(kubectl, namespace, manifest(name))
        pod = wait_for(lambda: pod_of(kubectl, namespace, name), what="the ReplicaSet's pod")
        wait_for(lambda: condition(kubectl.get("infsvc", name, namespace), "PodsHealthy"), what="PodsHealthy")
        required = kubectl.get("infsvc", name, namespace)["status"]["memory"]["requiredBytes"]  # type: ignore[index]
        fail_container(kubectl, kubernetes, namespace, pod, "OOMKilled")
        found = wait_for(lambda: advice(kubectl, namespace, name, "PodsHealthy", "OOMKilled"), what="OOMKilled")
        assert f"{format_bytes(2**30 - required)} " in found["message"]
        assert "raise runtime.memoryOverhead" in found["message"]
        assert "set resources.limits.memory to 1311Mi" in found["message"]  # the 1Gi limit x 1.28, rounded up


def _set_triton_state(
    kubectl: Kubectl,
    namespace: str,
    pod: str,
    state: dict[str, Any],
    last_state: dict[str, Any],
    ready: bool = False,
) -> None:
    """Write the triton container's state into the pod's status, and the pod's readiness with it, as a kubelet
    would."""
    status = {
        "name": "triton",
        "image": "nvcr.io/nvidia/tritonserver:24.08-py3",
        "imageID": "",
        "ready": ready,
        "restartCount": 3,
        "state": state,
        "lastState": last_state,
    }
    conditions = [{"type": kind, "status": str(ready)} for kind in ("Ready", "ContainersReady")]
    patch = json.dumps({"status": {"phase": "Running", "conditions": conditions, "containerStatuses": [status]}})
    kubectl.run("-n", namespace, "patch", "pod", pod, "--subresource=status", "--type=merge", "-p", patch)


class TestNetworkPolicy:
    def test_a_network_policy_comes_with_the_option_and_goes_without_it(self, kubectl: Kubectl, namespace: str) -> None:
        name = "fenced"
        fenced = manifest(name, networkPolicy={"enabled": True, "metricsNamespace": "monitoring"})
        apply_text(kubectl, namespace, fenced)
        policy = wait_for(lambda: kubectl.get("networkpolicy", name, namespace), what="NetworkPolicy")
        deployment = wait_for(lambda: kubectl.get("deployment", name, namespace), what="Deployment")
        # every pod of the service: the Deployment's, and a rollout's candidate's
        pods = deployment["spec"]["template"]["metadata"]["labels"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pods.items()
        assert "app.kubernetes.io/component" not in policy["spec"]["podSelector"]["matchLabels"]
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["ingress"] == [
            {"ports": [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8001}]},
            {
                "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
                "ports": [{"protocol": "TCP", "port": 8002}],
            },
        ]
        assert policy["metadata"]["ownerReferences"][0]["name"] == name

        patch = json.dumps({"spec": {"networkPolicy": {"enabled": False}}})
        kubectl.run("patch", "infsvc", name, "-n", namespace, "--type=merge", "-p", patch)
        wait_for(lambda: kubectl.get("networkpolicy", name, namespace) is None, what="NetworkPolicy deleted")
        assert wait_for(lambda: _events(kubectl, namespace, "NetworkPolicyRemoved"), what="NetworkPolicyRemoved")


NO_CPU_WARNING = "no CPU limit or request set"


def _warnings(kubectl: Kubectl, namespace: str, name: str, prefix: str) -> int:
    """How many times a Warning starting with `prefix` was posted about `name` (Events repeated in place count)."""
    items = json.loads(kubectl.run("-n", namespace, "get", "events", "-o", "json").stdout)["items"]
    return sum(
        int(e.get("count") or 1)
        for e in items
        if e["type"] == "Warning" and e["involvedObject"]["name"] == name and e["message"].startswith(prefix)
    )


def _handler_runs(caplog: pytest.LogCaptureFixture, namespace: str, name: str, message: str) -> list[logging.LogRecord]:
    """kopf's log records about `name` whose message contains `message`: one per handler run."""
    return [
        record
        for record in caplog.records
        if getattr(record, "k8s_ref", {}).get("namespace") == namespace
        and getattr(record, "k8s_ref", {}).get("name") == name
        and message in record.getMessage()
    ]


def _handler_failures(caplog: pytest.LogCaptureFixture, namespace: str, name: str) -> list[logging.LogRecord]:
    """kopf's log records of a handler run about `name` that ended in a PermanentError: one per run."""
    return _handler_runs(caplog, namespace, name, "failed permanently")


def _events(kubectl: Kubectl, namespace: str, reason: str) -> list[dict[str, Any]]:
    items = json.loads(kubectl.run("-n", namespace, "get", "events", "-o", "json").stdout)["items"]
    return [e for e in items if e.get("reason") == reason or (reason == "Warning" and e.get("type") == "Warning")]


class TestPodSecurity:
    """A namespace that enforces the "restricted" Pod Security Standard: the current release's PodSecurity
    admission admits the operator's Triton pods and refuses a privileged pod; 1.20 has no such admission, and the
    same label lets anything in (the rendered pods are held to the standard there by
    tests/operator/test_operator_pod_security.py)."""

    def test_triton_pods_are_admitted_and_a_privileged_pod_is_not(
        self, kubectl: Kubectl, kubernetes: KubernetesRelease
    ) -> None:
        namespace = f"restricted-{uuid.uuid4().hex[:8]}"
        kubectl.run("create", "namespace", namespace)
        try:
            kubectl.run("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
            applied = kubectl.apply(namespace, EXAMPLES / "inception-v3.yaml")
            assert applied.returncode == 0, applied.stderr
            selector = label_selector({INSTANCE: "inception-v3"})
            pods = wait_for(
                lambda: json.loads(kubectl.run("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)[
                    "items"
                ],
                what="the Triton pod, admitted",
            )
            assert pods[0]["spec"]["securityContext"]["runAsNonRoot"] is True

            privileged = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "privileged"},
                "spec": {
                    "containers": [
                        {"name": "c", "image": "busybox", "securityContext": {"privileged": True}},
                    ]
                },
            }
            result = kubectl.run("apply", "-n", namespace, "-f", "-", stdin=json.dumps(privileged), check=False)
            if kubernetes.name == "1.20":
                assert result.returncode == 0, result.stderr
            else:
                assert result.returncode != 0
                assert 'violates PodSecurity "restricted:latest"' in result.stderr
                assert "privileged" in result.stderr
        finally:
            kubectl.run("delete", "namespace", namespace, "--wait=false", check=False)

"""A model in object storage on the real node: an InferenceService on `s3://` gets a pod whose fetch init container
(`inferop fetch` in the local operator image, run by the kubelet with the credentials of a real Secret) brings the
model from a real S3 server (versitygw, on the host's end of the node's link), and the pod's Triton serves it. A
changed object stops the pod, and the status names the object and both digests; each other way a fetch fails
becomes its own condition with advice, from the status the kubelet reports."""

from __future__ import annotations

import json
import socket
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from inferop_core.objectstore import push, sha256_file
from inferop_devtools.cluster.node import NodeSite
from inferop_devtools.cluster.tools import kube_tools
from inferop_devtools.s3 import S3Server
from inferop_operator.identity import FETCH_CONTAINER
from tests.helpers import MODEL_BUCKET, TINY, ExportedRepo, push_tiny, wait_for
from tests.kube.helpers import Kubectl, advice, apply_text, pod_of, resynced, warnings_about
from tests.node.helpers import Cluster, one_cpu

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]

SECRET = "model-store"
INFEROP = Path(sys.executable).with_name("inferop")


@pytest.fixture(scope="module")
def host_address(cluster: tuple[Cluster, str, dict[str, Any]]) -> str:
    """Where the node's pods reach the host: its end of the node's link."""
    return NodeSite.of(cluster[0].state_dir).host_address


@pytest.fixture(scope="module")
def s3(host_address: str) -> Iterator[S3Server]:
    """The S3 server with the bucket MODEL_BUCKET, where the node's pods reach it."""
    with S3Server(address=host_address) as server:
        server.make_bucket(MODEL_BUCKET)
        yield server


@pytest.fixture(scope="module")
def pushed(s3: S3Server, exported_tiny: ExportedRepo) -> str:
    return push_tiny(s3, exported_tiny)


@pytest.fixture
def kubectl(kube: Cluster) -> Kubectl:
    return Kubectl(Path(kube.env["KUBECONFIG"]), kube_tools(), Path(kube.kubectl))


@pytest.fixture
def namespace(kubectl: Kubectl) -> Iterator[str]:
    """A namespace for one test: its Secret, its events; deleted with its pods afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kubectl.run("create", "namespace", name)
    yield name
    # The namespace controller deletes the pods, then comes back after the longest grace period among them however
    # soon they end (its estimateGracefulTermination): a serving pod's is the drain, the request timeout and 15 s,
    # 30 s here. Its namespace took 32 s on a quiet machine, more than 60 in a full test run.
    kubectl.run("delete", "namespace", name, "--wait=true", check=False, timeout=180)


def in_storage(
    name: str, exported_tiny: ExportedRepo, uri: str, endpoint: str, attempts: int = 2, timeout_seconds: int = 30
) -> str:
    """The tiny conv net at 1 CPU (it fits beside the others on the 2-CPU node), its model in object storage behind
    the Secret SECRET."""
    found = one_cpu(name, exported_tiny, "conv_net")
    storage = {"endpoint": endpoint, "credentialsSecret": SECRET, "attempts": attempts}
    found["spec"]["model"] |= {"storageUri": uri, "storage": storage | {"downloadTimeoutSeconds": timeout_seconds}}
    return yaml.safe_dump(found)


def with_secret(kubectl: Kubectl, namespace: str, credentials: dict[str, str]) -> None:
    literals = [f"--from-literal={key}={value}" for key, value in credentials.items()]
    kubectl.run("-n", namespace, "create", "secret", "generic", SECRET, *literals)


def fetch_status(kubectl: Kubectl, namespace: str, name: str) -> dict[str, Any]:
    """The fetch init container's status as the kubelet reports it, once it has ended at least once."""

    def ended() -> dict[str, Any] | None:
        pod = kubectl.get("pod", pod_of(kubectl, namespace, name) or "-", namespace) or {}
        for status in pod.get("status", {}).get("initContainerStatuses", []):
            if status["name"] == FETCH_CONTAINER and (
                "terminated" in status["state"] or "terminated" in status.get("lastState", {})
            ):
                return dict(status)
        return None

    return wait_for(ended, 120, f"the kubelet to run {FETCH_CONTAINER} of {name}", interval=0.5)


def test_a_service_on_s3_is_fetched_by_its_pod_and_served(
    kube: Cluster, kubectl: Kubectl, namespace: str, s3: S3Server, pushed: str, exported_tiny: ExportedRepo
) -> None:
    with_secret(kubectl, namespace, s3.credentials())
    apply_text(kubectl, namespace, in_storage("stored", exported_tiny, f"{pushed}/conv_net", s3.url))
    deployment = wait_for(lambda: kubectl.get("deployment", "stored", namespace), what="the Deployment")
    assert s3.secret_key not in json.dumps(deployment)  # only references to the Secret

    ready = kubectl.run(
        "-n", namespace, "wait", "--for=condition=Ready", "infsvc/stored", "--timeout=120s", check=False
    )
    assert "condition met" in ready.stdout, kubectl.run("-n", namespace, "describe", "pods", check=False).stdout
    status = fetch_status(kubectl, namespace, "stored")
    assert status["state"]["terminated"]["exitCode"] == 0 and status["restartCount"] == 0, status
    pod = kubectl.get("pod", pod_of(kubectl, namespace, "stored") or "-", namespace)
    assert pod is not None
    answer = kube.run_in_node(
        str(INFEROP), "infer", "--url", f"{pod['status']['podIP']}:8000", "--model", "conv_net", "--json"
    )
    # The pod's answer is the exported model's: ONNX Runtime here on the board `infer` draws (its default seed).
    import onnxruntime as ort

    from inferop.client import load_board

    board = load_board(None, [1, TINY["rows"], TINY["cols"]], 0)[None]
    session = ort.InferenceSession(str(exported_tiny.path / "conv_net" / "1" / "model.onnx"))
    policy, value = session.run(["policy", "value"], {"board": board})
    said = json.loads(answer)
    np.testing.assert_allclose(said["policy"], policy[0], rtol=1e-5, atol=1e-6)
    assert abs(said["value"] - float(value.ravel()[0])) < 1e-5
    service = kubectl.get("infsvc", "stored", namespace)
    assert service is not None
    assert not [w for w in service["status"].get("warnings", []) if "sha256" in w]


def test_a_changed_object_stops_the_pod_with_both_digests_in_the_status(
    kubectl: Kubectl, namespace: str, signed: S3Server, exported_tiny: ExportedRepo
) -> None:
    prefix = f"changed-{uuid.uuid4().hex[:8]}"
    push(exported_tiny.path, f"s3://{MODEL_BUCKET}/{prefix}", signed.endpoint)
    stored = signed.root / MODEL_BUCKET / prefix / "conv_net" / "1" / "model.onnx"
    content = bytearray(stored.read_bytes())
    content[len(content) // 3] ^= 0x10
    stored.write_bytes(bytes(content))
    with_secret(kubectl, namespace, signed.credentials())
    uri = f"s3://{MODEL_BUCKET}/{prefix}/conv_net"
    apply_text(kubectl, namespace, in_storage("changed", exported_tiny, uri, signed.url))

    status = fetch_status(kubectl, namespace, "changed")
    ended = status["state"].get("terminated") or status["lastState"]["terminated"]
    assert ended["exitCode"] == 1
    found = wait_for(
        lambda: advice(kubectl, namespace, "changed", "PodsHealthy", "ModelDigestMismatch"),
        60,
        "PodsHealthy ModelDigestMismatch",
    )
    assert found["status"] == "False"
    for words in (
        f"container {FETCH_CONTAINER} of pod",
        f"{uri}/1/model.onnx",
        sha256_file(stored),
        sha256_file(exported_tiny.path / "conv_net" / "1" / "model.onnx"),
        "push the exported model again",
    ):
        assert words in found["message"], found["message"]
    pod = kubectl.get("pod", pod_of(kubectl, namespace, "changed") or "-", namespace)
    assert pod is not None
    started = [c for c in pod["status"].get("containerStatuses", []) if "running" in c["state"]]
    assert not started  # the kubelet never started Triton: nothing to serve
    resynced(kubectl, namespace, "changed")
    resynced(kubectl, namespace, "changed")
    assert warnings_about(kubectl, namespace, "changed", "ModelDigestMismatch") == 1


@pytest.fixture(scope="module")
def silent_endpoint(host_address: str) -> Iterator[str]:
    """An endpoint that takes connections and never answers (a server stuck mid-request)."""
    with socket.socket() as listener:
        listener.bind((host_address, 0))
        listener.listen(64)  # the kernel completes each handshake; nothing reads or writes
        yield f"http://{host_address}:{listener.getsockname()[1]}"


def closed_endpoint(host_address: str) -> str:
    with socket.socket() as probe:
        probe.bind((host_address, 0))
        return f"http://{host_address}:{probe.getsockname()[1]}"  # closed again: connections are refused


# Each way a fetch fails but the digest (tested above): the URI ("pushed": the pushed model), the endpoint, whether the
# Secret holds a wrong secret key, and words the condition's message must hold.
FAILURES = {
    "ModelBucketNotFound": ("s3://no-such-bucket/repo/conv_net", "s3", False, "create the bucket"),
    "ModelObjectNotFound": (f"s3://{MODEL_BUCKET}/no-such-prefix/conv_net", "s3", False, "inferop push"),
    "ModelAccessDenied": ("pushed", "s3", True, "spec.model.storage.credentialsSecret"),
    "ModelEndpointUnreachable": ("pushed", "closed", False, "spec.model.storage.endpoint"),
    "ModelDownloadTimeout": ("pushed", "silent", False, "spec.model.storage.downloadTimeoutSeconds"),
}


@pytest.mark.parametrize("reason", FAILURES)
def test_each_failed_fetch_becomes_its_condition_with_advice_and_one_warning(
    reason: str,
    kubectl: Kubectl,
    namespace: str,
    host_address: str,
    s3: S3Server,
    pushed: str,
    silent_endpoint: str,
    exported_tiny: ExportedRepo,
) -> None:
    where, server, wrong_key, words = FAILURES[reason]
    uri = f"{pushed}/conv_net" if where == "pushed" else where
    endpoint = {"s3": s3.url, "closed": closed_endpoint(host_address), "silent": silent_endpoint}[server]
    credentials = s3.credentials() | ({"AWS_SECRET_ACCESS_KEY": "not-the-key"} if wrong_key else {})
    with_secret(kubectl, namespace, credentials)
    # One attempt and the shortest deadline the spec admits, so that the unreachable and silent endpoints fail
    # within seconds.
    apply_text(kubectl, namespace, in_storage("failing", exported_tiny, uri, endpoint, attempts=1, timeout_seconds=5))

    status = fetch_status(kubectl, namespace, "failing")
    ended = status["state"].get("terminated") or status["lastState"]["terminated"]
    assert ended["exitCode"] == 1, status
    found = wait_for(lambda: advice(kubectl, namespace, "failing", "PodsHealthy", reason), 60, f"PodsHealthy {reason}")
    assert found["status"] == "False"
    assert f"container {FETCH_CONTAINER} of pod" in found["message"], found["message"]
    assert words in found["message"], found["message"]
    assert s3.secret_key not in found["message"]
    resynced(kubectl, namespace, "failing")
    assert warnings_about(kubectl, namespace, "failing", reason) == 1

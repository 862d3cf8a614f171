"""A model in object storage through the operator on the real control plane: an InferenceService on `s3://` gets a
pod whose fetch init container (played here as the kubelet runs it, against a real S3 server, with the credentials
of a real Secret) brings the model, which a real tritonserver then serves under the operator's config; a changed
object stops the pod, and the status names the object and both digests, with one Warning."""

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
from inferop_devtools.cluster.controlplane import KubernetesRelease
from inferop_devtools.gateway.kubelet import run_init_container
from inferop_operator.builders import CONFIG_KEY, FETCHED
from inferop_operator.identity import FETCH_CONTAINER
from tests.helpers import MODEL_BUCKET, SERVE_EXTRA, TINY, ExportedRepo, serving, wait_for
from tests.kube.helpers import Kubectl, advice, apply_text, pod_of, resynced, runs_pods, warnings_about

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]

SECRET = "model-store"
INFEROP = Path(sys.executable).with_name("inferop")


def in_storage(
    name: str, exported_tiny: ExportedRepo, uri: str, endpoint: str, attempts: int = 2, timeout_seconds: int = 30
) -> str:
    """The manifest export writes for the tiny conv net, its model in object storage behind the Secret SECRET."""
    from inferop_export.manifest import build_manifest

    found = build_manifest(exported_tiny.reports["conv_net"].spec, name)
    storage = {"endpoint": endpoint, "credentialsSecret": SECRET, "attempts": attempts}
    found["spec"]["model"] |= {"storageUri": uri, "storage": storage | {"downloadTimeoutSeconds": timeout_seconds}}
    return yaml.safe_dump(found)


def with_secret(kubectl: Kubectl, namespace: str, credentials: dict[str, str]) -> None:
    literals = [f"--from-literal={key}={value}" for key, value in credentials.items()]
    kubectl.run("-n", namespace, "create", "secret", "generic", SECRET, *literals)


def play_fetch(kubectl: Kubectl, namespace: str, name: str, workdir: Path, kubernetes: KubernetesRelease) -> Any:
    """Run the service's pod's fetch init container as the kubelet would, and write its status into the pod."""
    pod_name = wait_for(lambda: pod_of(kubectl, namespace, name), what="the ReplicaSet's pod")
    if runs_pods(kubernetes):  # what the test writes comes after kwok's report, not before it
        wait_for(
            lambda: (kubectl.get("deployment", name, namespace) or {}).get("status", {}).get("readyReplicas"),
            what="kwok to run the pod",
        )
    pod = kubectl.get("pod", pod_name, namespace)
    assert pod is not None
    (container,) = [c for c in pod["spec"]["initContainers"] if c["name"] == FETCH_CONTAINER]
    status = run_init_container(
        pod, container, workdir, [INFEROP.parent], lambda secret: kubectl.get("secret", secret, namespace) or {}
    )
    patch = json.dumps({"status": {"initContainerStatuses": [status]}})
    kubectl.run("-n", namespace, "patch", "pod", pod_name, "--subresource=status", "--type=merge", "-p", patch)
    return status


def test_a_service_on_s3_is_fetched_by_its_pod_and_served(
    kubectl: Kubectl,
    namespace: str,
    kubernetes: KubernetesRelease,
    s3: Any,
    pushed: str,
    exported_tiny: ExportedRepo,
    tmp_path: Path,
) -> None:
    with_secret(kubectl, namespace, s3.credentials())
    apply_text(kubectl, namespace, in_storage("stored", exported_tiny, f"{pushed}/conv_net", s3.url))
    deployment = wait_for(lambda: kubectl.get("deployment", "stored", namespace), what="the Deployment")
    assert s3.secret_key not in json.dumps(deployment)  # only references to the Secret

    status = play_fetch(kubectl, namespace, "stored", tmp_path, kubernetes)
    assert status["state"]["terminated"]["exitCode"] == 0, (tmp_path / f"{FETCH_CONTAINER}.log").read_text()

    # What the layout container and Triton see: the fetched model under the operator's config.
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    import tritonclient.http as httpclient

    config = kubectl.get("configmap", "stored-config", namespace)
    assert config is not None
    model = tmp_path / "repo" / "conv_net"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(config["data"][CONFIG_KEY])
    fetched = tmp_path / "volumes" / "model-source" / FETCHED
    (model / "1" / "model.onnx").symlink_to(fetched / "1" / "model.onnx")
    with serving(tmp_path / "repo") as url:
        client = httpclient.InferenceServerClient(url, network_timeout=30)
        try:
            board = httpclient.InferInput("board", [1, 1, TINY["rows"], TINY["cols"]], "FP32")
            board.set_data_from_numpy(np.zeros((1, 1, TINY["rows"], TINY["cols"]), dtype=np.float32))
            assert client.infer("conv_net", [board]).as_numpy("policy").shape == (1, TINY["moves"])
        finally:
            client.close()
    service = kubectl.get("infsvc", "stored", namespace)
    assert service is not None
    assert not [w for w in service["status"].get("warnings", []) if "sha256" in w]


def test_a_changed_object_stops_the_pod_with_both_digests_in_the_status(
    kubectl: Kubectl,
    namespace: str,
    kubernetes: KubernetesRelease,
    signed: Any,
    exported_tiny: ExportedRepo,
    tmp_path: Path,
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

    status = play_fetch(kubectl, namespace, "changed", tmp_path, kubernetes)
    assert status["lastState"]["terminated"]["exitCode"] == 1
    found = wait_for(
        lambda: advice(kubectl, namespace, "changed", "PodsHealthy", "ModelDigestMismatch"),
        what="PodsHealthy ModelDigestMismatch",
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
    assert not (tmp_path / "volumes" / "model-source" / FETCHED).exists()  # nothing for Triton to serve
    resynced(kubectl, namespace, "changed")
    resynced(kubectl, namespace, "changed")
    assert warnings_about(kubectl, namespace, "changed", "ModelDigestMismatch") == 1


@pytest.fixture(scope="module")
def silent_endpoint() -> Iterator[str]:
    """An endpoint that takes connections and never answers (a server stuck mid-request)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)  # the kernel completes each handshake; nothing reads or writes
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


def closed_endpoint() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: connections are refused


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
    kubernetes: KubernetesRelease,
    s3: Any,
    pushed: str,
    silent_endpoint: str,
    exported_tiny: ExportedRepo,
    tmp_path: Path,
) -> None:
    where, server, wrong_key, words = FAILURES[reason]
    uri = f"{pushed}/conv_net" if where == "pushed" else where
    endpoint = {"s3": s3.url, "closed": closed_endpoint(), "silent": silent_endpoint}[server]
    credentials = s3.credentials() | ({"AWS_SECRET_ACCESS_KEY": "not-the-key"} if wrong_key else {})
    with_secret(kubectl, namespace, credentials)
    # One attempt and the shortest deadline the spec admits, so that the unreachable and silent endpoints fail
    # within seconds.
    apply_text(kubectl, namespace, in_storage("failing", exported_tiny, uri, endpoint, attempts=1, timeout_seconds=5))

    status = play_fetch(kubectl, namespace, "failing", tmp_path, kubernetes)
    assert status["lastState"]["terminated"]["exitCode"] == 1
    found = wait_for(lambda: advice(kubectl, namespace, "failing", "PodsHealthy", reason), what=f"PodsHealthy {reason}")
    assert found["status"] == "False"
    assert f"container {FETCH_CONTAINER} of pod" in found["message"], found["message"]
    assert words in found["message"], found["message"]
    assert s3.secret_key not in found["message"]
    resynced(kubectl, namespace, "failing")
    assert warnings_about(kubectl, namespace, "failing", reason) == 1

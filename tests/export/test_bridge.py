"""What the operator renders really starts and serves.

The Triton container's args and env and the rendered config.pbtxt from the operator's builders are run
with the local tritonserver on an exported model: the layout init script lays the repository out (paths
moved into a temporary directory), local serving translates the platform to our python backend as it
always does, and the Triton HTTP client calls it. Only the addresses and ports are ours.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferop_core import scheduling
from inferop_operator import builders
from inferop_operator.identity import GROUP
from inferop_operator.plan import plan_service
from inferop_operator.spec import parse_spec

pytestmark = pytest.mark.integration

# Flags the local server sets itself: where to listen and which repository to read.
LOCAL_FLAGS = ("--model-repository=", "--http-port=", "--grpc-port=", "--metrics-port=")


def rendered_service(model_repo: Any) -> builders.Service:
    from inferop_export.manifest import build_manifest

    report = model_repo.reports["conv_net"]
    source = Path(report.config_path).parent
    manifest = build_manifest(report.spec)
    assert manifest["spec"]["model"]["storageUri"] == f"hostpath://{source.resolve()}"
    manifest["spec"]["timeouts"]["requestSeconds"] = 3
    spec = parse_spec(manifest["spec"])
    return builders.Service(
        name="bridge", namespace="default", uid="4f7c", spec=spec, plan=plan_service(spec), image="tritonserver"
    )


def lay_out(service: builders.Service, root: Path) -> Path:
    """Run the Deployment's layout init container script with its mount paths moved under `root`."""
    deployment = builders.build_deployment(service)
    layout = next(c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == "layout-model")
    config_dir, models = root / "config", root / "models"
    config_dir.mkdir()
    config_map = builders.build_config_map(service)
    (config_dir / builders.CONFIG_KEY).write_text(config_map["data"][builders.CONFIG_KEY])
    source = service.spec.model.storage_uri.removeprefix("hostpath://")
    script = (
        layout["command"][2]
        .replace(builders.MODEL_SOURCE, source)
        .replace(builders.CONFIG_DIR, str(config_dir))
        .replace(builders.MODEL_REPOSITORY, str(models))
    )
    subprocess.run(["sh", "-c", script], check=True, capture_output=True, text=True)
    return models


def repository_index_status(url: str, headers: dict[str, str]) -> tuple[int, str]:
    """POST /v2/repository/index (the model-repository API) and return Triton's status code and answer."""
    request = urllib.request.Request(f"http://{url}/v2/repository/index", data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_rendered_deployment_starts_and_serves(
    model_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import TritonInstall, TritonServer, free_port

    service = rendered_service(model_repo)
    models = lay_out(service, tmp_path)
    deployment = builders.build_deployment(service)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = [arg for arg in container["args"] if not arg.startswith(LOCAL_FLAGS)]
    for variable in container["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])
    # The container's command as rendered (sh draws the token, then execs chrt and tritonserver with "$@"),
    # with `tritonserver` on PATH being the local binary.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "tritonserver").symlink_to(TritonInstall.locate().binary)

    class RenderedCommand(TritonServer):
        def command(self, install: TritonInstall, local_repo: Path) -> list[str]:
            local = super().command(install, local_repo)
            return [*container["command"], *local[1:]]

    policy = service.spec.runtime.cpu_scheduling
    path = {"PATH": f"{bin_dir}{os.pathsep}{TritonInstall.locate().environment()['PATH']}"}
    server = RenderedCommand(models, http_port=free_port(), extra_args=args, cpu_scheduling=policy, env=path)
    with server:
        assert server.process is not None
        argv = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().decode().split("\0")
        assert argv[0] == "tritonserver"  # sh and chrt exec'd into the server, which kept the policy
        expected = os.SCHED_BATCH if scheduling.command_prefix(policy) else os.SCHED_OTHER
        assert os.sched_getscheduler(server.process.pid) == expected
        (flag,) = [arg for arg in argv if arg.startswith("--http-restricted-api=")]
        token = flag.rsplit(f"{builders.ADMIN_HEADER}=", 1)[1]
        assert len(token) == 32
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        try:
            config = client.get_model_config("conv_net")
            assert config["max_batch_size"] == service.spec.batching.max_batch_size
            queue_policy = config["dynamic_batching"]["default_queue_policy"]
            assert int(queue_policy["default_timeout_microseconds"]) == 3_000_000
            assert config["parameters"]["intra_op_thread_count"]["string_value"] == str(service.plan.threads.intra_op)

            board = np.random.default_rng(7).integers(-1, 2, size=(3, 1, 6, 5)).astype(np.float32)
            request = httpclient.InferInput("board", list(board.shape), "FP32")
            request.set_data_from_numpy(board, binary_data=True)
            response = client.infer("conv_net", [request])
            session = ort.InferenceSession(str(model_repo.model_path("conv_net")), providers=["CPUExecutionProvider"])
            expected_policy, expected_value = session.run(["policy", "value"], {"board": board})
            np.testing.assert_allclose(response.as_numpy("policy"), expected_policy, atol=1e-5)
            np.testing.assert_allclose(response.as_numpy("value"), expected_value, atol=1e-5)

            # The model-repository API is closed: without the header, and with the token the operator used to
            # derive from the service's uid (which anyone who can read the InferenceService could compute).
            old_token = hashlib.sha256(f"{GROUP}/{service.uid}".encode()).hexdigest()[:32]
            for headers in ({}, {builders.ADMIN_HEADER: old_token}):
                status, answer = repository_index_status(server.url, headers)
                assert status == 403, (headers, status, answer)
                assert f"expecting header '{builders.ADMIN_HEADER}'" in answer, answer
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_model_repository_index(headers={builders.ADMIN_HEADER: old_token})
            # Only the token in the server's own argv opens it: the API works, the header is what closes it.
            assert repository_index_status(server.url, {builders.ADMIN_HEADER: token})[0] == 200
        finally:
            client.close()
        assert server.log_path is not None
        log = server.log_path.read_text(errors="replace")
    # The token is in no object the operator renders, and Triton did not log it.
    rendered = json.dumps([c.build(service, c.versions[0]) for c in builders.CHILDREN if c.wanted(service)])
    assert token not in rendered and token not in json.dumps(deployment)
    assert token not in log

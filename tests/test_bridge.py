"""What the operator renders really starts and serves.

The Triton container's args and env and the rendered config.pbtxt from the operator's builders are run
with the local tritonserver on an exported model: the layout init script lays the repository out (paths
moved into a temporary directory), local serving translates the platform to our python backend as it
always does, and the Triton HTTP client calls it. Only the addresses and ports are ours.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferop import scheduling
from inferop_operator import builders
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


def test_rendered_deployment_starts_and_serves(
    model_repo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import onnxruntime as ort
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import TritonServer, free_port

    service = rendered_service(model_repo)
    models = lay_out(service, tmp_path)
    container = builders.build_deployment(service)["spec"]["template"]["spec"]["containers"][0]
    *prefix, binary = container["command"]
    assert binary == "tritonserver"
    assert prefix == scheduling.command_prefix(service.spec.runtime.cpu_scheduling)
    args = [arg for arg in container["args"] if not arg.startswith(LOCAL_FLAGS)]
    for variable in container["env"]:
        monkeypatch.setenv(variable["name"], variable["value"])

    policy = service.spec.runtime.cpu_scheduling
    with TritonServer(models, http_port=free_port(), extra_args=args, cpu_scheduling=policy) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        try:
            config = client.get_model_config("conv_net")
            assert config["max_batch_size"] == service.spec.batching.max_batch_size
            policy = config["dynamic_batching"]["default_queue_policy"]
            assert int(policy["default_timeout_microseconds"]) == 3_000_000
            assert config["parameters"]["intra_op_thread_count"]["string_value"] == str(service.plan.threads.intra_op)

            board = np.random.default_rng(7).integers(-1, 2, size=(3, 1, 6, 5)).astype(np.float32)
            request = httpclient.InferInput("board", list(board.shape), "FP32")
            request.set_data_from_numpy(board, binary_data=True)
            response = client.infer("conv_net", [request])
            session = ort.InferenceSession(str(model_repo.model_path("conv_net")), providers=["CPUExecutionProvider"])
            expected_policy, expected_value = session.run(["policy", "value"], {"board": board})
            np.testing.assert_allclose(response.as_numpy("policy"), expected_policy, atol=1e-5)
            np.testing.assert_allclose(response.as_numpy("value"), expected_value, atol=1e-5)

            # The model repository API is closed to callers, open with the operator's header.
            with pytest.raises(InferenceServerException, match="restricted"):
                client.get_model_repository_index()
            index = client.get_model_repository_index(headers={builders.ADMIN_HEADER: service.admin_token})
            assert [entry["name"] for entry in index] == ["conv_net"]
        finally:
            client.close()

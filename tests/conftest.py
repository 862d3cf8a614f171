"""Shared fixtures: the tiny conv net's sizes, Inception built once, and the real tritonserver.

The expensive things (building Inception, exporting it, starting tritonserver) happen once per session;
fixtures for them skip with a reason that says how to get what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

T = TypeVar("T")

# A policy/value net small enough to export in a couple of seconds.
TINY = {"rows": 6, "cols": 5, "depth": 2, "hidden": 8, "moves": 5}

# Serving settings of the integration repository, as an InferenceService spec spells them. The queue delay is
# long enough that concurrent batch-1 requests meet in the dynamic batcher; one instance each, so a long
# request keeps the model busy.
SERVING: dict[str, dict[str, Any]] = {
    "conv_net": {
        "instances": 1,
        "threads": {"intraOp": 1, "interOp": 1},
        "batching": {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 20_000, "maxQueueSize": 32},
        "timeouts": {"requestSeconds": 5.0},
    },
    "inception_v3": {
        "instances": 1,
        "threads": {"intraOp": 2, "interOp": 1},
        "batching": {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 20_000, "maxQueueSize": 16},
        "timeouts": {"requestSeconds": 10.0},
    },
}

SERVE_EXTRA = "install the serving extra: .venv/bin/pip install -e '.[serve]' (or make install)"
NO_GPU = "no NVIDIA GPU with onnxruntime-gpu's CUDA provider here: scripts/gpu-check.sh runs the gpu tier"
EXPORT_EXTRA = "install the export distribution (torch, ONNX): .venv/bin/pip install -e ./export (or make install)"


def wait_for(probe: Callable[[], T | None], timeout: float = 20.0, what: str = "condition", interval: float = 0.1) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last: {result!r})")
        time.sleep(interval)


@pytest.fixture(scope="session")
def inception_network() -> Any:
    """inception_v3(): seeded random weights with recalibrated BatchNorm, built once."""
    pytest.importorskip("torchvision", reason=EXPORT_EXTRA)
    from inferop_export.networks.inception_v3 import inception_v3

    return inception_v3()


@dataclass(frozen=True)
class ExportedRepo:
    path: Path
    reports: dict[str, Any]  # model name -> inferop_export.exporter.ExportReport

    def model_path(self, model: str) -> Path:
        return Path(self.reports[model].model_path)


@pytest.fixture(scope="session")
def model_repo(tmp_path_factory: pytest.TempPathFactory, inception_network: Any) -> ExportedRepo:
    """A Triton repository with the tiny conv net and the real Inception V3, exported and verified."""
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    repo = tmp_path_factory.mktemp("model_repo")
    reports = {
        "conv_net": export_model(conv_net(**TINY), repo, serving=parse_serving(SERVING["conv_net"]), quiet=True),
        "inception_v3": export_model(
            inception_network, repo, serving=parse_serving(SERVING["inception_v3"]), quiet=True
        ),
    }
    return ExportedRepo(path=repo, reports=reports)


@dataclass(frozen=True)
class RunningServer:
    server: Any  # inferop.serving.tritonserver.TritonServer
    initial_statistics: dict[str, dict[str, Any]]  # per model, read right after the server became ready

    @property
    def url(self) -> str:
        return str(self.server.url)


@pytest.fixture(scope="session")
def triton(model_repo: ExportedRepo) -> Iterator[RunningServer]:
    """The real tritonserver on `model_repo`, started once, on free ports."""
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    import tritonclient.http as httpclient

    from inferop.serving.tritonserver import TritonServer, free_port

    with TritonServer(model_repo.path, http_port=free_port()) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        try:
            initial = {model: client.get_inference_statistics(model)["model_stats"][0] for model in model_repo.reports}
        finally:
            client.close()  # an open connection would hold up the server's shutdown
        yield RunningServer(server=server, initial_statistics=initial)


@pytest.fixture
def client(triton: RunningServer) -> Iterator[Any]:
    """An HTTP client with a network timeout, so a request that hangs fails the test instead."""
    import tritonclient.http as httpclient

    connection = httpclient.InferenceServerClient(triton.url, connection_timeout=10, network_timeout=30)
    yield connection
    connection.close()

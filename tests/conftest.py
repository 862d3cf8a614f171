"""Shared fixtures: Inception built once, the exported repository and the real tritonserver (what they share
beyond fixtures lives in tests/helpers.py).

The expensive things (building Inception, exporting it, starting tritonserver) happen once per session;
fixtures for them skip with a reason that says how to get what is missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import (
    EXPORT_EXTRA,
    MODEL_BUCKET,
    PIPELINE_MAX_IMAGE_BYTES,
    SERVE_EXTRA,
    SERVING,
    TINY,
    ExportedRepo,
    PipelineRepo,
    RunningServer,
    push_tiny,
)

# Figures a test measured on the way (e.g. how long a scale took), printed at the end of the run: a print would go
# to the operator's runner, which captures the standard streams while it runs.
MEASURED: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if MEASURED:
        terminalreporter.section("measured")
        for line in MEASURED:
            terminalreporter.write_line(line)


@pytest.fixture()
def measured(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a figure for the run's summary, under the test's id."""
    return lambda line: MEASURED.append(f"{request.node.nodeid.split('::')[-1]}: {line}")


@pytest.fixture(scope="session")
def inception_network() -> Any:
    """inception_v3(): seeded random weights with recalibrated BatchNorm, built once."""
    pytest.importorskip("torchvision", reason=EXPORT_EXTRA)
    from inferop_export.networks.inception_v3 import inception_v3

    return inception_v3()


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


@pytest.fixture(scope="session")
def pipeline_repo(model_repo: ExportedRepo, tmp_path_factory: pytest.TempPathFactory) -> PipelineRepo:
    """Inception V3 behind its image pipeline (the ensemble `inception_v3`), as a Triton repository."""
    from inferop.serving.localrepo import write_pipeline_repo
    from inferop_core.tritonconfig import PipelineConfig, member_name, parse_model_config, read_serving_config

    exported = model_repo.path / "inception_v3"
    model = read_serving_config(parse_model_config((exported / "config.pbtxt").read_text()))
    config = PipelineConfig(
        name="inception_v3",
        model=model.model_copy(update={"name": member_name("inception_v3", "model")}),
        top_k=5,
        max_image_bytes=PIPELINE_MAX_IMAGE_BYTES,
        max_image_pixels=4_000_000,
    )
    return PipelineRepo(write_pipeline_repo(config, exported, tmp_path_factory.mktemp("pipeline") / "repo"), config)


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


@pytest.fixture(scope="session")
def s3() -> Iterator[Any]:
    """A real S3 server (versitygw, scripts/s3-server.sh, built by make tools) with the bucket MODEL_BUCKET."""
    from inferop_devtools.s3 import S3Server

    with S3Server() as server:
        server.make_bucket(MODEL_BUCKET)
        yield server


@pytest.fixture
def signed(s3: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The S3 server, with its credentials in this process's environment, where the S3 client reads them."""
    for name, value in s3.credentials().items():
        monkeypatch.setenv(name, value)
    return s3


@pytest.fixture(scope="session")
def exported_tiny(tmp_path_factory: pytest.TempPathFactory) -> ExportedRepo:
    """The tiny conv net exported alone (one model directory, conv_net), as object-storage tests push it."""
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net

    repo = tmp_path_factory.mktemp("exported")
    return ExportedRepo(path=repo, reports={"conv_net": export_model(conv_net(**TINY), repo, quiet=True)})


@pytest.fixture(scope="session")
def pushed(s3: Any, exported_tiny: ExportedRepo) -> str:
    return push_tiny(s3, exported_tiny)

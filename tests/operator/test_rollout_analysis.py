"""A rollout's analysis reads a real Prometheus scraping a real tritonserver, the series labelled as the chart's
PodMonitor labels them (namespace, the service's name, the track): what one track did in a window, and nothing of
the other's; behind an image pipeline, its failures and not the images it refused."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import numpy as np
import pytest

from inferop_devtools.bench.pipeline import png_declaring
from inferop_devtools.prometheus import Prometheus
from inferop_export.pipeline import ask, encodings, photographs
from inferop_operator.analysis import PrometheusUnreachable, series_label, track_window
from inferop_operator.identity import COMPONENT, INSTANCE
from tests.helpers import TINY, PipelineRepo, RunningServer, python_stubs, wait_for

pytestmark = pytest.mark.integration
CANDIDATE_POD = {
    "namespace": "models",
    "pod": "conv-net-canary-0",
    series_label(INSTANCE): "conv-net",
    series_label(COMPONENT): "canary",
}


@pytest.fixture(scope="module")
def prometheus(triton: RunningServer) -> Iterator[Prometheus]:
    with Prometheus([f"127.0.0.1:{triton.server.metrics_port}"], labels=CANDIDATE_POD) as server:
        server.wait_for_targets()
        yield server


def success(model: str) -> str:
    return f'nv_inference_request_success{{model="{model}",namespace="models"}}'


def successes(prometheus: Prometheus, model: str = "conv_net") -> float:
    found = prometheus.query(f"sum({success(model)})")
    return found[0].value if found else 0.0


def window_covered(prometheus: Prometheus, moment: float, model: str = "conv_net") -> bool:
    """Whether Prometheus holds a sample of Triton's counters scraped after `moment` (seconds since the epoch), and
    twelve or more in the minute the test reads: increase() extrapolates a series to the window's edges by up to 1.1
    of its mean interval on each side, so a series sampled twelve times reads at most 20% high."""
    latest = prometheus.query(f"max(timestamp({success(model)}))")
    samples = prometheus.query(f"max(count_over_time({success(model)}[60s]))")
    return bool(latest and samples) and latest[0].value > moment and samples[0].value >= 12


def test_one_tracks_requests_failures_and_time_over_a_window(triton: RunningServer, prometheus: Prometheus) -> None:
    import tritonclient.http as httpclient

    before = successes(prometheus)
    client = httpclient.InferenceServerClient(triton.url, network_timeout=30)
    try:
        board = np.zeros((1, 1, TINY["rows"], TINY["cols"]), dtype=np.float32)
        request = httpclient.InferInput("board", list(board.shape), "FP32")
        request.set_data_from_numpy(board)
        for _ in range(30):
            client.infer("conv_net", [request])
        for _ in range(3):  # a queue timeout of 1 µs: Triton rejects it, a failed request in its counters
            with pytest.raises(Exception, match=r"[Tt]imeout"):
                client.infer("conv_net", [request], timeout=1)
    finally:
        client.close()
    answered = time.time()
    wait_for(lambda: successes(prometheus) >= before + 30, timeout=20, what="the requests in Prometheus")
    wait_for(lambda: window_covered(prometheus, answered), timeout=60, what="a scrape after the last request")
    figures = track_window(prometheus.url, "models", "conv-net", "conv_net", "candidate", 60)
    # increase() extrapolates to the window's edges: the counts are near, not exact
    assert figures.requests == pytest.approx(33, rel=0.35)
    assert figures.failures >= 1 and figures.failure_ratio is not None and figures.failure_ratio < 0.3
    assert figures.mean_latency_ms is not None and 0 < figures.mean_latency_ms < 1000
    stable = track_window(prometheus.url, "models", "conv-net", "conv_net", "stable", 60)
    assert (stable.requests, stable.failure_ratio, stable.mean_latency_ms) == (0, None, None)


def test_a_prometheus_that_does_not_answer() -> None:
    from inferop_devtools.cluster.controlplane import free_ports

    with pytest.raises(PrometheusUnreachable, match="cannot be asked"):
        track_window(f"http://127.0.0.1:{free_ports(1)[0]}", "models", "conv-net", "conv_net", "candidate", 60)


def test_a_pipelines_failures_are_its_members_not_the_images_it_refuses(pipeline_repo: PipelineRepo) -> None:
    """Callers' bad images are answered 400 and are no failure of the revision; a stage that dies is (500s)."""
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import TritonServer, free_port

    config, labels = pipeline_repo.config, {**CANDIDATE_POD, "pod": "images-canary-0", series_label(INSTANCE): "images"}
    photo = encodings(photographs()["chelsea"])["jpeg75x1"]
    refused = [b"", b"%PDF-1.7 a document", photo[: len(photo) // 3], png_declaring(20_000, 20_000), b"\xff\xd8"]
    with (
        TritonServer(pipeline_repo.path, http_port=free_port()) as server,
        Prometheus([f"127.0.0.1:{server.metrics_port}"], labels=labels) as prometheus,
    ):
        prometheus.wait_for_targets()
        for _ in range(20):
            ask(server.url, config.name, photo)
        for data in refused:
            with pytest.raises(InferenceServerException) as raised:
                ask(server.url, config.name, data)
            assert raised.value.status() == "400", raised.value
        assert server.process is not None
        for stub in python_stubs(config.members["post"], server.process.pid).values():
            os.kill(stub.pid, signal.SIGKILL)
        for _ in range(3):
            with pytest.raises(InferenceServerException) as raised:
                ask(server.url, config.name, photo)
            assert raised.value.status() == "500", raised.value
        answered = time.time()
        wait_for(lambda: successes(prometheus, config.name) >= 20, timeout=20, what="the requests in Prometheus")
        wait_for(lambda: window_covered(prometheus, answered, config.name), timeout=60, what="a later scrape")
        figures = track_window(
            prometheus.url, "models", "images", config.name, "candidate", 60, list(config.members.values())
        )
        ensemble = track_window(prometheus.url, "models", "images", config.name, "candidate", 60)
    # increase() extrapolates to the window's edges: the counts are near, not exact
    assert figures.failures == pytest.approx(3, rel=0.35) and figures.requests == pytest.approx(23, rel=0.35)
    # the ensemble's own counter: each refused image and each failure twice
    assert ensemble.failures == pytest.approx(2 * (len(refused) + 3), rel=0.35)

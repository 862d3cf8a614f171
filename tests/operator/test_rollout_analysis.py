"""A rollout's analysis reads a real Prometheus scraping a real tritonserver, the series labelled as the chart's
PodMonitor labels them (namespace, the service's name, the track): what one track did in a window, and nothing of
the other's."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from inferop_devtools.prometheus import Prometheus
from inferop_operator.analysis import PrometheusUnreachable, series_label, track_window
from inferop_operator.identity import COMPONENT, INSTANCE
from tests.helpers import TINY, RunningServer, wait_for

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


def successes(prometheus: Prometheus) -> float:
    found = prometheus.query('sum(nv_inference_request_success{model="conv_net",namespace="models"})')
    return found[0].value if found else 0.0


SUCCESS = 'nv_inference_request_success{model="conv_net",namespace="models"}'


def window_covered(prometheus: Prometheus, moment: float) -> bool:
    """Whether Prometheus holds a sample of Triton's counters scraped after `moment` (seconds since the epoch), and
    twelve or more in the minute the test reads: increase() extrapolates a series to the window's edges by up to 1.1
    of its mean interval on each side, so a series sampled twelve times reads at most 20% high."""
    latest = prometheus.query(f"max(timestamp({SUCCESS}))")
    samples = prometheus.query(f"max(count_over_time({SUCCESS}[60s]))")
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

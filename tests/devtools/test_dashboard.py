"""The chart's Grafana dashboard: rendered only when asked for, with the label Grafana's sidecar loads, and every
query of the Triton and kubelet panels answered with data, in its panel's unit, by a real Prometheus scraping two
real tritonservers under load (a stable pod under a pod's CPU and memory limits, and a canary) and a real cAdvisor
reading the stable pod's cgroup. The gateway's panel needs a real Envoy Gateway: the rollout drill reads it
(tests/devtools/test_rollout_dataplane.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop.limits import PodLimits, cgroup_unavailable_reason
from inferop.serving.tritonserver import TritonServer, free_port
from inferop_devtools.cluster.addons import Cadvisor, ContainerName, addon_binaries, kubelet_job
from inferop_devtools.cluster.controlplane import ClusterError
from inferop_devtools.dashboard import (
    DASHBOARD_PATH,
    ENVOY_STATS_FLUSH_SECONDS,
    PANELS,
    Panel,
    dashboard,
    evaluate,
    plausible,
    rendered,
)
from inferop_devtools.prometheus import Prometheus, PrometheusError, find_binary, render_chart
from inferop_operator.identity import TRITON_CONTAINER
from tests.devtools.test_prometheus import POD
from tests.helpers import ExportedRepo, RunningServer, wait_for
from tests.runtime.test_triton import infer, sample

TRACK = "app_kubernetes_io_component"
# A PodMonitor's scrape of the two Triton pods of the service POD names: the stable one and a rollout's candidate.
STABLE = POD | {TRACK: "predictor"}
CANARY = POD | {"pod": "conv-net-canary-6b8d4f-r7tmw", TRACK: "canary"}
# The stable pod's limits: half a CPU, which one caller of Inception V3 keeps it at (the conv net's callers alone
# ask less than a fifth of a CPU of it).
LIMITS = PodLimits(cpus=0.5, memory_bytes=2 * 2**30)
TRACKS = {STABLE[TRACK], CANARY[TRACK]}
# Scrapes every 2 s, so that each may take 2 s (a scrape's timeout is at most its interval): the stable pod's
# metrics endpoint answers slowly at its CPU limit, and a scrape that times out leaves a gap in its series.
SCRAPE_SECONDS = 2
VARIABLES = {"$namespace": POD["namespace"], "$service": POD["app_kubernetes_io_instance"]}
INTERVAL_SECONDS = 8  # the $__interval of a short time range: rates over 10 s
CALLERS = 4  # closed-loop callers: enough for batches of more than one
# Each caller sends this many calls to the stable pod for every one to the canary: the rollout's weight.
STABLE_CALLS = 3
CGROUPS = cgroup_unavailable_reason()


def test_the_chart_s_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD_PATH.read_text() == rendered()


def test_each_panel_has_a_unit_and_every_query_its_own_legend() -> None:
    panels = dashboard()["panels"]
    assert [p["title"] for p in panels] == [p.title for p in PANELS]
    assert all(p["fieldConfig"]["defaults"]["unit"] for p in panels)
    assert all(len({t["refId"] for t in p["targets"]}) == len(p["targets"]) for p in panels)


@pytest.mark.parametrize("scrape_seconds", [0.5, 1, 2, 5, 10, 15, 30, 60])
@pytest.mark.parametrize("interval_seconds", [0.1, 1, 4, 30])
def test_the_gateway_s_window_spans_an_envoy_flush_at_any_scrape_interval(
    scrape_seconds: float, interval_seconds: float
) -> None:
    """Envoy's histograms change once per stats flush: a rate window whose samples (a scrape short of it at either
    end) span less than a flush can hold no change, and the quantiles read NaN with traffic flowing."""
    (gateway,) = (panel for panel in PANELS if panel.source == "gateway")
    window = gateway.rate_interval_seconds(interval_seconds, scrape_seconds)
    assert window - 2 * scrape_seconds >= ENVOY_STATS_FLUSH_SECONDS
    (shipped,) = (p for p in dashboard()["panels"] if p["title"] == gateway.title)
    assert shipped["interval"] == f"{gateway.min_interval_seconds}s"  # what makes Grafana widen it


@pytest.mark.integration
def test_the_chart_renders_it_only_when_enabled_with_the_sidecar_s_label() -> None:
    def config_maps(*args: str) -> list[dict[str, Any]]:
        documents = yaml.safe_load_all(render_chart(*args))
        return [d for d in documents if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]

    assert config_maps() == []
    (shipped,) = config_maps("--set", "dashboard.enabled=true")
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["inferop.json"]) == dashboard()


def read(prometheus: Prometheus, panel: Panel) -> dict[str, dict[str, float]]:
    return evaluate(prometheus, panel, VARIABLES, INTERVAL_SECONDS, SCRAPE_SECONDS)


@pytest.fixture(scope="module")
def stable_pod(model_repo: ExportedRepo) -> Iterator[TritonServer]:
    """The stable track's pod: a real tritonserver serving both models inside LIMITS, in a cgroup of its own."""
    if CGROUPS is not None:
        pytest.skip(CGROUPS)
    with TritonServer(model_repo.path, http_port=free_port(), limits=LIMITS) as server:
        yield server


@pytest.fixture
def loaded(stable_pod: TritonServer, triton: RunningServer, model_repo: ExportedRepo) -> Iterator[None]:
    """CALLERS closed-loop callers of the conv net for as long as the test runs, each sending STABLE_CALLS calls to
    the stable pod for every one to the canary (the shared server), and one of Inception V3 at the stable pod."""
    import tritonclient.http as httpclient

    stop = threading.Event()

    def call(model: str, urls: list[str], seed: int) -> None:
        clients = {url: httpclient.InferenceServerClient(url, network_timeout=60) for url in set(urls)}
        try:
            while not stop.is_set():
                for url in urls:
                    infer(clients[url], model, sample(model_repo, model, 1, seed))
        finally:
            for client in clients.values():
                client.close()

    callers = [("conv_net", [stable_pod.url] * STABLE_CALLS + [triton.url], seed) for seed in range(CALLERS)]
    callers.append(("inception_v3", [stable_pod.url], 0))
    threads = [threading.Thread(target=call, args=caller, daemon=True) for caller in callers]
    for thread in threads:
        thread.start()
    yield
    stop.set()
    for thread in threads:
        thread.join(timeout=30)


def complete(found: dict[str, dict[str, float]]) -> bool:
    """Every query of a panel answered, with a series for each track where its legend shows the track."""
    return all(series and (TRACK not in legend or set(series) == TRACKS) for legend, series in found.items())


@pytest.mark.integration
def test_every_panel_returns_data_in_its_unit_under_load(
    stable_pod: TritonServer, triton: RunningServer, loaded: None, tmp_path: Path
) -> None:
    try:
        find_binary("prometheus")
        bin_dir = addon_binaries()
    except (PrometheusError, ClusterError) as error:  # make tools builds both before make test: missing fails
        pytest.fail(str(error))
    assert stable_pod.cgroup is not None
    # The kubelet's labels for the stable pod's cgroup; the canary runs in none, so cAdvisor has no series of it.
    containers = {stable_pod.cgroup.path: ContainerName(POD["namespace"], POD["pod"], TRITON_CONTAINER)}
    canary = {
        "job_name": "canary",
        "static_configs": [{"targets": [f"127.0.0.1:{triton.server.metrics_port}"], "labels": CANARY}],
    }
    with Cadvisor(tmp_path, bin_dir=bin_dir) as cadvisor:
        jobs = [canary, kubelet_job(cadvisor.address, containers, f"{SCRAPE_SECONDS}s")]
        stable = [f"127.0.0.1:{stable_pod.metrics_port}"]
        with Prometheus(stable, labels=STABLE, jobs=jobs, scrape_interval=f"{SCRAPE_SECONDS}s") as prometheus:
            prometheus.wait_for_targets()
            figures = {
                panel.title: wait_for(
                    lambda panel=panel: (found := read(prometheus, panel)) and complete(found) and found,
                    timeout=60,
                    interval=0.5,
                    what=f"data for every query of {panel.title!r}",
                )
                for panel in PANELS
                if panel.source != "gateway"
            }
    for panel in PANELS:
        for legend, found in figures.get(panel.title, {}).items():
            assert all(plausible(panel.unit, value) for value in found.values()), (panel.title, legend, found)
    by_outcome = figures["Requests per second by outcome"]
    assert set(by_outcome["success {{app_kubernetes_io_component}}"]) == {"predictor", "canary"}
    assert all(value > 0 for value in by_outcome["success {{app_kubernetes_io_component}}"].values())
    assert by_outcome["failed {{app_kubernetes_io_component}}"] == {"predictor": 0.0, "canary": 0.0}
    assert figures["Pods serving, by track"]["pods {{app_kubernetes_io_component}}"] == {"predictor": 1, "canary": 1}
    share = figures["Traffic share by track"]["share {{app_kubernetes_io_component}}"]
    # The callers' split, as the pods counted it over one 10 s window (Inception's calls add about 1% to the stable's).
    assert share["predictor"] == pytest.approx(STABLE_CALLS / (STABLE_CALLS + 1), abs=0.1), share
    assert sum(share.values()) == pytest.approx(1.0)
    assert all(batch >= 1 for batch in figures["Achieved batch size"]["batch {{app_kubernetes_io_component}}"].values())
    time_in_server = figures["Request time in the server"]["mean {{app_kubernetes_io_component}}"]
    parts = figures["Queue and compute time per request"]
    for part in ("queue", "compute"):  # the whole holds its parts
        found = parts[f"{part} {{{{app_kubernetes_io_component}}}}"]
        assert all(time_in_server[track] >= found[track] for track in ("predictor", "canary")), (part, found)
    # The kubelet's panels: the stable pod alone, read from its cgroup.
    memory = figures["Memory working set against the limit"]
    assert memory["limit"] == {"": LIMITS.memory_bytes}
    (working_set,) = memory["{{pod}}"].values()
    assert 2**20 < working_set < LIMITS.memory_bytes
    (throttled,) = figures["CPU throttling"]["{{pod}}"].values()
    assert throttled > 0.5  # Inception's caller asks more than half a CPU of it

"""The chart's Grafana dashboard: rendered only when asked for, with the label Grafana's sidecar loads, and every
query of Triton's panels answered with data, in its panel's unit, by a real Prometheus scraping a real tritonserver
under load."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from inferop_devtools.dashboard import DASHBOARD_PATH, PANELS, Panel, dashboard, rendered
from inferop_devtools.prometheus import Prometheus, PrometheusError, find_binary, render_chart
from tests.devtools.test_prometheus import POD
from tests.helpers import ExportedRepo, RunningServer, wait_for
from tests.runtime.test_triton import infer, new_client, sample

# A PodMonitor's scrape of one Triton pod of the service POD names.
LABELS = POD | {"app_kubernetes_io_component": "predictor"}
VARIABLES = {"$namespace": POD["namespace"], "$service": POD["app_kubernetes_io_instance"], "$__rate_interval": "5s"}
# What a value in each panel's unit must be, for a served service under load.
PLAUSIBLE: dict[str, Callable[[float], bool]] = {
    "reqps": lambda value: value >= 0,
    "ms": lambda value: value > 0,
    "none": lambda value: value >= 0,
}
CALLERS = 4  # closed-loop callers: enough for batches of more than one


def test_the_chart_s_dashboard_is_the_generated_one() -> None:
    assert DASHBOARD_PATH.read_text() == rendered()


def test_each_panel_has_a_unit_and_every_query_its_own_legend() -> None:
    panels = dashboard()["panels"]
    assert [p["title"] for p in panels] == [p.title for p in PANELS]
    assert all(p["fieldConfig"]["defaults"]["unit"] for p in panels)
    assert all(len({t["refId"] for t in p["targets"]}) == len(p["targets"]) for p in panels)


@pytest.mark.integration
def test_the_chart_renders_it_only_when_enabled_with_the_sidecar_s_label() -> None:
    def config_maps(*args: str) -> list[dict[str, Any]]:
        documents = yaml.safe_load_all(render_chart(*args))
        return [d for d in documents if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]

    assert config_maps() == []
    (shipped,) = config_maps("--set", "dashboard.enabled=true")
    assert shipped["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(shipped["data"]["inferop.json"]) == dashboard()


def with_variables(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


@pytest.fixture
def loaded(triton: RunningServer, model_repo: ExportedRepo) -> Iterator[None]:
    """CALLERS closed-loop callers of the conv net for as long as the test runs."""
    stop = threading.Event()

    def call() -> None:
        client = new_client(triton)
        try:
            while not stop.is_set():
                infer(client, "conv_net", sample(model_repo, "conv_net", 1, 0))
        finally:
            client.close()

    threads = [threading.Thread(target=call, daemon=True) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    yield
    stop.set()
    for thread in threads:
        thread.join(timeout=30)


def answered(prometheus: Prometheus, panel: Panel) -> dict[str, list[float]]:
    """Each query's values now; empty lists where a query has no data yet."""
    return {query.legend: [s.value for s in prometheus.query(with_variables(query.expr))] for query in panel.queries}


@pytest.mark.integration
def test_every_triton_panel_returns_data_in_its_unit_under_load(triton: RunningServer, loaded: None) -> None:
    try:
        find_binary("prometheus")
    except PrometheusError as error:  # make tools installs it before make test: missing is a failure
        pytest.fail(str(error))
    with Prometheus([f"127.0.0.1:{triton.server.metrics_port}"], labels=LABELS) as prometheus:
        prometheus.wait_for_targets()
        for panel in PANELS:
            if panel.source == "kubelet":
                # cAdvisor and kube-state-metrics run on a cluster's nodes, not here: the queries are checked as
                # PromQL by Prometheus (an error would raise), without data.
                answered(prometheus, panel)
                continue
            values = wait_for(
                lambda panel=panel: (found := answered(prometheus, panel)) and all(found.values()) and found,
                timeout=30,
                interval=0.5,
                what=f"data for every query of {panel.title!r}",
            )
            for legend, found in values.items():
                assert all(math.isfinite(v) and PLAUSIBLE[panel.unit](v) for v in found), (panel.title, legend, found)
        figures = {panel.title: answered(prometheus, panel) for panel in PANELS if panel.source == "triton"}
    by_outcome = figures["Requests per second by outcome"]
    assert by_outcome["success {{app_kubernetes_io_component}}"][0] > 0
    assert by_outcome["failed {{app_kubernetes_io_component}}"] == [0.0]
    assert figures["Pods serving, by track"]["pods {{app_kubernetes_io_component}}"] == [1.0]
    assert figures["Achieved batch size"]["batch {{app_kubernetes_io_component}}"][0] >= 1
    time_in_server = figures["Request time in the server"]["mean {{app_kubernetes_io_component}}"][0]
    parts = figures["Queue and compute time per request"]
    queue, compute = (parts[f"{part} {{{{app_kubernetes_io_component}}}}"][0] for part in ("queue", "compute"))
    assert time_in_server >= compute and time_in_server >= queue  # the whole holds its parts

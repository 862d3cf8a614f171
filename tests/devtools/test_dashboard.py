"""The chart's Grafana dashboard: the generated one, rendered only when asked for, with the label Grafana's sidecar
loads, and the gateway panel's window wide enough for Envoy's stats. Every query answering with data, in its unit, on
real pods: tests/node/test_dashboard.py (the Triton and kubelet panels) and the rollout drill (the gateway's,
tests/devtools/test_rollout_dataplane.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from inferop_devtools.dashboard import (
    DASHBOARD_PATH,
    ENVOY_STATS_FLUSH_SECONDS,
    PANELS,
    dashboard,
    rendered,
)
from inferop_devtools.prometheus import render_chart


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

"""A real Prometheus scraping the real tritonserver, with the chart's rules loaded: what a drill builds on.

The pure parts (rule extraction, config) run everywhere; the rest needs Debian's prometheus and helm."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from inferop_devtools.prometheus import (
    CHART_JOB,
    Prometheus,
    PrometheusError,
    Sample,
    chart_alert_rules,
    config,
    find_binary,
    rule_file,
)
from tests.helpers import ExportedRepo, RunningServer, wait_for
from tests.runtime.test_triton import infer, sample

# The labels a PodMonitor's scrape would add, so alerts carry what they carry in a cluster.
POD = {"namespace": "models", "pod": "conv-net-5f7c9d-x2kq4", "app_kubernetes_io_instance": "conv-net"}
# Short durations, as a drill renders them: the rules see a stall within seconds.
DRILL = {
    "monitoring.interval": "1s",
    "monitoring.scrapeTimeout": "1s",
    "monitoring.rules.rateWindow": "10s",
    "monitoring.rules.stalledFor": "2s",
}
RULE = {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "vector(1)"}]}]}


class TestRuleFile:
    def test_groups_of_every_prometheus_rule_in_order(self) -> None:
        other = {"groups": [{"name": "h", "rules": [{"record": "r", "expr": "vector(2)"}]}]}
        rendered = yaml.safe_dump_all(
            [
                {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}},
                None,
                {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "spec": RULE},
                {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "spec": other},
            ]
        )
        assert rule_file(rendered) == {"groups": RULE["groups"] + other["groups"]}

    def test_a_rendering_without_rules_says_so(self) -> None:
        with pytest.raises(PrometheusError, match="no PrometheusRule"):
            rule_file(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap"}))


def test_config_scrapes_the_targets_as_the_job_with_the_rules(tmp_path: Any) -> None:
    settings = config(["127.0.0.1:8002"], CHART_JOB, [tmp_path / "r.yaml"], "1s", "2s", POD)
    assert settings["global"] == {"scrape_interval": "1s", "evaluation_interval": "2s"}
    assert settings["rule_files"] == [str(tmp_path / "r.yaml")]
    assert settings["scrape_configs"] == [
        {"job_name": CHART_JOB, "static_configs": [{"targets": ["127.0.0.1:8002"], "labels": POD}]}
    ]


def test_config_without_targets_has_only_the_jobs_given(tmp_path: Any) -> None:
    """Pods found as a PodMonitor finds them come as jobs of their own, under the job name the rules select."""
    job = {"job_name": CHART_JOB, "file_sd_configs": [{"files": [str(tmp_path / "pods.json")]}]}
    assert config([], CHART_JOB, [], "1s", "1s", {}, jobs=[job])["scrape_configs"] == [job]


@pytest.fixture(scope="module")
def prometheus_binary() -> None:
    try:
        find_binary("prometheus")
    except PrometheusError as error:  # make tools installs it before make test: missing is a failure
        pytest.fail(str(error))


@pytest.fixture(scope="module")
def drill_rules() -> dict[str, Any]:
    """The chart's rules with a drill's durations."""
    return chart_alert_rules(DRILL)


@pytest.fixture
def prometheus(prometheus_binary: None, triton: RunningServer, drill_rules: dict[str, Any]) -> Iterator[Prometheus]:
    target = f"127.0.0.1:{triton.server.metrics_port}"
    with Prometheus([target], rule_files=[drill_rules], labels=POD) as server:
        server.wait_for_targets()
        yield server
    assert server.process is not None and server.process.poll() is not None, "prometheus outlived stop()"


def successes(prometheus: Prometheus) -> list[Sample]:
    return prometheus.query(f'nv_inference_request_success{{job="{CHART_JOB}",model="conv_net"}}')


@pytest.mark.integration
class TestAgainstTritonserver:
    def test_wait_for_alert_sees_pending_then_firing_after_for(
        self, prometheus_binary: None, triton: RunningServer
    ) -> None:
        idle = {
            "alert": "ConvNetIdle",
            "expr": 'nv_inference_pending_request_count{model="conv_net"} == 0',
            "for": "2s",
        }
        rules = {"groups": [{"name": "idle", "rules": [idle]}]}
        with Prometheus([f"127.0.0.1:{triton.server.metrics_port}"], rule_files=[rules], labels=POD) as server:
            pending = server.wait_for_alert("ConvNetIdle", state="pending", timeout=15)
            firing = server.wait_for_alert("ConvNetIdle", timeout=15)
        assert pending.active_at == firing.active_at <= pending.seen_at
        assert (firing.seen_at - firing.active_at).total_seconds() >= 2
        assert firing.labels == {
            "alertname": "ConvNetIdle",
            "job": CHART_JOB,
            "instance": server.targets[0],
            "model": "conv_net",
            "version": "1",
            **POD,
        }
        assert firing.value == 0

    def test_scrapes_tritons_success_counter(
        self, prometheus: Prometheus, client: Any, model_repo: ExportedRepo
    ) -> None:
        (before,) = successes(prometheus)
        assert before.labels == {
            "__name__": "nv_inference_request_success",
            "job": CHART_JOB,
            "instance": prometheus.targets[0],
            "model": "conv_net",
            "version": "1",
            **POD,
        }
        for seed in range(3):
            infer(client, "conv_net", sample(model_repo, "conv_net", 1, seed))
        # Triton refreshes its metrics every 2 s and Prometheus scrapes every 1 s.
        wait_for(
            lambda: [s for s in successes(prometheus) if s.value - before.value == 3],
            timeout=15,
            what="Prometheus to count the 3 requests",
        )

    def test_chart_rules_load_and_stay_quiet_while_requests_succeed(
        self, prometheus: Prometheus, client: Any, model_repo: ExportedRepo
    ) -> None:
        rules = prometheus.alert_rules()
        assert set(rules) == {"InferopQueueStalled", "InferopQueueTimeRising"}
        by = "sum by (namespace, app_kubernetes_io_instance, pod, model)"
        succeeding = f'{by} (rate(nv_inference_request_success{{job="{CHART_JOB}",model="conv_net"}}[10s])) > 0'
        pending = f'{by} (nv_inference_pending_request_count{{job="{CHART_JOB}",model="conv_net"}})'

        def healthy_traffic_seen() -> bool:
            infer(client, "conv_net", sample(model_repo, "conv_net", 1, 0))
            return bool(prometheus.query(succeeding)) and bool(prometheus.query(pending))

        # Both sides of the stall alert have data: its silence is a verdict, not an empty query.
        wait_for(healthy_traffic_seen, timeout=30, interval=0.2, what="a success rate above 0 in Prometheus")
        deadline = time.monotonic() + 4  # twice stalledFor, a few evaluations
        while time.monotonic() < deadline:
            infer(client, "conv_net", sample(model_repo, "conv_net", 1, 1))
            assert [a for a in prometheus.alerts() if a.name.startswith("Inferop")] == []
            time.sleep(0.2)
        rules = prometheus.alert_rules()
        assert rules["InferopQueueStalled"].state == "inactive"
        assert rules["InferopQueueTimeRising"].state == "inactive"
        assert {name: (rule.health, rule.last_error) for name, rule in rules.items()} == {
            "InferopQueueStalled": ("ok", ""),
            "InferopQueueTimeRising": ("ok", ""),
        }

"""The chart's prometheus-adapter rules (metricsAdapter): rendered by helm, their queries run by the real promtool on
synthetic Triton series of a pod serving two models. The end-to-end use, an HPA scaling on them, is in
tests/kube/test_autoscaling.py."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.prometheus import PrometheusError, find_binary, render_chart
from inferop_operator.builders import POD_METRICS

pytestmark = pytest.mark.integration

WINDOW = "1m"
NAMESPACE = "models"
# Pod "busy" serves a popular model whose requests wait 1 ms each, 10 a second, and a rare one whose requests
# wait 100 ms each, 1 a second; pod "idle" has served nothing since it started.
BUSY, IDLE = "conv-net-7d9f-busy", "conv-net-7d9f-idle"
SCRAPES = 13  # two minutes at 10 s, so a 1m window is full


def adapter_rules(*overrides: str) -> list[dict[str, Any]]:
    rendered = render_chart("--set", "metricsAdapter.enabled=true", *overrides)
    (config_map,) = [
        doc
        for doc in yaml.safe_load_all(rendered)
        if doc and doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-metrics-adapter")
    ]
    rules: list[dict[str, Any]] = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    return rules


def rule_for(metric: str) -> dict[str, Any]:
    (rule,) = [rule for rule in adapter_rules() if rule["name"]["as"] == POD_METRICS[metric]]
    return rule


def as_queried(rule: dict[str, Any]) -> str:
    """The rule's query as prometheus-adapter sends it for the pods of one namespace, per pod."""
    matchers = f'namespace="{NAMESPACE}",pod=~"{BUSY}|{IDLE}"'
    return str(rule["metricsQuery"]).replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", "pod")


def series(metric: str, pod: str, model: str, per_scrape: float, counter: bool = True) -> dict[str, str]:
    values = [per_scrape * i if counter else per_scrape for i in range(SCRAPES)]
    labels = f'namespace="{NAMESPACE}",pod="{pod}",model="{model}",version="1"'
    return {"series": f"{metric}{{{labels}}}", "values": " ".join(f"{v:g}" for v in values)}


def triton_series() -> list[dict[str, str]]:
    """What Prometheus scraped every 10 s from the two pods."""
    busy = [
        # popular: 100 requests and 100 x 1,000 us of queueing per 10 s
        series("nv_inference_request_success", BUSY, "popular", 100),
        series("nv_inference_queue_duration_us", BUSY, "popular", 100 * 1_000),
        series("nv_inference_pending_request_count", BUSY, "popular", 3, counter=False),
        # rare: 10 requests and 10 x 100,000 us per 10 s
        series("nv_inference_request_success", BUSY, "rare", 10),
        series("nv_inference_queue_duration_us", BUSY, "rare", 10 * 100_000),
        series("nv_inference_pending_request_count", BUSY, "rare", 2, counter=False),
    ]
    idle = [
        series(name, IDLE, model, 0, counter=name != "nv_inference_pending_request_count")
        for model in ("popular", "rare")
        for name in (
            "nv_inference_request_success",
            "nv_inference_queue_duration_us",
            "nv_inference_pending_request_count",
        )
    ]
    return busy + idle


def evaluate(expr: str, expected: dict[str, float], tmp_path: Path) -> None:
    """promtool's unit test of `expr` at the last scrape: one sample per pod, with these values."""
    test = {
        "rule_files": [],
        "evaluation_interval": "10s",
        "tests": [
            {
                "interval": "10s",
                "input_series": triton_series(),
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": f"{(SCRAPES - 1) * 10}s",
                        "exp_samples": [{"labels": f'{{pod="{pod}"}}', "value": v} for pod, v in expected.items()],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "adapter-test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    try:
        promtool = find_binary("promtool")
    except PrometheusError as missing:  # make tools installs it before make test: missing is a failure
        pytest.fail(str(missing))
    result = subprocess.run([str(promtool), "test", "rules", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rules_serve_the_metrics_the_operators_hpas_read() -> None:
    assert sorted(rule["name"]["as"] for rule in adapter_rules()) == sorted(POD_METRICS.values())
    for rule in adapter_rules():
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}


def test_queue_time_is_per_request_of_the_pods_worst_model(tmp_path: Path) -> None:
    """100 ms for the busy pod: its rare model's requests wait that long. An average over the models would say
    50.5 ms, the pod's total queueing over its total requests 10 ms: a busy model hides a starved one. The idle pod
    reads 0, not nothing, so the HPA can scale in."""
    evaluate(as_queried(rule_for("queueTime")), {BUSY: 100_000, IDLE: 0}, tmp_path)


def test_pending_requests_are_the_pods_queued_requests(tmp_path: Path) -> None:
    evaluate(as_queried(rule_for("pendingRequests")), {BUSY: 5, IDLE: 0}, tmp_path)


def test_the_window_is_a_value() -> None:
    assert all(f"[{WINDOW}]" in rule["metricsQuery"] for rule in adapter_rules())
    assert all("[30s]" in rule["metricsQuery"] for rule in adapter_rules("--set", "metricsAdapter.rateWindow=30s"))


def test_off_by_default_and_a_bad_window_names_the_value() -> None:
    assert "-metrics-adapter" not in render_chart()
    with pytest.raises(PrometheusError, match="rateWindow"):
        render_chart("--set", "metricsAdapter.enabled=true", "--set", "metricsAdapter.rateWindow=ten seconds")

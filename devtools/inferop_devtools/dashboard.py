"""The Grafana dashboard the chart ships (charts/inferop/dashboards/inferop.json): one InferenceService at a time,
chosen by namespace and service, each series split by track (predictor: the stable revision; canary: a rollout's
candidate) and Triton's series by model too (an image pipeline's ensemble and each member apart).

The panels are data here, and `python -m inferop_devtools.dashboard` writes the JSON (`--check`, in make check,
fails when the file differs). Triton's panels read the series the chart's PodMonitor scrapes, with the labels its
podTargetLabels put on them; the memory and CPU panels read the cAdvisor series each node's kubelet serves on
/metrics/cadvisor, which kube-prometheus-stack scrapes; the gateway's latency panel reads the Envoy that Envoy Gateway
runs for the service's HTTPRoute. tests/node/test_dashboard.py evaluates the Triton and kubelet queries against a
real Prometheus scraping the operator's Triton pods mid-rollout on the local node and that node's kubelet; the
rollout drill (tests/devtools/test_rollout_dataplane.py) evaluates the Triton and gateway queries mid-rollout,
through a real Envoy Gateway on the same kind of node.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from inferop.paths import repo_root
from inferop_operator.analysis import RULE_CLUSTER, series_label
from inferop_operator.identity import COMPONENT, INSTANCE, TRITON_CONTAINER

DASHBOARD_PATH = repo_root() / "charts" / "inferop" / "dashboards" / "inferop.json"
UID = "inferop-inference-service"
TRACK = series_label(COMPONENT)  # predictor or canary
MODEL = "model"  # Triton's label of each model a pod serves
SERVICE = f'namespace="$namespace",{series_label(INSTANCE)}="$service"'
# The Triton container of the service's pods, as the kubelet's cAdvisor series name it.
CONTAINER = f'namespace="$namespace",pod=~"$service-.*",container="{TRITON_CONTAINER}"'
RATE = "[$__rate_interval]"
# The clusters Envoy Gateway makes for the backends of the service's HTTPRoute (named after the service): one a
# backendRef, as the operator writes the route (analysis.route_clusters), or one a rule, as routes written before;
# a mirror's cluster (rule/N-mirror-M) is left out: no caller waits for it.
ROUTE_CLUSTERS = RULE_CLUSTER.format(namespace="$namespace", route="$service", rule="[0-9]+") + "(/backend/[0-9]+)?"
ROUTE_RULES = f'envoy_cluster_name=~"{ROUTE_CLUSTERS}"'
# Envoy's stats flush (its bootstrap's stats_flush_interval; Envoy Gateway keeps the default): the histograms that
# /stats/prometheus serves change only then, while counters move with every request.
ENVOY_STATS_FLUSH_SECONDS = 5
COMPUTE = ("nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
           "nv_inference_compute_output_duration_us")  # fmt: skip


def legend(word: str) -> str:
    """A series' legend: `word` and the track, which Grafana fills in from the label."""
    return f"{word} {{{{{TRACK}}}}}"


def model_legend(word: str) -> str:
    """A series' legend: `word`, the track and Triton's model."""
    return f"{legend(word)} {{{{{MODEL}}}}}"


def per_track(expr: str) -> str:
    return f"sum by ({TRACK}) ({expr})"


def per_model(expr: str) -> str:
    """Each track's models apart: an image pipeline's ensemble and each of its members, so a starving stage shows."""
    return f"sum by ({TRACK}, {MODEL}) ({expr})"


def rate(metric: str, extra: str = "") -> str:
    return f"rate({metric}{{{SERVICE}{extra}}}{RATE})"


def per_request(numerator: str) -> str:
    """A rate per completed request of each model; no completed request leaves no value (not a division by zero)."""
    return f"{per_model(numerator)} / {per_model(rate('nv_inference_request_success'))}"


def gateway_quantile(quantile: float) -> str:
    """A quantile of the time Envoy waited for the pods' answers (ms), over every rule of the service's route."""
    buckets = f"rate(envoy_cluster_upstream_rq_time_bucket{{{ROUTE_RULES}}}{RATE})"
    return f"histogram_quantile({quantile}, sum by (le) ({buckets}))"


def share_by_track(*rates: str) -> str:
    """Each track's part of the service's total of `rates`."""
    by_track = " + ".join(per_track(r) for r in rates)
    total = " + ".join(f"sum({r})" for r in rates)
    return f"({by_track}) / on() group_left() ({total})"


@dataclass(frozen=True)
class Query:
    legend: str
    expr: str


@dataclass(frozen=True)
class Panel:
    title: str
    unit: str  # Grafana's unit id
    description: str
    queries: tuple[Query, ...]
    source: Literal["triton", "kubelet", "gateway"] = "triton"  # who publishes the series
    # Grafana's "Min interval" of the panel: the least $__interval, which $__rate_interval exceeds by a scrape.
    min_interval_seconds: int = 0

    def rate_interval_seconds(self, interval_seconds: float, scrape_seconds: float) -> float:
        """$__rate_interval as Grafana computes it for this panel: max($__interval + scrape, 4 x scrape), with
        $__interval raised to the panel's min interval; `interval_seconds` is the one the time range gives."""
        return max(max(interval_seconds, self.min_interval_seconds) + scrape_seconds, 4 * scrape_seconds)


PANELS = (
    Panel(
        "Requests per second by outcome",
        "reqps",
        "Completed, rejected by Triton's queue (full, or waited past timeouts.requestSeconds: the designed fast "
        "rejection of overload) and failed otherwise.",
        (
            Query(model_legend("success"), per_model(rate("nv_inference_request_success"))),
            Query(model_legend("rejected"), per_model(rate("nv_inference_request_failure", ',reason="REJECTED"'))),
            Query(model_legend("failed"), per_model(rate("nv_inference_request_failure", ',reason!="REJECTED"'))),
        ),
    ),
    Panel(
        "Queue and compute time per request",
        "ms",
        "Mean time a completed request waited in Triton's queue, and ran (input, inference, output). Queue time "
        "rising at a steady rate is the first sign of overload; the queueTime autoscaling metric is the same ratio. "
        "Each model apart: behind an image pipeline, a stage whose queue grows while the model's stays short is "
        "starving it.",
        (
            Query(model_legend("queue"), f"{per_request(rate('nv_inference_queue_duration_us'))} / 1000"),
            Query(model_legend("compute"), f"{per_request(' + '.join(rate(m) for m in COMPUTE))} / 1000"),
        ),
    ),
    Panel(
        "Request time in the server",
        "ms",
        "Mean time of a completed request in Triton, from arrival to response (queue and compute together). Not "
        "quantiles: Triton computes those only with --metrics-config=summary_latencies=true, which costs the tail "
        "of a fast model (the threads field drill's conv net under SCHED_OTHER: p99 517-535 ms with it, 87 ms "
        "without), so inferop leaves it off.",
        (Query(model_legend("mean"), f"{per_request(rate('nv_inference_request_duration_us'))} / 1000"),),
    ),
    Panel(
        "Latency at the gateway",
        "ms",
        "Quantiles of the time the gateway's Envoy waited for the service's pods to answer (Envoy's histogram of "
        "upstream request time, over every backend of the service's HTTPRoute): what callers through the Gateway "
        "wait, less the network to the gateway. Only for a service routed through a Gateway of Envoy Gateway, "
        "whose Envoy pods Prometheus scrapes (/stats/prometheus); Envoy's buckets (0.5, 1, 5, 10, 25, 50, 100, "
        "250, 500 ms, 1 s...) bound the resolution. Envoy updates these histograms once per stats flush (5 s), so "
        "the panel's min interval is two flushes: a window that holds no flush has no increase to read, and the "
        "quantiles would read NaN with traffic flowing.",
        (Query("p50", gateway_quantile(0.5)), Query("p99", gateway_quantile(0.99))),
        "gateway",
        # $__rate_interval is then at least max(2 flushes + 1 scrape, 4 scrapes): the samples in it, up to a scrape
        # short of it at either end, still span a whole flush interval, whatever the scrape interval.
        min_interval_seconds=2 * ENVOY_STATS_FLUSH_SECONDS,
    ),
    Panel(
        "Achieved batch size",
        "none",
        "Samples per model execution: how full the dynamic batcher's batches are, against batching.maxBatchSize.",
        (
            Query(
                model_legend("batch"),
                f"{per_model(rate('nv_inference_count'))} / {per_model(rate('nv_inference_exec_count'))}",
            ),
        ),
    ),
    Panel(
        "Pending requests",
        "none",
        "Requests queued or executing now; its bound per pod is the queue bound in the service's status.",
        (Query(model_legend("pending"), per_model(f"nv_inference_pending_request_count{{{SERVICE}}}")),),
    ),
    Panel(
        "Pods serving, by track",
        "none",
        "Triton pods scraped and up: the replicas, and during a rollout the candidate's pods (canary) beside the "
        "stable ones.",
        (Query(legend("pods"), f"count by ({TRACK}) (up{{{SERVICE}}} == 1)"),),
    ),
    Panel(
        "Traffic share by track",
        "percentunit",
        "Each track's share of the requests the service's pods received (answered, rejected or failed): during a "
        "rollout, the weight the gateway gave the candidate (canary) as the pods saw it, beside the step in "
        "status.rollout.weight. A shadow step's mirrored copies count on the canary track too, though no caller "
        "gets their answers.",
        (
            Query(
                legend("share"),
                share_by_track(rate("nv_inference_request_success"), rate("nv_inference_request_failure")),
            ),
        ),
    ),
    Panel(
        "Memory working set against the limit",
        "bytes",
        "Each Triton container's working set (what the kernel's OOM killer weighs) and its limit; the operator's "
        "estimate with a full queue is status.memory.requiredBytes.",
        (
            Query("{{pod}}", f"sum by (pod) (container_memory_working_set_bytes{{{CONTAINER}}})"),
            Query("limit", f"max(container_spec_memory_limit_bytes{{{CONTAINER}}})"),
        ),
        "kubelet",
    ),
    Panel(
        "CPU throttling",
        "percentunit",
        "Share of CFS periods in which the Triton container was throttled at its CPU limit: threads beyond the "
        "limit (the plan refuses oversubscription) or a limit below the load.",
        (
            Query(
                "{{pod}}",
                f"sum by (pod) (rate(container_cpu_cfs_throttled_periods_total{{{CONTAINER}}}{RATE})) / "
                f"sum by (pod) (rate(container_cpu_cfs_periods_total{{{CONTAINER}}}{RATE}))",
            ),
        ),
        "kubelet",
    ),
)


def plausible(unit: str, value: float) -> bool:
    """Whether `value` can be a reading in `unit` for a served service under load."""
    if not math.isfinite(value):
        return False
    if unit == "percentunit":
        return 0 <= value <= 1
    return value > 0 if unit in ("ms", "bytes") else value >= 0


class Querier(Protocol):
    def query(self, expr: str) -> list[Any]: ...  # samples with .labels and .value (inferop_devtools.prometheus)


def evaluate(
    prometheus: Querier, panel: Panel, values: dict[str, str], interval_seconds: float, scrape_seconds: float
) -> dict[str, dict[str, float]]:
    """Each query of `panel` as Prometheus answers it now, with the dashboard's `values` for its variables and the
    $__rate_interval Grafana gives the panel at a time range's `interval_seconds` and Prometheus' `scrape_seconds`:
    by legend, each series by the label its legend shows (the track, the pod; "" for none)."""
    window = f"{panel.rate_interval_seconds(interval_seconds, scrape_seconds):g}s"
    answers: dict[str, dict[str, float]] = {}
    for query in panel.queries:
        expr = query.expr
        for name, value in (values | {"$__rate_interval": window}).items():
            expr = expr.replace(name, value)
        shown = query.legend.partition("{{")[2].partition("}}")[0]
        answers[query.legend] = {s.labels.get(shown, ""): s.value for s in prometheus.query(expr)}
    return answers


def variables() -> list[dict[str, Any]]:
    datasource = {"type": "prometheus", "uid": "${datasource}"}
    success = "nv_inference_request_success"
    return [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
        {
            "name": "namespace",
            "type": "query",
            "datasource": datasource,
            "query": {"query": f"label_values({success}, namespace)", "refId": "namespace"},
            "refresh": 2,
        },
        {
            "name": "service",
            "label": "InferenceService",
            "type": "query",
            "datasource": datasource,
            "query": {
                "query": f'label_values({success}{{namespace="$namespace"}}, {series_label(INSTANCE)})',
                "refId": "service",
            },
            "refresh": 2,
        },
    ]


def panel_json(panel: Panel, index: int) -> dict[str, Any]:
    return {
        "id": index + 1,
        "type": "timeseries",
        "title": panel.title,
        "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": 12, "x": 12 * (index % 2), "y": 8 * (index // 2)},
        "fieldConfig": {"defaults": {"unit": panel.unit}, "overrides": []},
        **({"interval": f"{panel.min_interval_seconds}s"} if panel.min_interval_seconds else {}),
        "targets": [
            {"refId": chr(ord("A") + n), "expr": query.expr, "legendFormat": query.legend}
            for n, query in enumerate(panel.queries)
        ],
    }


def dashboard() -> dict[str, Any]:
    return {
        "uid": UID,
        "title": "inferop: InferenceService",
        "description": "One InferenceService's requests, queue, latency, batching, pods, memory and CPU.",
        "tags": ["inferop", "triton"],
        "schemaVersion": 39,
        "timezone": "utc",
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": variables()},
        "panels": [panel_json(panel, index) for index, panel in enumerate(PANELS)],
    }


def rendered() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the chart's dashboard differs")
    args = parser.parse_args(argv)
    if args.check:
        if not DASHBOARD_PATH.is_file() or DASHBOARD_PATH.read_text() != rendered():
            print(f"{DASHBOARD_PATH} is stale: run python -m inferop_devtools.dashboard", file=sys.stderr)
            return 1
        return 0
    DASHBOARD_PATH.parent.mkdir(parents=True, exist_ok=True)
    DASHBOARD_PATH.write_text(rendered())
    print(DASHBOARD_PATH)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A rollout step's figures from Prometheus: each track's requests, failures and time in Triton over one window, and,
through a Gateway of Envoy Gateway, what its Envoy saw of each track's backends.

Triton's counters (nv_inference_request_success, _failure, _duration_us) per model, scraped from every pod with
the pod's labels (the chart's PodMonitor keeps app.kubernetes.io/instance and app.kubernetes.io/component). The
increases over the window are summed over a track's pods. A request Triton refuses as the caller's error (an input of
the wrong type or shape: 400) counts in none of them; nor does an image a pipeline's decoding stage refuses in that
stage (an error response a model returns counts as its success), but its ensemble counts it a failure, twice, as it
does a member's real failure (Triton 2.51: reason OTHER). So a pipeline's failures are its members' (a stage that
raises or whose stub died: BACKEND; a full queue: REJECTED), and its requests those the ensemble answered and those.

Envoy's cluster stats (upstream_rq_total, upstream_rq_pending_failure_eject, upstream_rq_xx, upstream_rq_rx_reset,
upstream_cx_connect_fail and the upstream_rq_time histogram), scraped from the Gateway's Envoy pods as Envoy Gateway's
docs show, labelled with envoy_cluster_name. Envoy Gateway puts a rule's backends in one cluster, where nothing in
Envoy's stats tells them apart (each is a locality of the cluster); a filter on a backendRef makes it give each
backend a cluster of its own (its internal/ir/xds.go, RouteDestination.NeedsClusterPerSetting, v1.9.0), which the
operator's HTTPRoute has on every backendRef (builders.build_http_route). `route_clusters` names them as Envoy
Gateway does.

Prometheus that cannot be reached, or answers an error, is `PrometheusUnreachable`: the rollout holds, never
promotes blind.
"""

from __future__ import annotations

import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from inferop_core.errors import InferopError
from inferop_operator.identity import COMPONENT, COMPONENTS, INSTANCE, Track
from inferop_operator.rollout import GatewayFigures, TrackFigures, gateway_figures, time_buckets, track_figures

QUERY_TIMEOUT = 10.0  # seconds a query may take
COUNTERS = {
    "successes": "nv_inference_request_success",
    "failures": "nv_inference_request_failure",
    "duration_us": "nv_inference_request_duration_us",
}
# Envoy's stats of a cluster: requests sent (static, served at 0 before the first request: its series tells a cluster
# Envoy has from one Prometheus does not see), 5xx answers (made at the first; a refused connection or a reset before
# the answer included, which Envoy answers 503), the pods' resets and failed connections, and the time to the answer.
ENVOY_REQUESTS = "envoy_cluster_upstream_rq_total"
# Requests whose connection to a pod failed (refused, reset) before they were sent: not in upstream_rq_total, which
# counts a request once a connection takes it, so pods that refuse every connection read 0 requests there (seen on
# the node: 0 requests, 85 answered 503, 85 connections failed).
ENVOY_UNSENT = "envoy_cluster_upstream_rq_pending_failure_eject"
ENVOY_ANSWERS = "envoy_cluster_upstream_rq_xx"  # by envoy_response_code_class
# Requests reset and connections refused, each asked alone: one selector of both names gives series that differ
# only by name, which increase() drops, and Prometheus refuses the result (422: duplicate label sets).
ENVOY_RESETS = ("envoy_cluster_upstream_rq_rx_reset", "envoy_cluster_upstream_cx_connect_fail")
ENVOY_TIME = "envoy_cluster_upstream_rq_time_bucket"  # ms
# Envoy Gateway's cluster of rule `rule` of an HTTPRoute (internal/gatewayapi/helpers.go irRouteDestinationName),
# of its backendRef `backend` where each backend has its own (irDestinationSettingName), and of the rule's
# RequestMirror filter `filter` (internal/gatewayapi/filters.go: "<rule's>-mirror-<filter index>").
RULE_CLUSTER = "httproute/{namespace}/{route}/rule/{rule}"
BACKEND_CLUSTER = RULE_CLUSTER + "/backend/{backend}"
MIRROR_CLUSTER = RULE_CLUSTER + "-mirror-{filter}"

Ask = Callable[[str], "float | None"]  # an instant query's one value; None where it has no series, or NaN
AskBuckets = Callable[[str], "dict[str, float]"]  # an instant query's values by `le`


class PrometheusUnreachable(InferopError, RuntimeError):
    """Prometheus could not be asked, or answered with an error; the message says which."""


def series_label(label: str) -> str:
    """A pod label as a PodMonitor's podTargetLabels writes it on series (app.kubernetes.io/instance ->
    app_kubernetes_io_instance)."""
    return "".join(c if c.isalnum() else "_" for c in label)


def selector(namespace: str, service: str, model: str, track: Track) -> str:
    labels = {
        "namespace": namespace,
        series_label(INSTANCE): service,
        series_label(COMPONENT): COMPONENTS[track],
        "model": model,
    }
    return ",".join(f'{key}="{value}"' for key, value in labels.items())


def instant(base_url: str, promql: str, timeout: float = QUERY_TIMEOUT) -> list[dict[str, Any]]:
    """The series of an instant query, each with its labels ("metric") and value."""
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            answer = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise PrometheusUnreachable(f"Prometheus at {base_url} cannot be asked: {error}") from None
    if answer.get("status") != "success":
        raise PrometheusUnreachable(f"Prometheus at {base_url} answered {answer.get('error') or answer}")
    return list(answer.get("data", {}).get("result", []))


def ask(base_url: str, promql: str, timeout: float = QUERY_TIMEOUT) -> float | None:
    """The one value of an instant query: None where it has no series (nothing scraped matches), or is NaN (a
    quantile of no request)."""
    results = instant(base_url, promql, timeout)
    if not results:
        return None
    value = float(results[0]["value"][1])
    return None if math.isnan(value) else value


def ask_buckets(base_url: str, promql: str, timeout: float = QUERY_TIMEOUT) -> dict[str, float]:
    """The values of an instant query by its series' `le` label (a histogram's buckets); {} where it has none."""
    return {series["metric"].get("le", ""): float(series["value"][1]) for series in instant(base_url, promql, timeout)}


def query(base_url: str, promql: str, timeout: float = QUERY_TIMEOUT) -> float:
    """The one value of an instant query (0 where it has no series: no request in the window)."""
    return ask(base_url, promql, timeout) or 0.0


def window_text(seconds: float) -> str:
    return f"{max(math.ceil(seconds), 1)}s"


def track_window(
    base_url: str, namespace: str, service: str, model: str, track: Track, seconds: float, failing: Sequence[str] = ()
) -> TrackFigures:
    """One track's figures in Triton over the last `seconds`: of `model`, its failures those of the models `failing`
    where given (a pipeline's members)."""

    def increase(metric: str, of: str) -> float:
        return query(base_url, f"sum(increase({metric}{{{selector(namespace, service, of, track)}}}[{window}]))")

    window = window_text(seconds)
    failures = sum(increase(COUNTERS["failures"], member) for member in failing or (model,))
    return track_figures(increase(COUNTERS["successes"], model), failures, increase(COUNTERS["duration_us"], model))


def route_clusters(route: Mapping[str, Any], namespace: str, tracks: Mapping[str, Track]) -> dict[Track, list[str]]:
    """The Envoy clusters that carry each track's requests of `route` (an HTTPRoute as build_http_route writes it,
    every backendRef with a filter), by the Service each names (`tracks`: Service name -> track): one cluster per
    backendRef of each rule, and a RequestMirror filter's own (mirrored requests are the candidate's too: their
    answers are discarded, their errors and time are its own)."""
    name = (route.get("metadata") or {}).get("name")
    found: dict[Track, list[str]] = {"stable": [], "candidate": []}
    for index, rule in enumerate((route.get("spec") or {}).get("rules") or []):
        for backend, ref in enumerate(rule.get("backendRefs") or []):
            track = tracks.get(str(ref.get("name")))
            if track is not None:
                found[track].append(
                    BACKEND_CLUSTER.format(namespace=namespace, route=name, rule=index, backend=backend)
                )
        for position, step in enumerate(rule.get("filters") or []):
            mirrored = (step.get("requestMirror") or {}).get("backendRef") or {}
            track = tracks.get(str(mirrored.get("name"))) if step.get("type") == "RequestMirror" else None
            if track is not None:
                found[track].append(MIRROR_CLUSTER.format(namespace=namespace, route=name, rule=index, filter=position))
    return found


def cluster_matcher(clusters: list[str]) -> str:
    """A series matcher for exactly these clusters (a regular expression, which Prometheus anchors), in PromQL: each
    name's metacharacters escaped, and the escapes escaped in the string literal."""
    pattern = "|".join(re.sub(r"([.\\+*?()|\[\]{}^$])", r"\\\1", cluster) for cluster in clusters)
    return 'envoy_cluster_name=~"{}"'.format(pattern.replace("\\", "\\\\"))


def gateway_queries(clusters: list[str], seconds: float) -> dict[str, str]:
    """The PromQL of a track's figures at the gateway over the last `seconds`, summed over its clusters and over the
    Gateway's Envoy pods."""
    where, window = cluster_matcher(clusters), window_text(seconds)
    return {
        "requests": f"sum(increase({ENVOY_REQUESTS}{{{where}}}[{window}]))",
        "unsent": f"sum(increase({ENVOY_UNSENT}{{{where}}}[{window}]))",
        "errors": f'sum(increase({ENVOY_ANSWERS}{{{where},envoy_response_code_class="5"}}[{window}]))',
        **{f"resets {name}": f"sum(increase({name}{{{where}}}[{window}]))" for name in ENVOY_RESETS},
        "time": f"sum by (le) (increase({ENVOY_TIME}{{{where}}}[{window}]))",
    }


def gateway_window(
    answer: Ask, answer_buckets: AskBuckets, clusters: list[str], seconds: float
) -> GatewayFigures | None:
    """One track's figures at the gateway over the last `seconds` (`answer` and `answer_buckets` ask Prometheus),
    or None where Prometheus has no series of its clusters: no cluster (no backend of the track), or no Envoy it
    scrapes."""
    if not clusters:
        return None
    queries = gateway_queries(clusters, seconds)
    sent = answer(queries["requests"])
    if sent is None:
        return None
    unsent = answer(queries["unsent"]) or 0.0
    errors = answer(queries["errors"]) or 0.0
    resets = sum(answer(queries[f"resets {name}"]) or 0.0 for name in ENVOY_RESETS)
    # Every 5xx answer was a request of the revision's, sent or not: never fewer requests than those.
    requests = max(sent + unsent, errors)
    return gateway_figures(requests, errors, resets, time_buckets(answer_buckets(queries["time"])), unsent)


def prometheus_reader(
    base_url: str,
    namespace: str,
    service: str,
    model: str,
    clusters: Mapping[Track, list[str]] | None,
    failing: Sequence[str] = (),
) -> Callable[[Track, float], TrackFigures]:
    """What an analysis reads of one track over the last `seconds`: Triton's figures (`failing`: as track_window)
    and, where the service is routed through a Gateway (`clusters`: route_clusters of its HTTPRoute), the gateway's."""

    def read(track: Track, seconds: float) -> TrackFigures:
        figures = track_window(base_url, namespace, service, model, track, seconds, failing)
        if clusters is None:
            return figures
        gateway = gateway_window(
            lambda promql: ask(base_url, promql), lambda promql: ask_buckets(base_url, promql), clusters[track], seconds
        )
        return figures.model_copy(update={"gateway": gateway})

    return read

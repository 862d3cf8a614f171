"""A rollout step's figures from Prometheus: each track's requests, failures and time in Triton over one window.

Triton's counters (nv_inference_request_success, _failure, _duration_us) per model, scraped from every pod with
the pod's labels (the chart's PodMonitor keeps app.kubernetes.io/instance and app.kubernetes.io/component). The
increases over the window are summed over a track's pods. Prometheus that cannot be reached, or answers an error,
is `PrometheusUnreachable`: the rollout holds, never promotes blind.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request

from inferop_core.errors import InferopError
from inferop_operator.identity import COMPONENT, COMPONENTS, INSTANCE, Track
from inferop_operator.rollout import TrackFigures, track_figures

QUERY_TIMEOUT = 10.0  # seconds a query may take
COUNTERS = {
    "successes": "nv_inference_request_success",
    "failures": "nv_inference_request_failure",
    "duration_us": "nv_inference_request_duration_us",
}


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


def query(base_url: str, promql: str, timeout: float = QUERY_TIMEOUT) -> float:
    """The one value of an instant query (0 where it has no series: no request in the window)."""
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            answer = json.load(response)
    except (urllib.error.URLError, OSError, ValueError) as error:
        raise PrometheusUnreachable(f"Prometheus at {base_url} cannot be asked: {error}") from None
    if answer.get("status") != "success":
        raise PrometheusUnreachable(f"Prometheus at {base_url} answered {answer.get('error') or answer}")
    results = answer.get("data", {}).get("result", [])
    if not results:
        return 0.0
    value = float(results[0]["value"][1])
    return 0.0 if math.isnan(value) else value


def track_window(base_url: str, namespace: str, service: str, model: str, track: Track, seconds: float) -> TrackFigures:
    """One track's figures over the last `seconds`."""
    window = f"{max(math.ceil(seconds), 1)}s"
    where = selector(namespace, service, model, track)
    values = {
        name: query(base_url, f"sum(increase({metric}{{{where}}}[{window}]))") for name, metric in COUNTERS.items()
    }
    return track_figures(values["successes"], values["failures"], values["duration_us"])

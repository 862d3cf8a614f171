"""An HPA the operator rendered scales the Triton Deployment out under load and back in when the load stops, on
Triton's queue metrics, end to end on the current release:

    load -> tritonserver -> Prometheus (scrapes it once per Running pod of the service, labelled with that pod's
    namespace and name, as a PodMonitor would) -> prometheus-adapter with the chart's metricsAdapter rules ->
    custom.metrics.k8s.io through the apiserver's aggregation layer -> the HPA controller of
    kube-controller-manager -> the Deployment's scale -> kwok runs the new pods -> Prometheus scrapes them too.

One local tritonserver stands in for every pod of the service, so all of them report its queue. 1.20 runs no
kube-scheduler here, so no pod runs there and the test is for the current release only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from inferop_core.quantity import parse_quantity
from inferop_devtools.cluster.addons import Kwok, MetricsAdapter, PodTargets
from inferop_devtools.cluster.controlplane import ControlPlane
from inferop_devtools.prometheus import Prometheus, render_chart
from inferop_operator.builders import POD_METRICS
from inferop_operator.identity import INSTANCE, label_selector
from tests.helpers import SERVE_EXTRA, wait_for
from tests.kube.helpers import Kubectl, apply_text, manifest

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("operator")]

# Short enough for a test, long enough for a rate: ten scrapes at Prometheus' 1 s.
RATE_WINDOW = "10s"
MAX_REPLICAS = 3
# Callers that keep the model busy: each sends its next request when the last one returns.
CALLERS = 16
# The HPA controller acts every 15 s (kube-controller-manager's default); a scale takes up to a few of its
# periods after the metric moved, plus the rate window.
SCALE_TIMEOUT = 120.0


@dataclass(frozen=True)
class Pipeline:
    triton: Any  # inferop.serving.tritonserver.TritonServer
    prometheus: Prometheus
    targets: Path  # the file_sd file Prometheus reads
    kubeconfig: Path


def adapter_config() -> dict[str, Any]:
    """prometheus-adapter's --config as the chart renders it with metricsAdapter on."""
    rendered = render_chart("--set", "metricsAdapter.enabled=true", "--set", f"metricsAdapter.rateWindow={RATE_WINDOW}")
    config_maps = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "ConfigMap"]
    (rules,) = [doc for doc in config_maps if doc["metadata"]["name"].endswith("-metrics-adapter")]
    config: dict[str, Any] = yaml.safe_load(rules["data"]["config.yaml"])
    return config


@pytest.fixture(scope="module")
def pipeline(
    control_plane: ControlPlane, kwok: Kwok | None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    if kwok is None:
        pytest.skip("no Pod runs on this release here (no kube-scheduler for kwok), so nothing can scale")
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    workdir = tmp_path_factory.mktemp("autoscaling")
    # One instance, one thread, small batches: a few callers queue up behind it.
    serving = {
        "instances": 1,
        "threads": {"intraOp": 1, "interOp": 1},
        "batching": {"maxBatchSize": 2, "maxQueueDelayMicroseconds": 0, "maxQueueSize": 64},
        "timeouts": {"requestSeconds": 10.0},
    }
    export_model(conv_net(), workdir / "repo", serving=parse_serving(serving), quiet=True)
    targets = workdir / "pods.json"
    with (
        TritonServer(workdir / "repo", http_port=free_port()) as triton,
        Prometheus([], job="triton", file_sd=targets) as prometheus,
        MetricsAdapter(control_plane.kubeconfig, workdir, prometheus.url, adapter_config()),
    ):
        yield Pipeline(triton=triton, prometheus=prometheus, targets=targets, kubeconfig=control_plane.kubeconfig)


class Load:
    """`CALLERS` threads calling the model back to back until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._call, daemon=True) for _ in range(CALLERS)]
        self.answered = 0
        self.failed = 0
        self.first_error: str | None = None

    def _call(self) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        board = httpclient.InferInput("board", [1, 1, 8, 7], "FP32")
        board.set_data_from_numpy(np.zeros((1, 1, 8, 7), dtype=np.float32))
        try:
            while not self.stopped.is_set():
                try:
                    client.infer("conv_net", [board])
                    self.answered += 1
                except Exception as error:  # counted, and the first kept: a failed load is a cause to name
                    self.failed += 1
                    self.first_error = self.first_error or f"{type(error).__name__}: {error}"[:300]
                    self.stopped.wait(0.1)
        finally:
            client.close()

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        for thread in self.threads:
            thread.join()


def replicas(kubectl: Kubectl, namespace: str, name: str) -> tuple[int, int]:
    """The Deployment's (wanted, ready) replicas."""
    deployment = kubectl.get("deployment", name, namespace) or {}
    return deployment.get("spec", {}).get("replicas", 0), deployment.get("status", {}).get("readyReplicas", 0)


def hpa_metric(kubectl: Kubectl, namespace: str, name: str) -> str | None:
    """The value of the Pods metric the HPA last read, as it reports it; None before it read one."""
    hpa = kubectl.get("hpa.v2.autoscaling", name, namespace) or {}
    for metric in hpa.get("status", {}).get("currentMetrics") or []:
        value = (metric.get("pods") or {}).get("current", {}).get("averageValue")
        if value is not None:
            return str(value)
    return None


def adapter_series(kubectl: Kubectl, namespace: str, metric: str, selector: str) -> dict[str, float]:
    """What custom.metrics.k8s.io (prometheus-adapter, through the apiserver) returns for the service's pods: the
    value of each series by the pod it describes. A pod listed twice raises."""
    path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{metric}?labelSelector={selector}"
    items = json.loads(kubectl.run("get", "--raw", path).stdout)["items"]
    values: dict[str, float] = {}
    for item in items:
        pod = item["describedObject"]["name"]
        assert pod not in values, f"the adapter returned {pod} twice: {items}"
        values[pod] = parse_quantity(item["value"])
    return values


def one_series_per_running_pod(kubectl: Kubectl, namespace: str, metric: str, selector: str) -> dict[str, float] | None:
    series = adapter_series(kubectl, namespace, metric, selector)
    return series if sorted(series) == running_pods(kubectl, namespace, selector) else None


def running_pods(kubectl: Kubectl, namespace: str, selector: str) -> list[str]:
    listed = json.loads(kubectl.run("get", "pods", "-n", namespace, "-l", selector, "-o", "json").stdout)["items"]
    return sorted(pod["metadata"]["name"] for pod in listed if pod.get("status", {}).get("phase") == "Running")


def pipeline_state(pipeline: Pipeline, kubectl: Kubectl, namespace: str, name: str, load: Load | None) -> str:
    """Each link of the pipeline as it stands, for a failure to name the one that broke: the server, the load, what
    Prometheus scraped, what the HPA read and why not."""
    code = pipeline.triton.process.poll() if pipeline.triton.process is not None else "never started"
    parts = [f"tritonserver {'running' if code is None else f'exited ({code})'}"]
    if load is not None:
        parts.append(f"load: {load.answered} answered, {load.failed} failed (first: {load.first_error})")
    try:
        targets = pipeline.prometheus.api("targets", state="active")["activeTargets"]
        parts.append(
            "Prometheus targets: "
            + (", ".join(f"{t['labels'].get('pod')} {t['health']} {t['lastError']}".strip() for t in targets) or "none")
        )
    except Exception as error:  # Prometheus itself may be the broken link
        parts.append(f"Prometheus unreachable: {error}")
    parts.append(f"the HPA read {hpa_metric(kubectl, namespace, name)}; its conditions: "
                 f"{hpa_conditions(kubectl, namespace, name)}")  # fmt: skip
    return "; ".join(parts)


def hpa_conditions(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    """The HPA's conditions, `type=status reason: message`: they say why it reads no metric when it reads none."""
    hpa = kubectl.get("hpa.v2.autoscaling", name, namespace) or {}
    return [
        f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
        for c in hpa.get("status", {}).get("conditions") or []
    ]


@pytest.mark.parametrize(("metric", "target"), [("queueTime", 2_000), ("pendingRequests", 2)])
def test_the_hpa_scales_out_under_load_and_back_in_after_it(
    metric: str, target: int, pipeline: Pipeline, kubectl: Kubectl, namespace: str, measured: Callable[[str], None]
) -> None:
    name = "scaled"
    autoscaling = {
        "minReplicas": 1,
        "maxReplicas": MAX_REPLICAS,
        "metric": metric,
        "target": target,
        "scaleDownStabilizationSeconds": 0,
    }
    apply_text(kubectl, namespace, manifest(name, autoscaling=autoscaling))
    selector = label_selector({INSTANCE: name})
    address = f"127.0.0.1:{pipeline.triton.metrics_port}"
    with PodTargets(pipeline.kubeconfig, namespace, selector, address, pipeline.targets):
        # Idle: one pod runs, and the HPA reads the metric through the adapter (0: nothing waits).
        try:
            wait_for(lambda: replicas(kubectl, namespace, name) == (1, 1), what="one ready pod")
        except pytest.fail.Exception as late:  # say why: the pods, the Deployment and the namespace's events
            found = kubectl.run("get", "pods,deployments,events", "-n", namespace, "-o", "wide", check=False)
            pytest.fail(f"{late}; (wanted, ready) {replicas(kubectl, namespace, name)}:\n{found.stdout}{found.stderr}")
        try:
            idle = wait_for(
                lambda: hpa_metric(kubectl, namespace, name), timeout=SCALE_TIMEOUT, what="the HPA's metric"
            )
        except pytest.fail.Exception as failure:
            pytest.fail(f"{failure}; {pipeline_state(pipeline, kubectl, namespace, name, None)}")
        assert parse_quantity(idle) == 0, f"{POD_METRICS[metric]} idle: {idle}"

        started = time.monotonic()
        with Load(pipeline.triton.url) as load:
            try:
                wait_for(
                    lambda: replicas(kubectl, namespace, name) == (MAX_REPLICAS, MAX_REPLICAS),
                    timeout=SCALE_TIMEOUT,
                    interval=0.5,
                    what=f"scale-out to {MAX_REPLICAS} on {metric}",
                )
            except pytest.fail.Exception as failure:
                pytest.fail(f"{failure}; {pipeline_state(pipeline, kubectl, namespace, name, load)}")
            scaled_out = time.monotonic() - started
            loaded = hpa_metric(kubectl, namespace, name)
            answered = load.answered
            # The adapter serves one series per running pod, each its own (every pod is scraped as itself).
            series = wait_for(
                lambda: one_series_per_running_pod(kubectl, namespace, POD_METRICS[metric], selector),
                timeout=30,
                what="one adapter series per running pod",
            )
        stopped = time.monotonic()
        wait_for(
            lambda: replicas(kubectl, namespace, name) == (1, 1),
            timeout=SCALE_TIMEOUT,
            interval=0.5,
            what=f"scale-in to 1 on {metric}",
        )
        scaled_in = time.monotonic() - stopped
    assert answered > 0, f"no call answered: {load.failed} failed ({load.first_error})"
    # It scaled because the load read above the target: the metric the HPA acted on, and every pod's series.
    assert loaded is not None and parse_quantity(loaded) > target, f"{POD_METRICS[metric]} under load: {loaded}"
    assert len(series) == MAX_REPLICAS and all(value > target for value in series.values()), series
    measured(
        f"1 -> {MAX_REPLICAS} pods in {scaled_out:.1f} s under load ({CALLERS} callers, "
        f"{POD_METRICS[metric]} read {loaded} against target {target}), {MAX_REPLICAS} -> 1 in {scaled_in:.1f} s "
        "after it stopped"
    )

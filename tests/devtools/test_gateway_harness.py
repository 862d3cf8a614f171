"""The data plane's pure parts (inferop_devtools.gateway): Envoy Gateway's chart given the local image, the
Gateway's Envoy given the local Envoy, and Prometheus finding the pods as the chart's PodMonitor selects them."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_devtools.cluster.tools import helm
from inferop_devtools.gateway.envoygateway import NAMESPACE, RELEASE, chart_dir, chart_values, gateway_binaries
from inferop_devtools.gateway.plane import ENVOY_LABELS, ENVOY_STATS, TRITON_PODS, infrastructure_objects
from inferop_devtools.prometheus import CHART_JOB, MONITORING_ON, render_chart
from inferop_operator.identity import COMPONENT, INSTANCE, MANAGED

IMAGE = "inferop.local/envoy-gateway:0123abcd"


@pytest.fixture(scope="module")
def rendered() -> list[dict[str, Any]]:
    """The chart scripts/gateway.sh keeps, rendered as `install` installs it."""
    chart = chart_dir(gateway_binaries())
    argv = [str(helm()), "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--values", "-"]
    result = subprocess.run(argv, input=yaml.safe_dump(chart_values(IMAGE)), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


class TestEnvoyGatewayChart:
    def test_every_container_runs_the_local_image_and_never_pulls(self, rendered: list[dict[str, Any]]) -> None:
        containers = [
            container
            for doc in rendered
            if doc["kind"] in ("Deployment", "Job")
            for container in doc["spec"]["template"]["spec"]["containers"]
        ]
        assert {doc["kind"] for doc in rendered if doc["kind"] in ("Deployment", "Job")} == {"Deployment", "Job"}
        assert {(c["image"], c["imagePullPolicy"]) for c in containers} == {(IMAGE, "Never")}

    def test_the_envoy_pods_shutdown_manager_is_the_same_image(self, rendered: list[dict[str, Any]]) -> None:
        (config,) = (
            doc for doc in rendered if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("config")
        )
        settings = yaml.safe_load(config["data"]["envoy-gateway.yaml"])
        assert settings["provider"]["kubernetes"]["shutdownManager"]["image"] == IMAGE

    def test_no_crds_and_no_webhook(self, rendered: list[dict[str, Any]]) -> None:
        kinds = {doc["kind"] for doc in rendered}
        assert not kinds & {"CustomResourceDefinition", "MutatingWebhookConfiguration"}


def test_the_gateways_envoy_runs_the_local_envoy_behind_a_cluster_ip() -> None:
    (proxy,) = (obj for obj in infrastructure_objects("inferop.local/envoy:99") if obj["kind"] == "EnvoyProxy")
    kubernetes = proxy["spec"]["provider"]["kubernetes"]
    assert kubernetes["envoyDeployment"]["container"]["image"] == "inferop.local/envoy:99"
    assert kubernetes["envoyService"]["type"] == "ClusterIP"


def test_the_triton_pods_are_found_as_the_charts_pod_monitor_says() -> None:
    """The Triton pods' monitor against the chart's own PodMonitor: its job name, its selector, its pod labels."""
    rendered = render_chart(*MONITORING_ON)
    (monitor,) = (d for d in yaml.safe_load_all(rendered) if d and d["kind"] == "PodMonitor")
    assert TRITON_PODS.job == CHART_JOB == f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    selector = monitor["spec"]["selector"]
    wanted = {key: [value] for key, value in selector["matchLabels"].items()}
    wanted |= {e["key"]: sorted(e["values"]) for e in selector["matchExpressions"] if e["operator"] == "In"}
    assert {key: sorted(values) for key, values in TRITON_PODS.matches.items()} == wanted
    assert TRITON_PODS.port == monitor["spec"]["podMetricsEndpoints"][0]["port"]
    assert list(TRITON_PODS.target_labels) == monitor["spec"]["podTargetLabels"]


def pod(name: str, labels: dict[str, str], ip: str | None = "10.244.0.7", phase: str = "Running") -> dict[str, Any]:
    ports = [{"name": "http", "containerPort": 8000}, {"name": "metrics", "containerPort": 8002}]
    return {
        "metadata": {"name": name, "namespace": "models", "labels": labels},
        "spec": {"containers": [{"name": "triton", "ports": ports}, {"name": "sidecar"}]},
        "status": {"podIP": ip, "phase": phase},
    }


def test_targets_are_the_selected_pods_metrics_ports_with_the_monitors_labels() -> None:
    stable = {**MANAGED, COMPONENT: "predictor", INSTANCE: "conv-net"}
    pods = [
        pod("conv-net-a", stable),
        pod("conv-net-canary-b", {**stable, COMPONENT: "canary"}, ip="10.244.0.8"),
        pod("fetching", stable, ip=None),  # no address yet
        pod("ended", stable, phase="Failed"),
        pod("other", {COMPONENT: "predictor"}),  # not the operator's
        pod("fetcher", {**MANAGED, COMPONENT: "fetch"}),  # another component
    ]
    found = TRITON_PODS.targets(pods)
    assert found == [
        {"targets": ["10.244.0.7:8002"], "labels": {"namespace": "models", "pod": "conv-net-a", "container": "triton",
                                                    "app_kubernetes_io_instance": "conv-net",
                                                    "app_kubernetes_io_component": "predictor"}},
        {"targets": ["10.244.0.8:8002"], "labels": {"namespace": "models", "pod": "conv-net-canary-b",
                                                    "container": "triton", "app_kubernetes_io_instance": "conv-net",
                                                    "app_kubernetes_io_component": "canary"}},
    ]  # fmt: skip
    assert TRITON_PODS.scrape_job(Path("/t")) == {
        "job_name": CHART_JOB,
        "metrics_path": "/metrics",
        "file_sd_configs": [{"files": [str(TRITON_PODS.file(Path("/t")))]}],
    }


def test_envoys_stats_come_from_the_gateways_own_pods() -> None:
    envoy = pod("envoy-models-inference-1", dict(ENVOY_LABELS))
    elsewhere = {**envoy, "metadata": {**envoy["metadata"], "namespace": NAMESPACE}}
    assert ENVOY_STATS.targets([envoy]) == []  # in the services' namespace: not a gateway's proxy
    assert [group["targets"] for group in ENVOY_STATS.targets([elsewhere])] == [["10.244.0.7:8002"]]
    assert ENVOY_STATS.path == "/stats/prometheus"

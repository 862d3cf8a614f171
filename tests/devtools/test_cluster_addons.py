"""The cluster add-ons' pure parts: kwok's command line and fake node, the objects that register
prometheus-adapter, and the pods Prometheus is told to scrape. They run for real in tests/kube."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from inferop_devtools.cluster.addons import (
    FAKE_NODE_ANNOTATION,
    adapter_command,
    adapter_objects,
    fake_node,
    file_sd_groups,
    kwok_command,
)

BIN = Path("/opt/addons")


def flags(argv: list[str]) -> list[tuple[str, str]]:
    return [tuple(arg.removeprefix("--").split("=", 1)) for arg in argv[1:]]  # type: ignore[misc]


def test_kwok_plays_only_annotated_nodes_with_the_shipped_stages() -> None:
    argv = kwok_command(BIN, Path("/state/kubeconfig"))
    assert argv[0] == "/opt/addons/kwok"
    given = flags(argv)
    assert ("manage-all-nodes", "false") in given
    assert ("manage-nodes-with-annotation-selector", f"{FAKE_NODE_ANNOTATION}=fake") in given
    stages = [Path(value) for name, value in given if name == "config"]
    assert [stage.name for stage in stages] == ["node.yaml", "pod.yaml", "pod-crashloop.yaml"]
    assert all(stage.is_file() for stage in stages)


def test_a_fake_node_under_another_name_keeps_what_makes_kwok_take_it() -> None:
    node = fake_node("kwok-node-7")
    assert node["metadata"]["name"] == node["metadata"]["labels"]["kubernetes.io/hostname"] == "kwok-node-7"
    assert node["metadata"]["annotations"][FAKE_NODE_ANNOTATION] == "fake"
    assert fake_node("kwok-node-0")["metadata"]["name"] == "kwok-node-0"  # the file itself is not changed


def test_the_adapter_is_reached_through_an_external_name_on_loopback() -> None:
    service, *api_services = adapter_objects("custom-metrics", "prometheus-adapter", 6443)
    assert service["spec"] == {"type": "ExternalName", "externalName": "127.0.0.1"}
    assert [s["metadata"]["name"] for s in api_services] == [
        "v1beta1.custom.metrics.k8s.io",
        "v1beta2.custom.metrics.k8s.io",
    ]
    for api_service in api_services:
        assert api_service["spec"]["service"] == {
            "namespace": "custom-metrics",
            "name": "prometheus-adapter",
            "port": 6443,
        }
    # The HPA controller prefers the newest version it is offered.
    assert api_services[1]["spec"]["versionPriority"] > api_services[0]["spec"]["versionPriority"]


def test_the_adapter_lists_series_as_often_as_asked() -> None:
    argv = adapter_command(BIN, Path("/k"), 6443, Path("/w"), "http://127.0.0.1:9090", 2)
    assert ("metrics-relist-interval", "2s") in flags(argv)
    assert ("config", "/w/adapter-config.yaml") in flags(argv)


def pod(name: str, phase: str = "Running", ready: str = "True", deleting: bool = False) -> Any:
    return SimpleNamespace(
        metadata=SimpleNamespace(namespace="models", name=name, deletion_timestamp="now" if deleting else None),
        status=SimpleNamespace(phase=phase, conditions=[SimpleNamespace(type="Ready", status=ready)]),
    )


def test_only_running_ready_pods_are_scraped_each_under_its_own_name() -> None:
    pods = [pod("up"), pod("starting", phase="Pending"), pod("unready", ready="False"), pod("going", deleting=True)]
    assert file_sd_groups(pods, "127.0.0.1:8002") == [
        {"targets": ["127.0.0.1:8002"], "labels": {"namespace": "models", "pod": "up"}}
    ]


def test_pod_ips_are_on_loopback_unless_a_range_is_given() -> None:
    """A client that follows a fake pod's IP (the operator's agreement check) reaches this machine only."""
    given = dict(flags(kwok_command(BIN, Path("/state/kubeconfig"))))
    assert ipaddress.ip_network(given["cidr"], strict=False).is_loopback
    assert ipaddress.ip_address(given["node-ip"]).is_loopback
    assert dict(flags(kwok_command(BIN, Path("k"), cidr="10.0.0.1/24")))["cidr"] == "10.0.0.1/24"

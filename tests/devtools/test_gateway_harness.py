"""The data-plane harness's pure parts (inferop_devtools.gateway): what it plays of the kubelet for Envoy's pod and
the operator's Triton pods, and the kwok stages that leave Triton pods unready until their server serves."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from inferop_devtools.gateway.envoygateway import cluster_dns_hosts, envoy_gateway_config
from inferop_devtools.gateway.kubelet import container_env, expand, mount_binds, volume_files
from inferop_devtools.gateway.tritonpods import cpu_limit, played_stages, volume

POD: dict[str, Any] = {
    "metadata": {"name": "envoy-abc", "namespace": "gw", "labels": {"app": "envoy"}},
    "spec": {
        "nodeName": "node-0",
        "containers": [
            {
                "name": "envoy",
                "env": [
                    {"name": "ENVOY_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "GREETING", "value": "hello $(ENVOY_POD_NAME)"},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                ],
                "volumeMounts": [{"name": "certs", "mountPath": "/certs"}, {"name": "sds", "mountPath": "/sds"}],
                "resources": {"limits": {"cpu": "500m"}},
            }
        ],
        "volumes": [
            {"name": "certs", "secret": {"secretName": "envoy", "items": [{"key": "tls.crt", "path": "crt"}]}},
            {"name": "sds", "configMap": {"name": "sds"}},
            {"name": "model-source", "hostPath": {"path": "/models/conv_net"}},
        ],
    },
    "status": {"podIP": "10.0.0.5"},
}


class TestKubeletForEnvoy:
    def test_environment_from_values_and_the_downward_api(self) -> None:
        env = container_env(POD, POD["spec"]["containers"][0])
        assert env == {"ENVOY_POD_NAME": "envoy-abc", "GREETING": "hello envoy-abc", "APP": "envoy"}
        assert expand("$(ENVOY_POD_NAME) $$(kept) $(unknown)", env) == "envoy-abc $(kept) $(unknown)"

    def test_secret_and_configmap_volumes_as_files_honouring_items(self) -> None:
        secret = {"data": {"tls.crt": base64.b64encode(b"CERT").decode(), "tls.key": base64.b64encode(b"K").decode()}}
        files = volume_files(POD, lambda name: secret, lambda name: {"data": {"a.json": "{}"}})
        assert files == {"certs": {"crt": b"CERT"}, "sds": {"a.json": b"{}"}, "model-source": {}}
        binds = mount_binds(POD["spec"]["containers"][0], {"certs": Path("/w/certs"), "sds": Path("/w/sds")})
        assert binds == {"/certs": Path("/w/certs"), "/sds": Path("/w/sds")}

    def test_cluster_dns_names_with_and_without_the_final_dot(self) -> None:
        hosts = cluster_dns_hosts({"envoy-gateway.envoy-gateway-system.svc.cluster.local": "127.0.0.1"})
        assert "127.0.0.1 envoy-gateway.envoy-gateway-system.svc.cluster.local envoy-gateway" in hosts
        assert "svc.cluster.local." in hosts

    def test_envoy_gateway_runs_alone_without_the_ports_envoy_takes(self) -> None:
        config = envoy_gateway_config()
        assert config["provider"]["kubernetes"]["leaderElection"] == {"disable": True}
        assert config["admin"]["address"]["port"] != 19000
        assert config["telemetry"]["metrics"]["prometheus"]["disable"] is True


class TestTritonPods:
    def test_what_a_pod_serves_and_with_how_much_cpu(self) -> None:
        assert volume(POD, "hostPath") == {"path": "/models/conv_net"}
        assert cpu_limit(POD) == 0.5
        assert cpu_limit({"spec": {"containers": [{"name": "triton"}]}}) is None

    def test_triton_pods_start_unready_and_others_as_before(self, tmp_path: Path) -> None:
        stages = played_stages(tmp_path)
        played = {s["metadata"]["name"]: s for s in yaml.safe_load_all(stages[1].read_text())}
        managed = '.metadata.labels["app.kubernetes.io/managed-by"]'
        ready = played["pod-ready"]["spec"]["selector"]["matchExpressions"][-1]
        assert ready == {"key": managed, "operator": "NotIn", "values": ["inferop"]}
        started = played["pod-started-unready"]
        assert started["spec"]["selector"]["matchExpressions"][-1]["operator"] == "In"
        template = started["spec"]["next"]["statusTemplate"]
        assert 'status: "False"\n  type: Ready' in template and 'status: "False"\n  type: ContainersReady' in template
        assert "ready: false\n  started: true" in template
        assert "phase: Running" in template and "podIP:" in template
        assert [path.name for path in stages] == ["node.yaml", "pod-played.yaml", "pod-crashloop.yaml"]

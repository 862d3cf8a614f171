"""The children an InferenceService owns, as the cluster sees them: Deployment, ConfigMap, Service, HPA, PDB."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from tritonclient.grpc import model_config_pb2 as mc

from inferop_core.tritonconfig import STAGE_STUB, parse_model_config
from inferop_operator.builders import (
    CHILDREN,
    CONFIG_DIR,
    CONFIG_KEY,
    MODEL_REPOSITORY,
    MODEL_SOURCE,
    Routing,
    Service,
    build_admission_policy,
    build_config_map,
    build_deployment,
    build_hpa,
    build_http_route,
    build_network_policy,
    build_pdb,
    build_service,
    candidate_of,
    layout_script,
    routing_for,
    source_volume,
    triton_args,
)
from inferop_operator.identity import API_VERSION, CONFIG_HASH_ANNOTATION, GROUP
from inferop_operator.plan import Refusal, check_routing, plan_service
from inferop_operator.rollout import RolloutStatus, Traffic
from inferop_operator.spec import GatewayRef, SpecError, parse_spec
from tests import specs
from tests.specs import EXAMPLES

IMAGE = "nvcr.io/nvidia/tritonserver:24.08-py3"
FETCH_IMAGE = "ghcr.io/acme/inferop-operator:0.1.0"
DIGEST = "ab" * 32
UID = "7d5c6a1e-0000-4000-8000-000000000001"
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def raw_spec(**sections: Any) -> dict[str, Any]:
    resources = {"requests": {"cpu": "2", "memory": "512Mi"}, "limits": {"cpu": "2", "memory": "1Gi"}}
    return specs.raw_spec(**{"resources": resources, **sections})


def with_storage(uri: str) -> dict[str, Any]:
    raw = raw_spec()
    raw["model"]["storageUri"] = uri
    return raw


def example(name: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / name).read_text())["spec"])


def pipeline_spec(**pipeline: Any) -> dict[str, Any]:
    """Inception V3 behind its image pipeline, with images small enough for raw_spec's memory limit."""
    return raw_spec(
        model=specs.CLASSIFIER, pipeline={"maxImageBytes": "256Ki", "maxImagePixels": 1_000_000, **pipeline}
    )


def make_service(raw: dict[str, Any], name: str = "conv-net", uid: str = UID) -> Service:
    spec = parse_spec(raw)
    return Service(
        name=name, namespace="models", uid=uid, spec=spec, plan=plan_service(spec), image=IMAGE, fetch_image=FETCH_IMAGE
    )


def in_s3(**storage: Any) -> dict[str, Any]:
    raw = with_storage("s3://models/team/conv_net")
    raw["model"]["sha256"] = DIGEST
    if storage:
        raw["model"]["storage"] = storage
    return raw


# Specs a user would write: the examples, a GPU service, a model image, scaling on Triton's metrics.
SPECS = {
    "conv-net example": example("conv-net.yaml"),
    "inception example": example("inception-v3.yaml"),
    "defaults": raw_spec(resources={}),
    "gpu": raw_spec(
        resources={"limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": 1}},
        gpu={"memory": "16Gi"},
        instances=2,
    ),
    "oci": with_storage("oci://ghcr.io/acme/conv-net-model:1"),
    "s3": in_s3(endpoint="http://minio.storage:9000", credentialsSecret="model-store"),
    "queue time autoscaling": raw_spec(
        autoscaling={"minReplicas": 2, "maxReplicas": 5, "metric": "queueTime", "target": 200}
    ),
}
SPEC_PARAMS = [pytest.param(raw, id=name) for name, raw in SPECS.items()]


def started_argv(service: Service, tmp_path: Path) -> list[str]:
    """The argv the Triton container's command execs: its script run by sh with the container's args, and a
    `tritonserver` on PATH that prints its argv (after `chrt`, which is real here)."""
    container = triton_container(build_deployment(service))
    fake = tmp_path / "bin" / "tritonserver"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [*container["command"], *container["args"]], env=env, capture_output=True, text=True, check=True
    )
    prefix = container["command"][2].split("exec ", 1)[1].split(' "$@"', 1)[0].split()
    return [*prefix, *result.stdout.splitlines()]


def admin_token(argv: list[str]) -> str:
    (flag,) = [arg for arg in argv if arg.startswith("--http-restricted-api=")]
    return flag.rsplit("inferop-admin=", 1)[1]


def triton_container(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["name"] == "triton"
    return container


def init_container(deployment: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in deployment["spec"]["template"]["spec"]["initContainers"] if c["name"] == name)


def owner_reference(name: str = "conv-net") -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": "InferenceService",
        "name": name,
        "uid": UID,
        "controller": True,
        "blockOwnerDeletion": True,
    }


class TestDeployment:
    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_resources_copied_exactly(self, raw: dict[str, Any]) -> None:
        resources = triton_container(build_deployment(make_service(raw)))["resources"]
        expected = {"requests": {}, "limits": {}, **raw.get("resources", {})}
        assert resources == expected

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_math_library_threads_equal_the_planned_intra_op(self, raw: dict[str, Any]) -> None:
        service = make_service(raw)
        env = {e["name"]: e["value"] for e in triton_container(build_deployment(service))["env"]}
        assert {name: env[name] for name in THREAD_ENV} == dict.fromkeys(THREAD_ENV, str(service.plan.threads.intra_op))

    def test_the_user_s_environment_follows_the_operator_s(self) -> None:
        service = make_service(raw_spec(runtime={"env": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]}))
        env = triton_container(build_deployment(service))["env"]
        assert [e["name"] for e in env] == [*THREAD_ENV, "HTTPS_PROXY"]
        assert env[-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}

    @pytest.mark.parametrize(
        ("raw", "threads"),
        [
            (example("inception-v3.yaml"), "2"),  # 4 CPUs / 2 instances
            (raw_spec(resources={"limits": {"cpu": "8"}}, threads={"intraOp": 3, "interOp": 2}), "3"),
            (raw_spec(resources={"limits": {"cpu": "500m"}}), "1"),
        ],
    )
    def test_thread_env_values(self, raw: dict[str, Any], threads: str) -> None:
        env = {e["name"]: e["value"] for e in triton_container(build_deployment(make_service(raw)))["env"]}
        assert env["OMP_NUM_THREADS"] == threads

    def test_named_ports(self) -> None:
        ports = triton_container(build_deployment(make_service(raw_spec())))["ports"]
        assert [(p["name"], p["containerPort"], p["protocol"]) for p in ports] == [
            ("http", 8000, "TCP"),
            ("grpc", 8001, "TCP"),
            ("metrics", 8002, "TCP"),
        ]

    def test_health_probes(self) -> None:
        container = triton_container(build_deployment(make_service(raw_spec())))
        # Liveness is an exec probe that also checks /v2/health/live (tests/operator/test_operator_liveness.py).
        assert "/v2/health/live" in " ".join(container["livenessProbe"]["exec"]["command"])
        assert container["readinessProbe"]["httpGet"] == {
            "path": "/v2/health/ready",
            "port": "http",
            "scheme": "HTTP",
        }
        assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/ready"

    @pytest.mark.parametrize("startup_seconds", [5, 7, 60, 301, 7200])
    def test_startup_probe_covers_the_startup_budget(self, startup_seconds: int) -> None:
        raw = raw_spec(timeouts={"startupSeconds": startup_seconds})
        probe = triton_container(build_deployment(make_service(raw)))["startupProbe"]
        budget = probe["failureThreshold"] * probe["periodSeconds"]
        assert startup_seconds <= budget < startup_seconds + probe["periodSeconds"]

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_restricted_security_contexts(self, raw: dict[str, Any]) -> None:
        pod = build_deployment(make_service(raw))["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        for container in pod["initContainers"] + pod["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True, container["name"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
            assert "privileged" not in context

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_every_container_has_resources_and_every_mount_a_volume(self, raw: dict[str, Any]) -> None:
        pod = build_deployment(make_service(raw))["spec"]["template"]["spec"]
        volumes = {v["name"] for v in pod["volumes"]}
        for container in pod["initContainers"] + pod["containers"]:
            assert {m["name"] for m in container["volumeMounts"]} <= volumes, container["name"]
        for container in pod["initContainers"]:
            assert container["resources"]["limits"], container["name"]

    def test_dev_shm_is_memory_as_large_as_the_container_limit(self) -> None:
        """Triton's python backend needs more shared memory than a container runtime's 64 MiB (two Inception V3
        instances at maxBatchSize 32 fail to load on the node without it); what it holds is charged to the
        container's memory, so the limit bounds it."""
        unlimited = raw_spec(resources={"limits": {"cpu": "1"}})
        for raw, size in ((raw_spec(), {"sizeLimit": "1Gi"}), (unlimited, {})):
            deployment = build_deployment(make_service(raw))
            volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
            (shm,) = (m for m in triton_container(deployment)["volumeMounts"] if m["mountPath"] == "/dev/shm")
            assert volumes[shm["name"]]["emptyDir"] == {"medium": "Memory", **size}

    def test_replicas_set_without_autoscaling(self) -> None:
        deployment = build_deployment(make_service(raw_spec(replicas=3)))
        assert deployment["spec"]["replicas"] == 3

    def test_replicas_left_to_the_hpa_with_autoscaling(self) -> None:
        deployment = build_deployment(make_service(example("inception-v3.yaml")))
        assert "replicas" not in deployment["spec"]

    def test_scaled_to_zero(self) -> None:
        assert build_deployment(make_service(raw_spec(replicas=0)))["spec"]["replicas"] == 0

    @staticmethod
    def config_hash(raw: dict[str, Any]) -> str:
        deployment = build_deployment(make_service(raw))
        return str(deployment["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

    @pytest.mark.parametrize(
        "change",
        [
            {"batching": {"maxBatchSize": 16}},
            {"batching": {"maxQueueSize": 10}},
            {"timeouts": {"requestSeconds": 3}},
            {"threads": {"intraOp": 2}},
            {"instances": 1},
        ],
    )
    def test_config_hash_changes_with_the_rendered_config(self, change: dict[str, Any]) -> None:
        assert self.config_hash(raw_spec(**change)) != self.config_hash(raw_spec())

    @pytest.mark.parametrize("change", [{"replicas": 4}, {"replicas": 0}, {"runtime": {"image": "triton:other"}}])
    def test_config_hash_stays_when_the_config_does_not_change(self, change: dict[str, Any]) -> None:
        assert self.config_hash(raw_spec(**change)) == self.config_hash(raw_spec())

    def test_config_hash_is_of_the_config_map(self) -> None:
        first, second = make_service(raw_spec()), make_service(raw_spec(batching={"maxBatchSize": 16}))
        assert build_config_map(first)["data"] != build_config_map(second)["data"]
        assert first.config_hash != second.config_hash

    def test_owned_by_the_inference_service(self) -> None:
        deployment = build_deployment(make_service(raw_spec()))
        assert deployment["metadata"]["ownerReferences"] == [owner_reference()]
        assert (deployment["metadata"]["name"], deployment["metadata"]["namespace"]) == ("conv-net", "models")

    def test_labels(self) -> None:
        deployment = build_deployment(make_service(raw_spec()))
        expected = {
            "app.kubernetes.io/name": "triton",
            "app.kubernetes.io/instance": "conv-net",
            "app.kubernetes.io/component": "predictor",
            "app.kubernetes.io/part-of": "inferop",
            "app.kubernetes.io/managed-by": "inferop",
        }
        assert deployment["metadata"]["labels"] == expected
        assert deployment["spec"]["template"]["metadata"]["labels"] == expected
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= expected.items()
        assert selector["app.kubernetes.io/instance"] == "conv-net"

    def test_two_services_do_not_select_each_others_pods(self) -> None:
        first = build_deployment(make_service(raw_spec(), name="a"))["spec"]["selector"]["matchLabels"]
        second = build_deployment(make_service(raw_spec(), name="b"))["spec"]["template"]["metadata"]["labels"]
        assert not first.items() <= second.items()

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_image(self, raw: dict[str, Any]) -> None:
        deployment = build_deployment(make_service(raw))
        assert triton_container(deployment)["image"] == IMAGE
        assert init_container(deployment, "layout-model")["image"] == IMAGE

    def test_tritonserver_runs_under_sched_batch_unless_asked_otherwise(self, tmp_path: Path) -> None:
        batch = started_argv(make_service(raw_spec()), tmp_path)
        assert batch[:4] == ["chrt", "--batch", "0", "tritonserver"]
        normal = started_argv(make_service(raw_spec(runtime={"cpuScheduling": "normal"})), tmp_path)
        assert normal[0] == "tritonserver"

    def test_config_map_is_mounted(self) -> None:
        service = make_service(raw_spec())
        pod = build_deployment(service)["spec"]["template"]["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == "config")
        assert volume["configMap"]["name"] == build_config_map(service)["metadata"]["name"]
        (container,) = pod["containers"]
        mount = next(m for m in container["volumeMounts"] if m["name"] == "config")
        assert (mount["mountPath"], mount["readOnly"]) == (CONFIG_DIR, True)


class TestTritonArgs:
    def test_fixed_model_and_restricted_repository_api(self, tmp_path: Path) -> None:
        service = make_service(raw_spec())
        args = triton_args(service)
        assert triton_container(build_deployment(service))["args"] == args
        assert "--model-control-mode=none" in args
        assert f"--model-repository={MODEL_REPOSITORY}" in args
        assert "--strict-readiness=true" in args
        assert tuple(a for a in args if re.match(r"--(http|grpc|metrics)-port=", a)) == (
            "--http-port=8000",
            "--grpc-port=8001",
            "--metrics-port=8002",
        )
        # What the container's shell execs: the args as rendered, then both APIs closed with a drawn token.
        argv = started_argv(service, tmp_path)
        token = admin_token(argv)
        restricted = f"model-repository,shared-memory:inferop-admin={token}"
        assert argv == [
            "chrt",
            "--batch",
            "0",
            "tritonserver",
            *args,
            f"--http-restricted-api={restricted}",
            f"--grpc-restricted-protocol={restricted}",
        ]

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_admin_token_is_random_per_start_and_in_no_object(self, raw: dict[str, Any], tmp_path: Path) -> None:
        service = make_service(raw)
        first, second = admin_token(started_argv(service, tmp_path)), admin_token(started_argv(service, tmp_path))
        assert re.fullmatch(r"[0-9a-f]{32}", first)
        assert first != second  # a restart draws a new one
        old_derived = hashlib.sha256(f"{GROUP}/{service.uid}".encode()).hexdigest()[:32]
        assert old_derived not in (first, second)
        rendered = json.dumps([c.build(service, c.versions[0]) for c in CHILDREN if c.wanted(service)])
        assert first not in rendered and old_derived not in rendered
        container = triton_container(build_deployment(service))
        assert "inferop-admin=" not in json.dumps(container["args"] + container["env"])

    def test_no_random_source_no_start(self, tmp_path: Path) -> None:
        """A shell that cannot draw a token does not start Triton with an empty (guessable) one."""
        script = triton_container(build_deployment(make_service(raw_spec())))["command"][2]
        broken = script.replace("/dev/urandom", str(tmp_path / "missing"), 1)
        result = subprocess.run(["sh", "-c", broken, "tritonserver"], capture_output=True, text=True, check=False)
        assert result.returncode != 0
        assert "no random admin token" in result.stderr

    @pytest.mark.parametrize(("request_seconds", "exit_timeout"), [(10, 15), (2.5, 8), (0.1, 6)])
    def test_in_flight_requests_get_time_to_finish(self, request_seconds: float, exit_timeout: int) -> None:
        service = make_service(raw_spec(timeouts={"requestSeconds": request_seconds}))
        assert f"--exit-timeout-secs={exit_timeout}" in triton_args(service)
        pod = build_deployment(service)["spec"]["template"]["spec"]
        (drain,) = pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1:]
        assert pod["terminationGracePeriodSeconds"] > int(drain) + exit_timeout

    def test_cpu_and_gpu(self) -> None:
        cpu, gpu = triton_args(make_service(SPECS["defaults"])), triton_args(make_service(SPECS["gpu"]))
        assert "--allow-gpu-metrics=false" in cpu
        assert "--pinned-memory-pool-byte-size=0" in cpu
        assert "--allow-gpu-metrics=true" in gpu
        assert "--pinned-memory-pool-byte-size=0" not in gpu


class TestStorage:
    @pytest.mark.parametrize(
        ("uri", "claim", "sub_path"),
        [
            ("pvc://models/inception_v3", "models", "inception_v3"),
            ("pvc://models/zoo/inception_v3/", "models", "zoo/inception_v3"),
            ("pvc://models", "models", None),
        ],
    )
    def test_pvc_mounted_read_only(self, uri: str, claim: str, sub_path: str | None) -> None:
        volume, mount = source_volume(make_service(with_storage(uri)))
        assert volume == {
            "name": "model-source",
            "persistentVolumeClaim": {"claimName": claim, "readOnly": True},
        }
        assert mount["readOnly"] is True
        assert mount.get("subPath") == sub_path
        assert mount["mountPath"] == MODEL_SOURCE

    def test_hostpath_directory(self) -> None:
        volume, mount = source_volume(make_service(with_storage("hostpath:///models/conv_net")))
        assert volume == {
            "name": "model-source",
            "hostPath": {"path": "/models/conv_net", "type": "Directory"},
        }
        assert mount["readOnly"] is True

    def test_oci_fetched_by_an_init_container_running_the_model_image(self) -> None:
        deployment = build_deployment(make_service(with_storage("oci://ghcr.io/acme/conv-net-model:1")))
        pod = deployment["spec"]["template"]["spec"]
        assert next(v for v in pod["volumes"] if v["name"] == "model-source") == {
            "name": "model-source",
            "emptyDir": {},
        }
        assert [c["name"] for c in pod["initContainers"]] == ["fetch-model", "layout-model"]
        fetch = init_container(deployment, "fetch-model")
        assert fetch["image"] == "ghcr.io/acme/conv-net-model:1"
        assert fetch["command"] == ["sh", "-c", f"cp -R /model/. {MODEL_SOURCE}/"]
        assert fetch["volumeMounts"] == [{"name": "model-source", "mountPath": MODEL_SOURCE, "readOnly": False}]
        source_mount = next(m for m in triton_container(deployment)["volumeMounts"] if m["name"] == "model-source")
        assert source_mount["readOnly"] is True

    def test_object_storage_fetched_by_inferop_fetch_with_the_spec_s_digest_and_limits(self) -> None:
        raw = in_s3(endpoint="http://minio.storage:9000/", region="eu-1", credentialsSecret="model-store", attempts=3)
        service = make_service(raw)
        deployment = build_deployment(service)
        pod = deployment["spec"]["template"]["spec"]
        limit = service.spec.model.download_limit_bytes()
        assert limit == 2 * service.spec.model.profile.weight_bytes + 64 * 2**20
        assert next(v for v in pod["volumes"] if v["name"] == "model-source") == {
            "name": "model-source",
            "emptyDir": {"sizeLimit": str(2 * limit)},  # a new fetch is staged beside the last
        }
        assert [c["name"] for c in pod["initContainers"]] == ["fetch-model", "layout-model"]
        fetch = init_container(deployment, "fetch-model")
        assert (fetch["image"], fetch["command"]) == (FETCH_IMAGE, ["inferop"])
        assert fetch["args"] == [
            "fetch", "s3://models/team/conv_net", "/fetch/model", "--sha256", DIGEST,
            "--endpoint", "http://minio.storage:9000", "--region", "eu-1", "--addressing", "auto",
            "--download-timeout", "300", "--attempts", "3", "--max-size", str(limit),
            "--termination-log", "/dev/termination-log",
        ]  # fmt: skip
        assert fetch["volumeMounts"] == [
            {"name": "model-source", "mountPath": "/fetch"},
            {"name": "tmp", "mountPath": "/tmp"},
        ]
        for container in (init_container(deployment, "layout-model"), triton_container(deployment)):
            mount = next(m for m in container["volumeMounts"] if m["name"] == "model-source")
            assert mount == {"name": "model-source", "mountPath": MODEL_SOURCE, "readOnly": True, "subPath": "model"}
        assert deployment["spec"]["progressDeadlineSeconds"] == service.spec.timeouts.startup_seconds + 300 + 300

    def test_credentials_are_references_to_the_user_s_secret_never_values(self) -> None:
        fetch = init_container(build_deployment(make_service(in_s3(credentialsSecret="model-store"))), "fetch-model")
        assert [(e["name"], e["valueFrom"]["secretKeyRef"]) for e in fetch["env"]] == [
            ("AWS_ACCESS_KEY_ID", {"name": "model-store", "key": "AWS_ACCESS_KEY_ID", "optional": False}),
            ("AWS_SECRET_ACCESS_KEY", {"name": "model-store", "key": "AWS_SECRET_ACCESS_KEY", "optional": False}),
            ("AWS_SESSION_TOKEN", {"name": "model-store", "key": "AWS_SESSION_TOKEN", "optional": True}),
        ]
        assert all(set(e) == {"name", "valueFrom"} for e in fetch["env"])  # no value of its own
        anonymous = init_container(build_deployment(make_service(in_s3())), "fetch-model")
        assert anonymous["env"] == []
        assert "--endpoint" not in anonymous["args"]  # AWS by region

    def test_a_stated_size_limit_and_an_https_tarball(self) -> None:
        raw = in_s3(maxSize="1Gi", downloadTimeoutSeconds=60)
        raw["model"]["storageUri"] = "https://example.com/models/conv_net.tar.gz"
        deployment = build_deployment(make_service(raw))
        args = init_container(deployment, "fetch-model")["args"]
        assert args[1] == "https://example.com/models/conv_net.tar.gz"
        assert args[args.index("--max-size") + 1] == str(2**30)
        assert args[args.index("--download-timeout") + 1] == "60"

    def test_a_fetched_model_without_a_digest_is_served_with_a_warning(self) -> None:
        raw = in_s3()
        del raw["model"]["sha256"]
        (warning,) = [w for w in make_service(raw).plan.warnings if "sha256" in w]
        assert "model fetched from s3://models/team/conv_net is served unchecked" in warning
        assert not [w for w in make_service(in_s3()).plan.warnings if "sha256" in w]

    @pytest.mark.parametrize("uri", ["pvc://models/x", "hostpath:///models/x"])
    def test_no_fetch_for_mounted_storage(self, uri: str) -> None:
        pod = build_deployment(make_service(with_storage(uri)))["spec"]["template"]["spec"]
        assert [c["name"] for c in pod["initContainers"]] == ["layout-model"]


class TestLayoutScript:
    """The layout init container's script, run with `sh` on directories standing in for its mounts."""

    @staticmethod
    def run(service: Service, root: Path) -> subprocess.CompletedProcess[str]:
        places = {
            MODEL_SOURCE: root / "source",
            MODEL_REPOSITORY: root / "models",
            CONFIG_DIR: root / "config",
        }
        script = re.sub("|".join(map(re.escape, places)), lambda m: str(places[m.group()]), layout_script(service))
        assert "/etc/inferop" not in script and "/mnt/model-source" not in script
        (root / "config").mkdir(exist_ok=True)
        for key, text in build_config_map(service)["data"].items():
            (root / "config" / key).write_text(text)
        (root / "models").mkdir(exist_ok=True)
        return subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30, check=False)

    @staticmethod
    def model_source(root: Path, version: bool = True) -> dict[str, bytes]:
        """A model directory as `inferop export` writes it, shipped with a stale config.pbtxt; read-only."""
        source = root / "source"
        files = {"labels.txt": b"a\nb\n", "config.pbtxt": b'name: "stale"\nmax_batch_size: 1\n'}
        files["1/model.onnx" if version else "model.onnx"] = b"\x08\x07onnx-bytes"
        for relative, content in files.items():
            (source / relative).parent.mkdir(parents=True, exist_ok=True)
            (source / relative).write_bytes(content)
        for path in [*sorted(source.rglob("*"), reverse=True), source]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        return files

    @staticmethod
    def snapshot(source: Path) -> dict[str, bytes]:
        return {str(p.relative_to(source)): p.read_bytes() for p in source.rglob("*") if p.is_file()}

    @pytest.fixture
    def root(self, tmp_path: Path) -> Iterator[Path]:
        yield tmp_path
        for path in [tmp_path, *tmp_path.rglob("*")]:  # let pytest remove the read-only source
            if not path.is_symlink():
                path.chmod(0o755)

    def test_links_the_model_and_puts_the_rendered_config_in_place(self, root: Path) -> None:
        service = make_service(raw_spec())
        files = self.model_source(root)
        result = self.run(service, root)
        assert result.returncode == 0, result.stderr
        assert "model repository laid out" in result.stdout

        model = root / "models" / "conv_net"
        assert sorted(p.name for p in model.iterdir()) == ["1", "config.pbtxt", "labels.txt"]
        assert (model / "1").is_symlink()
        assert (model / "1" / "model.onnx").read_bytes() == files["1/model.onnx"]
        assert (model / "labels.txt").read_bytes() == files["labels.txt"]
        assert (model / "config.pbtxt").read_text() == service.config_files[CONFIG_KEY]
        assert parse_model_config((model / "config.pbtxt").read_text()).name == "conv_net"
        assert self.snapshot(root / "source") == files  # the user's storage is untouched

    def test_running_again_converges(self, root: Path) -> None:
        """An init container runs again when its pod restarts, with the emptyDir still filled."""
        service = make_service(raw_spec())
        self.model_source(root)
        assert self.run(service, root).returncode == 0
        again = self.run(service, root)
        assert again.returncode == 0, again.stderr
        assert (root / "models" / "conv_net" / "config.pbtxt").read_text() == service.config_files[CONFIG_KEY]

    def test_no_version_directory_fails_clearly(self, root: Path) -> None:
        self.model_source(root, version=False)
        result = self.run(make_service(raw_spec()), root)
        assert result.returncode != 0
        assert f"no version directory (e.g. 1/model.onnx) in {root / 'source'}" in result.stderr

    def test_missing_source_fails_clearly(self, root: Path) -> None:
        result = self.run(make_service(raw_spec()), root)
        assert result.returncode != 0
        assert f"model source {root / 'source'} is not a directory" in result.stderr

    def test_model_name_is_the_repository_directory(self) -> None:
        raw = raw_spec()
        raw["model"]["name"] = "inception_v3"
        assert f"dst={MODEL_REPOSITORY}/inception_v3" in layout_script(make_service(raw))

    def test_a_pipeline_lays_out_each_member_beside_the_model_with_its_labels(self, root: Path) -> None:
        service = make_service(pipeline_spec())
        files = self.model_source(root)
        result = self.run(service, root)
        assert result.returncode == 0, result.stderr
        models = root / "models"
        members = ["inception_v3", "inception_v3_model", "inception_v3_post", "inception_v3_pre"]
        assert sorted(p.name for p in models.iterdir()) == members
        data = build_config_map(service)["data"]
        for member in members:
            config = parse_model_config((models / member / "config.pbtxt").read_text())
            assert config.name == member, member
            key = CONFIG_KEY if member == "inception_v3_model" else f"{member}.pbtxt"
            assert (models / member / "config.pbtxt").read_text() == data[key]
            assert (models / member / "1").is_dir()
        assert (models / "inception_v3_model" / "1" / "model.onnx").read_bytes() == files["1/model.onnx"]
        assert (models / "inception_v3_post" / "labels.txt").read_bytes() == files["labels.txt"]
        for stage in ("inception_v3_pre", "inception_v3_post"):
            assert self.stage_stub_runs_the_backend_s_with_one_thread(models / stage / STAGE_STUB, root), stage
        assert not (models / "inception_v3" / STAGE_STUB).exists()
        assert self.run(service, root).returncode == 0  # a restarted pod lays it out again

    @staticmethod
    def stage_stub_runs_the_backend_s_with_one_thread(stub: Path, root: Path) -> bool:
        """Triton runs `stub` as it runs its own (python_backend's stub_launcher: the python backend's directory the
        sixth argument); it must hand every argument over to the backend's stub, with one thread for each library,
        and exit 1 when run without arguments, as the backend's stub does."""
        backend = root / "backends" / "python"
        backend.mkdir(parents=True, exist_ok=True)
        (backend / STAGE_STUB).write_text('#!/bin/sh\necho "$@"\nenv\n')
        (backend / STAGE_STUB).chmod(0o755)
        arguments = ["/models/m/1/model.py", "region", "1048576", "1048576", "42", str(backend), "7", "m_0", "DEFAULT"]
        ran = subprocess.run(
            [str(stub), *arguments],
            env={"PATH": "/usr/bin:/bin", **dict.fromkeys(THREAD_ENV, "4")},
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        told, *env = ran.stdout.splitlines()
        # Triton 2.51 runs it bare first, and tries to chmod a stub that does not exit 1 (a read-only mount in a pod)
        bare = subprocess.run([str(stub)], capture_output=True, timeout=30, check=False)
        one_thread = all(f"{variable}=1" in env for variable in THREAD_ENV)
        return told == " ".join(arguments) and one_thread and bare.returncode == 1

    def test_a_pipeline_without_its_labels_fails_clearly(self, root: Path) -> None:
        self.model_source(root)
        (root / "source").chmod(0o755)
        (root / "source" / "labels.txt").unlink()
        result = self.run(make_service(pipeline_spec()), root)
        assert result.returncode != 0
        assert f"no labels file labels.txt in {root / 'source'}" in result.stderr


class TestConfigMap:
    @staticmethod
    def rendered(raw: dict[str, Any]) -> tuple[Service, mc.ModelConfig]:
        service = make_service(raw)
        config_map = build_config_map(service)
        assert config_map["metadata"]["name"] == "conv-net-config"
        assert list(config_map["data"]) == ["config.pbtxt"]
        return service, parse_model_config(config_map["data"]["config.pbtxt"])

    def test_a_pipeline_carries_each_member_s_config_and_its_hash_all_of_them(self) -> None:
        service = make_service(pipeline_spec())
        data = build_config_map(service)["data"]
        assert sorted(data) == [
            "config.pbtxt",
            "inception_v3.pbtxt",
            "inception_v3_post.pbtxt",
            "inception_v3_pre.pbtxt",
            "stage-stub.sh",
        ]
        model, pre = parse_model_config(data["config.pbtxt"]), parse_model_config(data["inception_v3_pre.pbtxt"])
        assert model.name == "inception_v3_model" and model.platform == "onnxruntime_onnx"
        assert service.plan.stages is not None
        assert pre.instance_group[0].count == service.plan.stages.pre_instances
        ensemble = parse_model_config(data["inception_v3.pbtxt"])
        assert [step.model_name for step in ensemble.ensemble_scheduling.step] == [
            "inception_v3_pre", "inception_v3_model", "inception_v3_post"
        ]  # fmt: skip
        assert make_service(pipeline_spec(topK=3)).config_hash != service.config_hash  # pods restart on any member

    @pytest.mark.parametrize("raw", SPEC_PARAMS)
    def test_carries_the_planned_config(self, raw: dict[str, Any]) -> None:
        service, config = self.rendered(raw)
        spec = service.spec
        assert config.name == spec.model.name
        assert config.platform == "onnxruntime_onnx"
        assert config.max_batch_size == spec.batching.max_batch_size
        (group,) = config.instance_group
        assert group.count == service.plan.threads.instances and spec.instances in (None, group.count)
        assert group.kind == (mc.ModelInstanceGroup.KIND_GPU if spec.uses_gpu else mc.ModelInstanceGroup.KIND_CPU)
        policy = config.dynamic_batching.default_queue_policy
        assert policy.default_timeout_microseconds == round(spec.timeouts.request_seconds * 1e6)
        assert policy.max_queue_size == service.plan.queue.size  # the spec's, else derived by the plan
        if spec.batching.max_queue_size is not None:
            assert policy.max_queue_size == spec.batching.max_queue_size
        assert policy.timeout_action == mc.ModelQueuePolicy.REJECT
        assert config.dynamic_batching.max_queue_delay_microseconds == spec.batching.max_queue_delay_microseconds
        assert config.parameters["intra_op_thread_count"].string_value == str(service.plan.threads.intra_op)
        assert config.parameters["inter_op_thread_count"].string_value == str(service.plan.threads.inter_op)
        assert config.parameters["enable_mem_pattern"].string_value == "0"  # as the memory estimate was measured
        assert [i.name for i in config.input] == [t.name for t in spec.model.inputs]
        assert [o.name for o in config.output] == [t.name for t in spec.model.outputs]

    def test_conv_net_example_numbers(self) -> None:
        _, config = self.rendered(example("conv-net.yaml"))
        assert config.max_batch_size == 16
        assert (config.instance_group[0].count, config.instance_group[0].kind) == (
            2,
            mc.ModelInstanceGroup.KIND_CPU,
        )
        assert config.dynamic_batching.default_queue_policy.default_timeout_microseconds == 2_000_000
        assert config.dynamic_batching.default_queue_policy.max_queue_size == 128
        assert config.parameters["intra_op_thread_count"].string_value == "1"  # 2 CPUs / 2 instances

    def test_gpu_instances(self) -> None:
        _, config = self.rendered(SPECS["gpu"])
        assert (config.instance_group[0].count, config.instance_group[0].kind) == (
            2,
            mc.ModelInstanceGroup.KIND_GPU,
        )

    def test_label_file(self) -> None:
        _, config = self.rendered(example("inception-v3.yaml"))
        assert config.output[0].label_filename == "labels.txt"

    def test_owned_by_the_inference_service(self) -> None:
        assert build_config_map(make_service(raw_spec()))["metadata"]["ownerReferences"] == [owner_reference()]


class TestService:
    def test_selects_the_pods(self) -> None:
        service = make_service(raw_spec())
        selector = build_service(service)["spec"]["selector"]
        deployment = build_deployment(service)
        assert selector == deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()

    def test_ports_target_the_named_container_ports(self) -> None:
        service = make_service(raw_spec())
        ports = build_service(service)["spec"]["ports"]
        assert [(p["name"], p["port"], p["targetPort"]) for p in ports] == [
            ("http", 8000, "http"),
            ("grpc", 8001, "grpc"),
            ("metrics", 8002, "metrics"),
        ]
        container_ports = {p["name"] for p in triton_container(build_deployment(service))["ports"]}
        assert {p["targetPort"] for p in ports} == container_ports

    def test_name_matches_the_url(self) -> None:
        service = make_service(raw_spec())
        built = build_service(service)
        assert built["spec"]["type"] == "ClusterIP"
        assert service.url == f"http://{built['metadata']['name']}.{built['metadata']['namespace']}.svc:8000"
        assert built["metadata"]["ownerReferences"] == [owner_reference()]


class TestHpa:
    @pytest.mark.parametrize("api_version", ["autoscaling/v2", "autoscaling/v2beta2"])
    def test_api_version_as_served(self, api_version: str) -> None:
        hpa = build_hpa(make_service(example("inception-v3.yaml"), name="inception-v3"), api_version)
        assert hpa["apiVersion"] == api_version
        assert hpa["kind"] == "HorizontalPodAutoscaler"
        assert hpa["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": "inception-v3",
        }
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
        assert hpa["metadata"]["ownerReferences"] == [owner_reference("inception-v3")]

    def test_cpu_utilization(self) -> None:
        hpa = build_hpa(make_service(example("inception-v3.yaml")), "autoscaling/v2")
        assert hpa["spec"]["metrics"] == [
            {
                "type": "Resource",
                "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
            }
        ]

    @pytest.mark.parametrize(
        ("metric", "triton_metric"),
        [
            ("queueTime", "inferop_queue_time_microseconds"),
            ("pendingRequests", "inferop_pending_requests"),
        ],
    )
    def test_triton_pods_metrics(self, metric: str, triton_metric: str) -> None:
        raw = raw_spec(autoscaling={"minReplicas": 2, "maxReplicas": 6, "metric": metric, "target": 250})
        hpa = build_hpa(make_service(raw), "autoscaling/v2")
        assert hpa["spec"]["metrics"] == [
            {
                "type": "Pods",
                "pods": {
                    "metric": {"name": triton_metric},
                    "target": {"type": "AverageValue", "averageValue": "250"},
                },
            }
        ]
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
        assert "behavior" not in hpa["spec"]  # Kubernetes' defaults

    def test_scale_down_stabilization(self) -> None:
        autoscaling = {"maxReplicas": 4, "metric": "queueTime", "target": 5000, "scaleDownStabilizationSeconds": 0}
        hpa = build_hpa(make_service(raw_spec(autoscaling=autoscaling)), "autoscaling/v2beta2")
        assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 0}}

    def test_needs_autoscaling(self) -> None:
        with pytest.raises(ValueError, match="autoscaling"):
            build_hpa(make_service(raw_spec()), "autoscaling/v2")


AUTOSCALED = {"autoscaling": {"minReplicas": 1, "maxReplicas": 3, "target": 50}}


class TestPodDisruptionBudget:
    def test_evicts_one_pod_at_a_time_of_the_deployments_pods(self) -> None:
        service = make_service(raw_spec(replicas=3))
        pdb = build_pdb(service, "policy/v1")
        assert (pdb["apiVersion"], pdb["kind"], pdb["metadata"]["name"]) == (
            "policy/v1",
            "PodDisruptionBudget",
            "conv-net",
        )
        assert pdb["spec"] == {
            "maxUnavailable": 1,
            "selector": {"matchLabels": build_deployment(service)["spec"]["selector"]["matchLabels"]},
        }
        assert pdb["metadata"]["ownerReferences"] == [owner_reference()]

    @pytest.mark.parametrize(
        ("sections", "wanted"),
        [
            ({"replicas": 1}, False),
            ({"replicas": 0}, False),
            ({"replicas": 2}, True),
            (AUTOSCALED, True),
            ({"autoscaling": {"minReplicas": 1, "maxReplicas": 1, "target": 50}, "replicas": 4}, False),
        ],
        ids=["one replica", "scaled to zero", "two replicas", "hpa up to 3", "hpa pinned to one"],
    )
    def test_only_where_more_than_one_pod_may_run(self, sections: dict[str, Any], wanted: bool) -> None:
        (pdb,) = (child for child in CHILDREN if child.kind == "PodDisruptionBudget")
        assert pdb.wanted(make_service(raw_spec(**sections))) is wanted


NETWORK_POLICY = {"networkPolicy": {"enabled": True, "metricsNamespace": "monitoring"}}


class TestNetworkPolicy:
    def test_inference_from_anywhere_metrics_from_one_namespace_nothing_else(self) -> None:
        service = make_service(raw_spec(**NETWORK_POLICY))
        policy = build_network_policy(service)
        assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
        spec = policy["spec"]
        # the service's pods of both tracks: the stable Deployment's, and a candidate's during a rollout
        selector = spec["podSelector"]["matchLabels"]
        pods = build_deployment(service)["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= pods.items()
        assert selector == {"app.kubernetes.io/instance": "conv-net", "app.kubernetes.io/managed-by": "inferop"}
        assert spec["policyTypes"] == ["Ingress"]  # what ingress does not list is refused
        inference, metrics = spec["ingress"]
        assert "from" not in inference  # any caller
        assert inference["ports"] == [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8001}]
        assert metrics == {
            "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
            "ports": [{"protocol": "TCP", "port": 8002}],
        }
        ports = {p["containerPort"]: p for p in triton_container(build_deployment(service))["ports"]}
        assert {ports[8000]["name"], ports[8001]["name"], ports[8002]["name"]} == {"http", "grpc", "metrics"}

    def test_without_a_metrics_namespace_nobody_scrapes(self) -> None:
        policy = build_network_policy(make_service(raw_spec(networkPolicy={"enabled": True})))
        assert [rule["ports"] for rule in policy["spec"]["ingress"]] == [
            [{"protocol": "TCP", "port": 8000}, {"protocol": "TCP", "port": 8001}]
        ]

    def test_open_to_the_gateway_alone_the_gateway_s_envoy_and_the_operator_call_http(self) -> None:
        sections = {"networkPolicy": {"enabled": True, "inferenceFrom": "gateway", "metricsNamespace": "monitoring"}}
        gateway = GatewayRef(name="public", namespace="edge")
        service = replace(
            make_service(raw_spec(**sections)), routing=Routing(gateway=gateway), operator_namespace="inferop-system"
        )
        inference, metrics = build_network_policy(service)["spec"]["ingress"]
        assert inference == {
            "from": [
                {  # Envoy Gateway's proxies of this Gateway, in its own namespace
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "envoy-gateway-system"}},
                    "podSelector": {"matchLabels": {"gateway.envoyproxy.io/owning-gateway-name": "public",
                                                    "gateway.envoyproxy.io/owning-gateway-namespace": "edge"}},
                },
                {  # the operator's pod, as the chart labels it (tests/kube/test_chart.py checks those labels)
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "inferop-system"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/component": "operator",
                                                    "app.kubernetes.io/part-of": "inferop"}},
                },
            ],
            "ports": [{"protocol": "TCP", "port": 8000}],  # http only: the gateway routes no gRPC
        }  # fmt: skip
        assert metrics["ports"] == [{"protocol": "TCP", "port": 8002}]
        # an operator outside the cluster: only the gateway; Envoy elsewhere where its EnvoyProxy puts it
        sections["networkPolicy"]["gatewayNamespace"] = "edge"
        outside = replace(make_service(raw_spec(**sections)), routing=Routing(gateway=gateway))
        (envoy,) = build_network_policy(outside)["spec"]["ingress"][0]["from"]
        assert envoy["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": "edge"}

    def test_open_to_the_gateway_alone_is_refused_without_one_naming_the_field(self) -> None:
        spec = parse_spec(raw_spec(networkPolicy={"enabled": True, "inferenceFrom": "gateway"}))
        with pytest.raises(Refusal, match=r"spec.networkPolicy.inferenceFrom gateway need") as refused:
            check_routing(spec, None, served=False)
        assert (refused.value.condition, refused.value.reason) == ("ChildrenApplied", "NeedsGateway")
        with pytest.raises(Refusal, match="not served by this cluster"):
            check_routing(spec, GatewayRef(name="public"), served=False)
        check_routing(spec, GatewayRef(name="public"), served=True)
        check_routing(parse_spec(raw_spec(networkPolicy={"inferenceFrom": "gateway"})), None, served=False)  # off

    @pytest.mark.parametrize(("field", "value"), [("inferenceFrom", "envoy"), ("gatewayNamespace", "Edge")])
    def test_an_unknown_caller_or_namespace_is_refused_naming_the_field(self, field: str, value: str) -> None:
        with pytest.raises(SpecError, match=field):
            parse_spec(raw_spec(networkPolicy={"enabled": True, field: value}))

    def test_wanted_only_when_enabled(self) -> None:
        (child,) = [c for c in CHILDREN if c.kind == "NetworkPolicy"]
        assert child.wanted(make_service(raw_spec(**NETWORK_POLICY)))
        assert not child.wanted(make_service(raw_spec()))
        assert not child.wanted(make_service(raw_spec(networkPolicy={"metricsNamespace": "monitoring"})))

    @pytest.mark.parametrize("namespace", ["Monitoring", "-x", "a" * 64, ""])
    def test_a_namespace_that_cannot_be_one_is_refused(self, namespace: str) -> None:
        with pytest.raises(SpecError, match="metricsNamespace"):
            parse_spec(raw_spec(networkPolicy={"enabled": True, "metricsNamespace": namespace}))


def wanted_children(sections: dict[str, Any]) -> list[dict[str, Any]]:
    """What the reconcile loop applies for a spec, each child at its preferred version."""
    service = make_service(raw_spec(**sections))
    return [child.build(service, child.api_version(child.versions[0])) for child in CHILDREN if child.wanted(service)]


class TestChildren:
    @pytest.mark.parametrize(
        ("sections", "kinds"),
        [
            ({}, ["ConfigMap", "Service", "Deployment"]),
            ({"replicas": 2}, ["ConfigMap", "Service", "PodDisruptionBudget", "Deployment"]),
            (AUTOSCALED, ["ConfigMap", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget", "Deployment"]),
            (NETWORK_POLICY, ["ConfigMap", "Service", "NetworkPolicy", "Deployment"]),
        ],
        ids=["one replica", "two replicas", "autoscaled", "network policy"],
    )
    def test_what_the_spec_wants_with_the_deployment_last(self, sections: dict[str, Any], kinds: list[str]) -> None:
        built = wanted_children(sections)
        assert [child["kind"] for child in built] == kinds
        assert all(child["metadata"]["ownerReferences"] == [owner_reference()] for child in built)

    @pytest.mark.parametrize(
        "sections", [{}, AUTOSCALED, NETWORK_POLICY], ids=["fixed replicas", "autoscaled", "network policy"]
    )
    def test_names_and_versions_are_those_built(self, sections: dict[str, Any]) -> None:
        service = make_service(raw_spec(**sections))
        for child in (c for c in CHILDREN if c.wanted(service)):
            for version in child.versions:
                built = child.build(service, child.api_version(version))
                assert (built["kind"], built["metadata"]["name"]) == (child.kind, child.name(service))
                assert built["apiVersion"] == (f"{child.group}/{version}" if child.group else version)

    def test_each_object_once_with_its_resource(self) -> None:
        service = make_service(raw_spec())
        named = [(child.kind, child.name(service)) for child in CHILDREN]
        assert len(set(named)) == len(named)
        assert {(c.group, c.plural) for c in CHILDREN} == {
            ("", "configmaps"),
            ("", "services"),
            ("autoscaling", "horizontalpodautoscalers"),
            ("policy", "poddisruptionbudgets"),
            ("networking.k8s.io", "networkpolicies"),
            ("apps", "deployments"),
            ("gateway.networking.k8s.io", "httproutes"),
            ("gateway.envoyproxy.io", "backendtrafficpolicies"),
        }

    def test_optional_children_are_deleted_and_the_stable_track_never(self) -> None:
        service = make_service(raw_spec())
        verbs = {(child.kind, child.name(service)): child.verbs for child in CHILDREN}
        optional = [
            key for key in verbs if key[0] in ("HorizontalPodAutoscaler", "PodDisruptionBudget", "NetworkPolicy")
        ]
        candidate = [
            ("ConfigMap", "conv-net-canary-config"),
            ("Service", "conv-net-canary"),
            ("Deployment", "conv-net-canary"),
        ]
        assert all(
            verbs[key] == {"create", "patch", "delete"}
            for key in [*optional, *candidate, ("HTTPRoute", "conv-net"), ("BackendTrafficPolicy", "conv-net")]
        )
        stable = [("ConfigMap", "conv-net-config"), ("Service", "conv-net"), ("Deployment", "conv-net")]
        assert all(verbs[key] == {"create", "patch"} for key in stable)

    def test_an_unset_autoscaling_deletes_the_hpa(self) -> None:
        (hpa,) = (child for child in CHILDREN if child.kind == "HorizontalPodAutoscaler")
        assert not hpa.wanted(make_service(raw_spec()))
        assert hpa.removal[0] == "AutoscalingRemoved"


def test_startup_budget_rounds_up() -> None:
    """A 301 s budget is not cut to 300 s by the probe period."""
    probe = triton_container(build_deployment(make_service(raw_spec(timeouts={"startupSeconds": 301}))))["startupProbe"]
    assert probe["failureThreshold"] == math.ceil(301 / probe["periodSeconds"])


ROLLOUT = {"steps": [5, 50, 100], "header": {"name": "x-ab", "value": "b"}, "shadow": {"percent": 20}}
GATEWAY = GatewayRef(name="public", namespace="edge", section_name="http", hostnames=["models.example.com"])


def rolling(traffic: Traffic, phase: str = "Progressing", split: str = "gateway", **sections: Any) -> Service:
    """conv-net serving one instance, with a candidate of two at `phase` and `traffic`."""
    stable = make_service(raw_spec(rollout=ROLLOUT, instances=1, **sections))
    candidate_spec = parse_spec(raw_spec(rollout=ROLLOUT, instances=2, **sections))
    state = RolloutStatus(
        phase=phase, weight=traffic.weight, mirror_percent=traffic.mirror_percent, header=traffic.header
    )
    routing = routing_for(state, split, GATEWAY if split == "gateway" else None, candidate_spec, None, 3)
    candidate = Service(
        "conv-net", "models", UID, candidate_spec, plan_service(candidate_spec), IMAGE, "candidate", routing
    )
    return Service("conv-net", "models", UID, stable.spec, stable.plan, IMAGE, routing=routing, candidate=candidate)


class TestCandidate:
    def test_its_objects_are_named_for_it_and_its_pods_never_match_the_stable_selector(self) -> None:
        service = rolling(Traffic(weight=5))
        assert service.candidate is not None
        built = {
            (c.kind, c.name(service)): c.build(service, c.api_version(c.versions[0]))
            for c in CHILDREN
            if c.wanted(service)
        }
        deployment = built["Deployment", "conv-net-canary"]
        stable = built["Deployment", "conv-net"]
        pods = deployment["spec"]["template"]["metadata"]["labels"]
        assert pods["app.kubernetes.io/component"] == "canary"
        assert not stable["spec"]["selector"]["matchLabels"].items() <= pods.items()
        assert deployment["spec"]["selector"]["matchLabels"].items() <= pods.items()
        assert deployment["spec"]["template"]["spec"]["volumes"][2]["configMap"]["name"] == "conv-net-canary-config"
        assert built["Service", "conv-net-canary"]["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
        # the candidate serves its own spec; both are owned by the service and collected with it
        assert "count: 2" in built["ConfigMap", "conv-net-canary-config"]["data"]["config.pbtxt"]
        assert "count: 1" in built["ConfigMap", "conv-net-config"]["data"]["config.pbtxt"]
        assert deployment["metadata"]["ownerReferences"] == [owner_reference()]

    def test_without_a_candidate_its_objects_are_deleted(self) -> None:
        service = make_service(raw_spec(rollout=ROLLOUT))
        unwanted = {(c.kind, c.name(service)) for c in CHILDREN if not c.wanted(service)}
        assert {("ConfigMap", "conv-net-canary-config"), ("Service", "conv-net-canary")} <= unwanted
        assert ("Deployment", "conv-net-canary") in unwanted


def backend(name: str, weight: int, component: str) -> dict[str, Any]:
    """A backendRef of the route: the Service, its weight, and the header naming its track, which also gives it an
    Envoy cluster of its own under Envoy Gateway."""
    header = {"set": [{"name": "inferop-track", "value": component}]}
    return {
        "name": name, "port": 8000, "weight": weight,
        "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": header}],
    }  # fmt: skip


# The default rule without a rollout: every request to the stable Service, its second backendRef parked on it too.
STABLE_ONLY = [backend("conv-net", 10_000, "predictor"), backend("conv-net", 1, "predictor")]


class TestHttpRoute:
    def route(self, service: Service) -> dict[str, Any]:
        return build_http_route(service, "gateway.networking.k8s.io/v1")

    def test_without_a_rollout_all_to_the_stable_service(self) -> None:
        service = replace(make_service(raw_spec()), routing=Routing(gateway=GATEWAY))
        route = self.route(service)
        assert route["spec"]["parentRefs"] == [
            {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "edge",
             "sectionName": "http"}
        ]  # fmt: skip
        assert route["spec"]["hostnames"] == ["models.example.com"]
        assert route["spec"]["rules"] == [{"backendRefs": STABLE_ONLY}]

    def test_a_step_splits_by_weight_and_sends_the_header_to_the_candidate(self) -> None:
        default, header = self.route(rolling(Traffic(weight=5, header=True)))["spec"]["rules"]
        assert header == {
            "matches": [{"headers": [{"type": "Exact", "name": "x-ab", "value": "b"}]}],
            "backendRefs": [backend("conv-net-canary", 10_000, "canary")],
        }
        assert default == {
            "backendRefs": [backend("conv-net", 9_500, "predictor"), backend("conv-net-canary", 500, "canary")]
        }

    def test_every_backend_stays_through_a_rollout_so_that_envoy_never_adds_a_cluster_that_takes_requests(
        self,
    ) -> None:
        """Envoy Gateway drops a backendRef of weight 0 with its cluster, and Envoy fails requests routed to a
        cluster it is adding (no_cluster): the same backendRefs from before the rollout to after it, each step
        moving what they point at."""
        steps = [
            (0, False, "Agreement"),
            (5, True, "Progressing"),
            (100, False, "Progressing"),
            (0, False, "Finishing"),
        ]
        routes = [self.route(rolling(Traffic(weight=w, header=header), phase=phase)) for w, header, phase in steps]
        shapes = {
            str([(index, len(rule["backendRefs"])) for index, rule in enumerate(r["spec"]["rules"])]) for r in routes
        }
        assert shapes == {"[(0, 2), (1, 1)]"}
        weights = [[b["weight"] for rule in r["spec"]["rules"] for b in rule["backendRefs"]] for r in routes]
        assert weights == [[10_000, 1, 10_000], [9_500, 500, 10_000], [1, 10_000, 10_000], [10_000, 1, 10_000]]
        at_full = routes[2]["spec"]["rules"][0]["backendRefs"]
        assert [b["name"] for b in at_full] == ["conv-net", "conv-net-canary"]

    def test_a_shadow_mirrors_a_share_and_answers_from_the_stable_service(self) -> None:
        default, _ = self.route(rolling(Traffic(weight=0, mirror_percent=20)))["spec"]["rules"]
        assert default["backendRefs"] == STABLE_ONLY
        assert default["filters"] == [
            {"type": "RequestMirror",
             "requestMirror": {"backendRef": {"name": "conv-net-canary", "port": 8000}, "percent": 20}}
        ]  # fmt: skip

    def test_no_candidate_no_route_to_it(self) -> None:
        """A rolled back candidate leaves no backend, match or mirror behind (kserve#2130, seldon#5181)."""
        service = replace(rolling(Traffic(weight=50, mirror_percent=20, header=True)), candidate=None)
        assert "conv-net-canary" not in str(self.route(service))


def held_before_rejecting(service: Service) -> int:
    """Requests a pod of `service` may hold, read from its rendered config: its queue bound (Triton may answer a batch
    before the next leaves the queue), or where that is less, a batch for each instance and one queued for each
    executing at once (one where the rate limiter lets one execute at a time)."""
    config = parse_model_config(build_config_map(service)["data"]["config.pbtxt"])
    (group,) = config.instance_group
    executing = 1 if group.rate_limiter.resources else group.count
    return max(
        config.dynamic_batching.default_queue_policy.max_queue_size,
        (group.count + executing) * config.max_batch_size,
    )


class TestAdmissionPolicy:
    def breaker(self, service: Service) -> dict[str, Any]:
        policy = build_admission_policy(service, "gateway.envoyproxy.io/v1alpha1")
        assert policy["kind"] == "BackendTrafficPolicy"
        assert policy["metadata"]["ownerReferences"] == [owner_reference()]
        assert policy["spec"]["targetRefs"] == [
            {"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "name": "conv-net"}
        ]
        breaker: dict[str, Any] = policy["spec"]["circuitBreaker"]
        return breaker

    def test_the_gateway_sends_the_pods_no_more_than_they_hold(self) -> None:
        service = replace(make_service(example("conv-net.yaml")), routing=Routing(gateway=GATEWAY))
        held = held_before_rejecting(service)
        assert held == 128  # the example's queue bound, above two rounds of two instances of 16
        assert self.breaker(service) == {
            "maxParallelRequests": held * service.spec.replicas,
            "maxPendingRequests": held * service.spec.replicas,  # only while connections open
            "maxConnections": 2**32 - 1,
        }

    @pytest.mark.parametrize(("cpu", "batches"), [("1", 3), ("2", 4)])
    def test_below_the_queue_bound_a_batch_ready_for_each_instance(self, cpu: str, batches: int) -> None:
        """On one CPU the two instances take turns: one executes, the other holds the next batch, one is queued for
        the first; on two each executes with one queued behind it."""
        raw = raw_spec(batching={"maxBatchSize": 8, "maxQueueSize": 8}, resources={"limits": {"cpu": cpu}})
        service = replace(make_service(raw), routing=Routing(gateway=GATEWAY))
        assert (service.plan.threads.instances, service.plan.threads.take_turns) == (2, cpu == "1")
        assert self.breaker(service)["maxParallelRequests"] == batches * 8 * service.spec.replicas
        assert held_before_rejecting(service) == batches * 8

    def test_autoscaled_every_pod_it_may_run(self) -> None:
        raw = raw_spec(autoscaling={"minReplicas": 1, "maxReplicas": 5, "metric": "queueTime", "target": 200})
        service = replace(make_service(raw), routing=Routing(gateway=GATEWAY))
        assert self.breaker(service)["maxParallelRequests"] == 5 * held_before_rejecting(service)

    def test_during_a_rollout_the_pods_of_both_tracks(self) -> None:
        service = rolling(Traffic(weight=50))  # the stable pods run one instance, the candidate's two
        stable, candidate = held_before_rejecting(service), held_before_rejecting(candidate_of(service))
        assert stable != candidate
        both = service.spec.replicas * stable + service.routing.candidate_replicas * candidate
        assert self.breaker(service)["maxParallelRequests"] == both
        assert self.breaker(replace(service, candidate=None))["maxParallelRequests"] == service.spec.replicas * stable

    def test_written_with_the_route_and_only_where_envoy_gateway_is_served(self) -> None:
        (policy,) = (child for child in CHILDREN if child.kind == "BackendTrafficPolicy")
        assert policy.extension and not any(c.extension for c in CHILDREN if c is not policy)
        assert policy.wanted(replace(make_service(raw_spec()), routing=Routing(gateway=GATEWAY)))
        assert not policy.wanted(make_service(raw_spec()))
        assert policy.removal[0] == "AdmissionRemoved"


class TestRouting:
    def state(self, phase: str, weight: int = 0) -> RolloutStatus:
        return RolloutStatus(phase=phase, weight=weight)

    def test_through_a_gateway_the_candidate_gets_its_share_of_pods(self) -> None:
        spec = parse_spec(raw_spec(replicas=10))
        assert routing_for(self.state("Progressing", 25), "gateway", GATEWAY, spec, None, None).candidate_replicas == 3
        promoting = routing_for(self.state("Promoting", 100), "gateway", GATEWAY, spec, None, None)
        assert (promoting.candidate_replicas, promoting.stable_replicas) == (10, None)
        draining = routing_for(self.state("RollingBack"), "gateway", GATEWAY, spec, None, 4)
        assert (draining.candidate_replicas, draining.traffic.weight) == (4, 0)

    def test_through_a_gateway_the_stable_pods_are_what_the_rollout_scaled_them_to(self) -> None:
        spec = parse_spec(raw_spec(replicas=10))
        scaled = RolloutStatus(phase="Progressing", weight=50, stable_replicas=5)
        routing = routing_for(scaled, "gateway", GATEWAY, spec, None, None)
        assert (routing.stable_replicas, routing.candidate_replicas) == (5, 5)
        assert build_deployment(replace(make_service(raw_spec(replicas=10)), routing=routing))["spec"]["replicas"] == 5

    def test_the_next_steps_pods_start_before_its_traffic(self) -> None:
        spec = parse_spec(raw_spec(replicas=10))
        waiting = RolloutStatus(phase="Progressing", weight=5, scaling_for=50)
        routing = routing_for(waiting, "gateway", GATEWAY, spec, None, None)
        assert (routing.candidate_replicas, routing.traffic.weight) == (5, 5)

    def test_without_a_gateway_the_share_of_pods_behind_one_service(self) -> None:
        spec = parse_spec(raw_spec(replicas=4))
        split = routing_for(self.state("Progressing", 50), "replicas", None, spec, None, None)
        assert (split.stable_replicas, split.candidate_replicas, split.service_selects_candidate) == (2, 2, True)
        waiting = routing_for(self.state("Agreement"), "replicas", None, spec, None, None)
        assert (waiting.stable_replicas, waiting.candidate_replicas, waiting.service_selects_candidate) == (
            None, 1, False,
        )  # fmt: skip
        rolled_back = routing_for(self.state("RollingBack"), "replicas", None, spec, None, 2)
        assert (rolled_back.stable_replicas, rolled_back.service_selects_candidate) == (None, False)

    def test_the_one_service_selects_the_candidate_only_while_it_takes_traffic(self) -> None:
        service = rolling(Traffic(weight=50), split="replicas", replicas=4)
        selector = build_service(service)["spec"]["selector"]
        assert selector == {"app.kubernetes.io/instance": "conv-net", "app.kubernetes.io/managed-by": "inferop"}
        assert build_deployment(service)["spec"]["replicas"] == 2
        assert build_deployment(candidate_of(service))["spec"]["replicas"] == 2
        quiet = rolling(Traffic(), phase="Agreement", split="replicas", replicas=4)
        assert build_service(quiet)["spec"]["selector"]["app.kubernetes.io/component"] == "predictor"
        assert build_deployment(quiet)["spec"]["replicas"] == 4


class TestInt8Placement:
    """An int8 model's pods go where int8 pays: nodes whose CPUs NFD labels with int8 dot-product instructions."""

    LABELS = frozenset(
        {
            "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI",
            "feature.node.kubernetes.io/cpu-cpuid.AVXVNNI",
            "feature.node.kubernetes.io/cpu-cpuid.AMXINT8",
        }
    )

    def pod(self, **model: Any) -> dict[str, Any]:
        raw = raw_spec()
        raw["model"].update(model)
        return dict(build_deployment(make_service(raw))["spec"]["template"]["spec"])

    def test_required_keeps_the_pods_to_nodes_with_any_one_of_the_instructions(self) -> None:
        terms = self.pod(precision="int8", int8Nodes="required")["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]["nodeSelectorTerms"]
        # One term per label: the scheduler ORs terms, so a node with any one of them will do.
        assert {term["matchExpressions"][0]["key"] for term in terms} == self.LABELS
        assert all(
            term["matchExpressions"]
            == [{"key": term["matchExpressions"][0]["key"], "operator": "In", "values": ["true"]}]
            for term in terms
        )

    def test_preferred_is_the_default_and_warns_that_pods_may_land_elsewhere(self) -> None:
        preferences = self.pod(precision="int8")["affinity"]["nodeAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"
        ]
        assert {p["preference"]["matchExpressions"][0]["key"] for p in preferences} == self.LABELS
        raw = raw_spec()
        raw["model"]["precision"] = "int8"
        (warning,) = [w for w in plan_service(parse_spec(raw)).warnings if "int8" in w]
        assert "int8Nodes preferred: pods may land on nodes without int8 dot-product instructions" in warning
        assert "model.int8Nodes: required" in warning

    @pytest.mark.parametrize("model", [{}, {"precision": "int8", "int8Nodes": "any"}])
    def test_fp32_or_any_node_places_nothing(self, model: dict[str, str]) -> None:
        assert "affinity" not in self.pod(**model)

    def test_an_unknown_choice_is_refused_naming_the_field(self) -> None:
        raw = raw_spec()
        raw["model"].update(precision="int8", int8Nodes="always")
        with pytest.raises(SpecError, match="int8Nodes"):
            parse_spec(raw)

"""Pure builders of every child an InferenceService owns: plain dicts from a validated spec and a plan.

No I/O here and no Kubernetes client: the handlers apply what these return.
"""

from __future__ import annotations

import hashlib
import math
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inferop_core import scheduling
from inferop_core.capacity import gateway_admission
from inferop_core.cpu import NFD_LABELS
from inferop_core.threads import THREAD_ENV
from inferop_core.tritonconfig import (
    RATE_LIMIT_ARG,
    STAGE_STUB,
    STAGE_STUB_SCRIPT,
    ServingConfig,
    build_pipeline_configs,
    render_model_config,
    to_text,
)
from inferop_operator import identity, liveness
from inferop_operator.identity import (
    API_VERSION,
    CANDIDATE_SUFFIX,
    COMPONENTS,
    CONFIG_HASH_ANNOTATION,
    FETCH_CONTAINER,
    GATEWAY_GROUP,
    KIND,
    TRACK_HEADER,
    TRITON_CONTAINER,
    Track,
    service_labels,
)
from inferop_operator.plan import Plan
from inferop_operator.rollout import RolloutStatus, Traffic, canary_replicas, replica_split
from inferop_operator.spec import GatewayRef, InferenceServiceSpec, Model, ObjectStorage

HTTP_PORT, GRPC_PORT, METRICS_PORT = 8000, 8001, 8002
MODEL_REPOSITORY = "/models"
MODEL_SOURCE = "/mnt/model-source"
CONFIG_DIR = "/etc/inferop"
CONFIG_KEY = "config.pbtxt"
STAGE_STUB_KEY = "stage-stub.sh"  # a pipeline's stages' stub (STAGE_STUB_SCRIPT), installed in each stage's directory
OCI_MODEL_DIR = "/model"  # where a model image (oci://) holds the model directory
# A model in object storage: `inferop fetch` (the operator's image) writes it into the source volume, mounted here
# in its init container, as the folder FETCHED; the other containers mount that folder at MODEL_SOURCE.
FETCH_MOUNT = "/fetch"
FETCHED = "model"
TERMINATION_LOG = "/dev/termination-log"  # where the kubelet reads a container's last words into its status
# The object-storage fetch streams in 1 MiB chunks: 46.5 MiB peak RSS for a 100 MB model, mostly its imports
# (python -m inferop_devtools.oneoff.storage_start), so its memory does not grow with the model.
FETCH_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}}
CREDENTIAL_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
OPTIONAL_CREDENTIAL_KEYS = ("AWS_SESSION_TOKEN",)
TRITON_UID = 1000  # the triton-server user of NVIDIA's images
STARTUP_PROBE_PERIOD = 5
# Header that would unlock Triton's model-repository and shared-memory APIs. Its value is random, drawn by the
# container's shell at each start (`start_script`) and held only in tritonserver's argv: no object, env var, log or
# field of the InferenceService carries it, so nobody (the operator included, which never calls those APIs) has it.
ADMIN_HEADER = "inferop-admin"
RESTRICTED_APIS = "model-repository,shared-memory"
TOKEN_BYTES = 16  # 128 random bits, 32 hex digits


def member_config_key(member: str) -> str:
    """A pipeline member's config in the ConfigMap (its model's config is CONFIG_KEY)."""
    return f"{member}.pbtxt"


@dataclass(frozen=True)
class Routing:
    """How callers reach the pods, as the rollout decided it: through a Gateway (an HTTPRoute's weights) or by the
    share of pods behind the one Service (split by replicas), with what goes to the candidate now."""

    traffic: Traffic = field(default_factory=Traffic)
    gateway: GatewayRef | None = None  # its namespace filled in; None: no HTTPRoute
    stable_replicas: int | None = None  # the stable Deployment's count when the split sets it; None: the spec's
    candidate_replicas: int = 1
    service_selects_candidate: bool = False  # the one Service also sends callers to the candidate (split by replicas)


def routing_for(
    state: RolloutStatus,
    split: str,
    gateway: GatewayRef | None,
    spec: InferenceServiceSpec,
    stable_now: int | None,
    candidate_now: int | None,
) -> Routing:
    """The routing and replica counts the rollout's state asks for. `stable_now` and `candidate_now` are the
    Deployments' current counts (an HPA's choice for the stable one); a draining candidate keeps its pods."""
    traffic = Traffic.of(state) if state.candidate_wanted else Traffic()
    phase, weight = state.phase, traffic.weight
    stable = spec.replicas if spec.autoscaling is None else max(stable_now or 0, spec.autoscaling.min_replicas)
    draining = max(candidate_now or 1, 1)
    if split == "gateway":
        if phase in ("Finishing", "RollingBack"):
            candidate = draining
        elif phase == "Promoting":
            candidate = max(stable, 1)
        else:  # the current step's share, or the next step's while its pods start
            share = max(weight, state.scaling_for or 0)
            candidate = canary_replicas(stable, share, traffic.mirror_percent, traffic.header)
        # The stable pods follow the weight where the rollout scaled them (rollout.stable_replicas).
        return Routing(traffic, gateway, state.stable_replicas if state.candidate_wanted else None, candidate)
    if phase in ("Progressing", "Paused") and weight > 0:
        if spec.autoscaling is None:
            kept, candidate = replica_split(stable, weight)
            return Routing(traffic, None, kept, candidate, service_selects_candidate=True)
        # The HPA keeps the stable count: the candidate gets its share beside it.
        candidate = max(stable, 1) if weight >= 100 else max(1, round(stable * weight / (100 - weight)))
        return Routing(traffic, None, None, candidate, service_selects_candidate=True)
    if phase == "Promoting":
        return Routing(traffic, None, None, max(stable, 1), service_selects_candidate=True)
    if phase in ("Finishing", "RollingBack"):
        return Routing(traffic, None, None, draining)
    return Routing(traffic, None, None, 1)


@dataclass(frozen=True)
class Service:
    """The InferenceService being built: identity, validated spec, plan and the image to run; for the stable track,
    how callers are routed and, during a rollout, the candidate (the same service on the candidate track, built from
    the new spec)."""

    name: str
    namespace: str
    uid: str
    spec: InferenceServiceSpec
    plan: Plan
    image: str
    track: Track = "stable"
    routing: Routing = field(default_factory=Routing)
    candidate: Service | None = None
    fetch_image: str | None = None  # the image with `inferop fetch` (the operator's own), for object storage
    operator_namespace: str | None = None  # where the operator's pod runs; None: outside the cluster

    @property
    def object_name(self) -> str:
        """The name of this track's Deployment and Service: the service's own, or <service>-canary."""
        return self.name if self.track == "stable" else f"{self.name}{CANDIDATE_SUFFIX}"

    @property
    def served_model(self) -> ServingConfig:
        """The model's config as Triton serves it: with a pipeline, under its member's name (<name>_model)."""
        return self.plan.serving if self.plan.pipeline is None else self.plan.pipeline.model

    @property
    def config_files(self) -> dict[str, str]:
        """The ConfigMap's files: the model's config (CONFIG_KEY) and, with a pipeline, each other member's config
        as <member>.pbtxt (its stages and the ensemble that callers use) and the stages' stub."""
        files = {CONFIG_KEY: render_model_config(self.served_model)}
        if self.plan.pipeline is not None:
            files[STAGE_STUB_KEY] = STAGE_STUB_SCRIPT
            for name, config in build_pipeline_configs(self.plan.pipeline).items():
                if name != self.served_model.name:
                    files[member_config_key(name)] = to_text(config)
        return files

    @property
    def config_hash(self) -> str:
        files = self.config_files
        return hashlib.sha256("\0".join(f"{key}\0{files[key]}" for key in sorted(files)).encode()).hexdigest()[:16]

    @property
    def config_map_name(self) -> str:
        return f"{self.object_name}-config"

    @property
    def url(self) -> str:
        return f"http://{self.name}.{self.namespace}.svc:{HTTP_PORT}"


def labels(service: Service) -> dict[str, str]:
    return identity.labels(service.name, service.track)


def selector_labels(service: Service) -> dict[str, str]:
    return identity.selector_labels(service.name, service.track)


def metadata(service: Service, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": service.namespace,
        "labels": labels(service),
        "ownerReferences": [
            {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": service.name,
                "uid": service.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }


def build_config_map(service: Service) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(service, service.config_map_name),
        "data": service.config_files,
    }


def build_service(service: Service) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(service, service.object_name),
        "spec": {
            "type": "ClusterIP",
            "selector": service_labels(service.name)
            if service.routing.service_selects_candidate
            else selector_labels(service),
            "ports": [
                {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
                for name, port in (("http", HTTP_PORT), ("grpc", GRPC_PORT), ("metrics", METRICS_PORT))
            ],
        },
    }


def triton_args(service: Service) -> list[str]:
    """tritonserver's command line: one fixed model, every wait bounded. The flags that close the repository
    and shared-memory APIs are added by `start_script`, which alone knows the token."""
    args = [
        f"--model-repository={MODEL_REPOSITORY}",
        "--model-control-mode=none",
        "--strict-readiness=true",
        "--exit-on-error=true",
        f"--http-port={HTTP_PORT}",
        f"--grpc-port={GRPC_PORT}",
        f"--metrics-port={METRICS_PORT}",
        "--allow-metrics=true",
        f"--allow-gpu-metrics={'true' if service.spec.uses_gpu else 'false'}",
        # In-flight requests get as long as a queued one may wait before shutdown cuts them off.
        f"--exit-timeout-secs={math.ceil(service.spec.timeouts.request_seconds) + 5}",
        RATE_LIMIT_ARG,  # instances that take turns (ServingConfig.take_turns)
    ]
    if not service.spec.uses_gpu:
        args.append("--pinned-memory-pool-byte-size=0")
    return args


def start_script(service: Service) -> str:
    """The Triton container's `sh -c` script: draw a random admin token from /dev/urandom (POSIX sh and
    coreutils only: head, od, tr), then exec tritonserver, behind the scheduling policy's prefix, with the
    container's args (`"$@"`) and the restricted-API flags that take the token. The token exists only in this
    process's argv; a restart draws a new one."""
    tritonserver = shlex.join([*scheduling.command_prefix(service.spec.runtime.cpu_scheduling), "tritonserver"])
    restricted = f"{RESTRICTED_APIS}:{ADMIN_HEADER}=$token"
    return "\n".join(
        [
            "set -eu",
            f"token=$(head -c {TOKEN_BYTES} /dev/urandom | od -An -tx1 | tr -d ' \\n')",
            f"[ ${{#token}} -eq {2 * TOKEN_BYTES} ] ||",
            '  { echo "no random admin token from /dev/urandom" >&2; exit 1; }',
            f'exec {tritonserver} "$@" --http-restricted-api="{restricted}" --grpc-restricted-protocol="{restricted}"',
        ]
    )


def triton_command(service: Service) -> list[str]:
    """The container's command; its args (`triton_args`) follow as the script's "$@" ($0 is "tritonserver")."""
    return ["sh", "-c", start_script(service), "tritonserver"]


def thread_env(service: Service) -> list[dict[str, str]]:
    """Every math library in the image gets the same per-instance budget as ONNX Runtime's intra-op pool."""
    return [{"name": name, "value": str(service.plan.threads.intra_op)} for name in THREAD_ENV]


def layout_script(service: Service) -> str:
    """Lay the model repository out in an emptyDir: links to the read-only model files, and the rendered
    config in place of any config.pbtxt that came with them. With a pipeline, each other member gets a directory
    with its rendered config and an empty version (the image's backend runs the stages), each stage its stub (one
    thread in every math library), and the last stage the model's labels. The user's storage is never written.
    Links are replaced (`ln -sfn`), files overwritten: the script runs again, on the filled emptyDir, when the pod
    restarts."""
    model = shlex.quote(f"{MODEL_REPOSITORY}/{service.served_model.name}")
    source = shlex.quote(MODEL_SOURCE)
    config = shlex.quote(f"{CONFIG_DIR}/{CONFIG_KEY}")
    lines = [
        "set -eu",
        f"src={source}",
        f"dst={model}",
        '[ -d "$src" ] || { echo "model source $src is not a directory" >&2; exit 1; }',
        'mkdir -p "$dst"',
        'for entry in "$src"/*; do',
        '  [ "$(basename "$entry")" = config.pbtxt ] || ln -sfn "$entry" "$dst/"',
        "done",
        f'ln -sfn {config} "$dst/config.pbtxt"',
        'ls -d "$dst"/[0-9]* >/dev/null 2>&1 ||',
        '  { echo "no version directory (e.g. 1/model.onnx) in $src" >&2; exit 1; }',
    ]
    pipeline = service.plan.pipeline
    if pipeline is not None:
        labels = shlex.quote(pipeline.model.outputs[0].label_filename or "")
        stub = shlex.quote(f"{CONFIG_DIR}/{STAGE_STUB_KEY}")
        for name in (pipeline.members["pre"], pipeline.members["post"], pipeline.name):
            member = shlex.quote(f"{MODEL_REPOSITORY}/{name}")
            lines += [
                f"mkdir -p {member}/1",
                f"ln -sfn {shlex.quote(f'{CONFIG_DIR}/{member_config_key(name)}')} {member}/config.pbtxt",
            ]
            if name != pipeline.name:  # a stage: its stub, executable (the ConfigMap's files are not)
                lines.append(f"cp {stub} {member}/{STAGE_STUB} && chmod 0755 {member}/{STAGE_STUB}")
        post = shlex.quote(f"{MODEL_REPOSITORY}/{pipeline.members['post']}")
        lines += [
            f'[ -f "$src"/{labels} ] ||',
            f'  {{ echo "no labels file {labels} in $src: the pipeline answers with the labels" >&2; exit 1; }}',
            f'ln -sfn "$src"/{labels} {post}/{labels}',
        ]
    lines.append(f'echo "model repository laid out:"; ls -l {shlex.quote(MODEL_REPOSITORY)} "$dst"')
    return "\n".join(lines)


def source_volume(service: Service) -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume holding the model files and how it is mounted, read-only, for each storage scheme."""
    scheme, _, rest = service.spec.model.storage_uri.partition("://")
    mount: dict[str, Any] = {"name": "model-source", "mountPath": MODEL_SOURCE, "readOnly": True}
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        if path.strip("/"):
            mount["subPath"] = path.strip("/")
        return {"name": "model-source", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}, mount
    if scheme == "hostpath":
        return {"name": "model-source", "hostPath": {"path": rest, "type": "Directory"}}, mount
    if service.spec.model.fetched:
        # Room for the fetch's staging folder beside a previous fetch, which it replaces only when complete
        size = 2 * service.spec.model.download_limit_bytes()
        return {"name": "model-source", "emptyDir": {"sizeLimit": str(size)}}, {**mount, "subPath": FETCHED}
    return {"name": "model-source", "emptyDir": {}}, mount  # oci: filled by the fetch init container


def container_security() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def fetch_arguments(model: Model) -> list[str]:
    """`inferop fetch` of a model in object storage, with the spec's digest, endpoint and limits."""
    storage = model.storage or ObjectStorage()
    arguments = ["fetch", model.storage_uri, f"{FETCH_MOUNT}/{FETCHED}"]
    if model.sha256 is not None:
        arguments += ["--sha256", model.sha256]
    if storage.endpoint is not None:
        arguments += ["--endpoint", storage.endpoint.rstrip("/")]
    if storage.region is not None:
        arguments += ["--region", storage.region]
    return [
        *arguments,
        "--addressing", storage.addressing,
        "--download-timeout", str(storage.download_timeout_seconds),
        "--attempts", str(storage.attempts),
        "--max-size", str(model.download_limit_bytes()),
        "--termination-log", TERMINATION_LOG,
    ]  # fmt: skip


def credential_env(storage: ObjectStorage | None) -> list[dict[str, Any]]:
    """The fetch's credentials as references to the user's Secret: its values never pass through the operator."""
    if storage is None or storage.credentials_secret is None:
        return []
    return [
        {
            "name": key,
            "valueFrom": {
                "secretKeyRef": {"name": storage.credentials_secret, "key": key, "optional": key not in CREDENTIAL_KEYS}
            },
        }
        for key in (*CREDENTIAL_KEYS, *OPTIONAL_CREDENTIAL_KEYS)
    ]


def init_containers(service: Service, source_mount: dict[str, Any]) -> list[dict[str, Any]]:
    containers = []
    model = service.spec.model
    scheme, _, image = model.storage_uri.partition("://")
    if model.fetched:
        if service.fetch_image is None:
            raise ValueError("a model in object storage needs the fetch image (the operator's INFEROP_FETCH_IMAGE)")
        containers.append(
            {
                "name": FETCH_CONTAINER,
                "image": service.fetch_image,
                "command": ["inferop"],
                "args": fetch_arguments(model),
                "env": credential_env(model.storage),
                "volumeMounts": [
                    {"name": source_mount["name"], "mountPath": FETCH_MOUNT},
                    {"name": "tmp", "mountPath": "/tmp"},  # a tarball is unpacked from a temporary file
                ],
                "securityContext": container_security(),
                "resources": FETCH_RESOURCES,
            }
        )
    if scheme == "oci":
        containers.append(
            {
                "name": FETCH_CONTAINER,
                "image": image,
                "command": ["sh", "-c", f"cp -R {OCI_MODEL_DIR}/. {MODEL_SOURCE}/"],
                "volumeMounts": [{**source_mount, "readOnly": False}],
                "securityContext": container_security(),
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
            }
        )
    containers.append(
        {
            "name": "layout-model",
            "image": service.image,
            "command": ["sh", "-c", layout_script(service)],
            "volumeMounts": [
                source_mount,
                {"name": "models", "mountPath": MODEL_REPOSITORY},
                {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            ],
            "securityContext": container_security(),
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"cpu": "100m", "memory": "64Mi"}},
        }
    )
    return containers


def stall_check(service: Service) -> liveness.StallCheck:
    """The liveness check's timing for this service: from its request timeout and its pod's capacity."""
    spec = service.spec
    return liveness.stall_check(
        spec.timeouts.request_seconds,
        service.plan.queue.capacity,
        service.plan.threads.instances,
        spec.batching.samples_per_batch,
    )


def progress_deadline_seconds(service: Service) -> int:
    """The Deployment's progressDeadlineSeconds, after which a rollout counts as stuck (ProgressDeadlineExceeded):
    the startup budget (the model's load) and 5 minutes for scheduling, pulling the image and the init containers,
    plus a fetch's download timeout for a model in object storage; Kubernetes' own default (600) at the default
    startup budget."""
    storage = service.spec.model.storage or ObjectStorage()
    fetch = storage.download_timeout_seconds if service.spec.model.fetched else 0
    return service.spec.timeouts.startup_seconds + 300 + fetch


# Seconds a Triton pod being deleted goes on serving, while the gateways in front of it drop its address.
ENDPOINT_DRAIN_SECONDS = 5


def shared_memory_volume(spec: InferenceServiceSpec) -> dict[str, Any]:
    """An in-memory /dev/shm as large as the container's memory limit. Triton's python backend (python models, and
    the stubs of a python-based backend) hands tensors to its stub processes through /dev/shm, where a container
    runtime gives 64 MiB: two instances of Inception V3 at maxBatchSize 32 (31 MiB of shared memory each) fail to
    load there. Its pages are charged to the container's memory, which the limit bounds and the estimate counts."""
    size = spec.resources.limits.get("memory")
    return {"name": "shm", "emptyDir": {"medium": "Memory", **({"sizeLimit": str(size)} if size else {})}}


def build_deployment(service: Service) -> dict[str, Any]:
    spec = service.spec
    volume, source_mount = source_volume(service)
    health = {"port": "http", "scheme": "HTTP"}
    container = {
        "name": TRITON_CONTAINER,
        "image": service.image,
        "command": triton_command(service),
        "args": triton_args(service),
        "env": [*thread_env(service), *(variable.model_dump() for variable in spec.runtime.env)],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": spec.resources.model_dump(by_alias=True),
        "startupProbe": {
            "httpGet": {"path": "/v2/health/ready", **health},
            "periodSeconds": STARTUP_PROBE_PERIOD,
            "timeoutSeconds": 2,
            "failureThreshold": math.ceil(spec.timeouts.startup_seconds / STARTUP_PROBE_PERIOD),
        },
        "livenessProbe": liveness.liveness_probe(stall_check(service)),
        "readinessProbe": {
            "httpGet": {"path": "/v2/health/ready", **health},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        # A pod being deleted leaves its Service's endpoints at once, but a gateway learns that later (Envoy by
        # EDS, a kube-proxy by its sync): Triton serves on until then, then gets SIGTERM.
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(ENDPOINT_DRAIN_SECONDS)]}}},
        "volumeMounts": [
            {"name": "models", "mountPath": MODEL_REPOSITORY, "readOnly": True},
            source_mount,
            {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
        "securityContext": container_security(),
    }
    deployment_spec: dict[str, Any] = {
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": progress_deadline_seconds(service),
        "selector": {"matchLabels": selector_labels(service)},
        "template": {
            "metadata": {
                "labels": labels(service),
                "annotations": {
                    CONFIG_HASH_ANNOTATION: service.config_hash,
                    "prometheus.io/scrape": "true",
                    "prometheus.io/port": str(METRICS_PORT),
                },
            },
            "spec": {
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": ENDPOINT_DRAIN_SECONDS + math.ceil(spec.timeouts.request_seconds) + 15,
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": TRITON_UID,
                    "runAsGroup": TRITON_UID,
                    "fsGroup": TRITON_UID,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                **int8_affinity(spec.model),
                "initContainers": init_containers(service, source_mount),
                "containers": [container],
                "volumes": [
                    volume,
                    {"name": "models", "emptyDir": {"sizeLimit": "16Mi"}},
                    {"name": "config", "configMap": {"name": service.config_map_name}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}},
                    shared_memory_volume(spec),
                ],
            },
        },
    }
    if service.track == "candidate":
        deployment_spec["replicas"] = service.routing.candidate_replicas
    elif service.routing.stable_replicas is not None:  # a rollout sets the count while it lasts
        deployment_spec["replicas"] = service.routing.stable_replicas
    elif spec.autoscaling is None:  # with an HPA the replica count is the HPA's, not ours to fight over
        deployment_spec["replicas"] = spec.replicas
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(service, service.object_name),
        "spec": deployment_spec,
    }


def int8_affinity(model: Model) -> dict[str, Any]:
    """An int8 model's node affinity to CPUs with int8 dot-product instructions (any one of them), by NFD's labels:
    the pod spec's `affinity`, or nothing for fp32 or `int8Nodes: any`."""
    if model.precision != "int8" or model.int8_nodes == "any":
        return {}
    terms = [
        {"matchExpressions": [{"key": label, "operator": "In", "values": ["true"]}]} for label in NFD_LABELS.values()
    ]
    affinity: dict[str, Any]
    if model.int8_nodes == "required":  # node selector terms are ORed: a node with any one of them
        affinity = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    else:
        affinity = {
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "preference": t} for t in terms]
        }
    return {"affinity": {"nodeAffinity": affinity}}


# The Pods metrics the HPA reads, as the chart's prometheus-adapter rules (metricsAdapter) compute them from
# Triton's series.
POD_METRICS = {"queueTime": "inferop_queue_time_microseconds", "pendingRequests": "inferop_pending_requests"}


def build_hpa(service: Service, api_version: str) -> dict[str, Any]:
    """A HorizontalPodAutoscaler; `api_version` is autoscaling/v2 or v2beta2 (same schema), as served."""
    autoscaling = service.spec.autoscaling
    if autoscaling is None:
        raise ValueError("build_hpa needs spec.autoscaling")
    if autoscaling.metric == "cpu":
        metric: dict[str, Any] = {
            "type": "Resource",
            "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": autoscaling.target}},
        }
    else:
        metric = {
            "type": "Pods",
            "pods": {
                "metric": {"name": POD_METRICS[autoscaling.metric]},
                "target": {"type": "AverageValue", "averageValue": str(autoscaling.target)},
            },
        }
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": service.name},
        "minReplicas": autoscaling.min_replicas,
        "maxReplicas": autoscaling.max_replicas,
        "metrics": [metric],
    }
    if autoscaling.scale_down_stabilization_seconds is not None:
        spec["behavior"] = {"scaleDown": {"stabilizationWindowSeconds": autoscaling.scale_down_stabilization_seconds}}
    return {
        "apiVersion": api_version,
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(service, service.name),
        "spec": spec,
    }


def build_pdb(service: Service, api_version: str) -> dict[str, Any]:
    """A PodDisruptionBudget: a node drain or a cluster upgrade evicts one Triton pod at a time, so the others keep
    serving while it moves. `api_version` is policy/v1 or v1beta1 (the same fields here), as served.

    Wanted when more than one pod may run: replicas > 1, or an HPA with maxReplicas > 1, since the HPA may have
    scaled out when the drain comes. maxUnavailable 1 (not minAvailable) holds whatever the count, and it never
    blocks a drain of a single pod, so an HPA at its minimum of one is no harm; for a fixed single replica the
    budget would protect nothing, so there is none.
    """
    return {
        "apiVersion": api_version,
        "kind": "PodDisruptionBudget",
        "metadata": metadata(service, service.name),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(service)}},
    }


# The label every namespace carries with its own name (set by Kubernetes from 1.21).
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
# The labels of the operator's pod that the chart renders (charts/inferop/templates/_helpers.tpl).
OPERATOR_POD_LABELS = {"app.kubernetes.io/component": "operator", "app.kubernetes.io/part-of": "inferop"}


def envoy_pod_labels(gateway: str, namespace: str) -> dict[str, str]:
    """The labels Envoy Gateway puts on the Envoy pods of Gateway `gateway` in `namespace` (its owner labels)."""
    owner = "gateway.envoyproxy.io/owning-gateway"
    return {f"{owner}-name": gateway, f"{owner}-namespace": namespace}


def pods_in(namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A NetworkPolicy peer: the pods with `labels` in `namespace`."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: namespace}},
        "podSelector": {"matchLabels": dict(labels)},
    }


def inference_ingress(service: Service) -> list[dict[str, Any]]:
    """Who may call the inference ports: anyone, on http and grpc; or (inferenceFrom gateway) the Gateway's Envoy
    pods and the operator's, on http only."""
    policy, gateway = service.spec.network_policy, service.routing.gateway
    if policy.inference_from == "anywhere":
        return [{"ports": [{"protocol": "TCP", "port": HTTP_PORT}, {"protocol": "TCP", "port": GRPC_PORT}]}]
    if gateway is None:  # plan.check_routing refuses it first
        raise ValueError("networkPolicy.inferenceFrom gateway needs a gateway")
    envoy = envoy_pod_labels(gateway.name, gateway.namespace or service.namespace)
    callers = [pods_in(policy.gateway_namespace, envoy)]
    if service.operator_namespace is not None:
        callers.append(pods_in(service.operator_namespace, OPERATOR_POD_LABELS))
    return [{"from": callers, "ports": [{"protocol": "TCP", "port": HTTP_PORT}]}]


def build_network_policy(service: Service) -> dict[str, Any]:
    """A NetworkPolicy on the Triton pods: the inference ports as `networkPolicy.inferenceFrom` says
    (inference_ingress), metrics only from pods in `networkPolicy.metricsNamespace` (none when unset), nothing
    else; egress is left alone (Triton makes no calls, and a policy on it would also cut DNS). The CNI enforces it;
    without one that does, it is inert. The kubelet's probes come from the pod's node, which policies let through."""
    policy = service.spec.network_policy
    ingress = inference_ingress(service)
    if policy.metrics_namespace:
        ingress.append(
            {
                "from": [{"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: policy.metrics_namespace}}}],
                "ports": [{"protocol": "TCP", "port": METRICS_PORT}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(service, service.name),
        "spec": {
            "podSelector": {"matchLabels": service_labels(service.name)},  # the candidate's pods too
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


# The HTTPRoute's weights are parts per ROUTE_PARTS of the requests. A backendRef that takes none keeps
# PARKED_PARTS: Envoy Gateway drops a backendRef of weight 0 and its Envoy cluster with it (its gatewayapi/route.go,
# v1.9.1), and a route that sends requests to a cluster Envoy adds in the same update fails them until the cluster
# has its endpoints (Envoy warms clusters, never routes: 500, no_cluster). So every backendRef stays for the route's
# life and a step moves a backendRef's endpoints; a parked one takes 1 request in 10,001, of the revision that
# serves the rest.
ROUTE_PARTS = 10_000
PARKED_PARTS = 1


def build_http_route(service: Service, api_version: str) -> dict[str, Any]:
    """The HTTPRoute that attaches the service to its Gateway: callers to the stable Service, or split between it
    and the candidate's by weight; header-matched callers to the candidate; a share mirrored to it. Triton's HTTP
    API only (gRPC callers use the Service).

    Each backendRef sets TRACK_HEADER to its track's component (a RequestHeaderModifier, Gateway API's extended
    backendRef filter). With a filter on a backendRef, Envoy Gateway gives every backend of the rule a cluster of
    its own (httproute/<namespace>/<route>/rule/<rule>/backend/<backend>) where it would put the rule's backends in
    one: Envoy's stats then tell the tracks apart, which the rollout's analysis needs (analysis.route_clusters).
    Those clusters are the same through a rollout (route_backends): the default rule first, its two backendRefs
    always there, the header-matched rule after it (its match outranks the default rule's wherever it stands)."""
    gateway, traffic = service.routing.gateway, service.routing.traffic
    if gateway is None:
        raise ValueError("build_http_route needs a gateway")
    parent: dict[str, Any] = {"group": GATEWAY_GROUP, "kind": "Gateway", "name": gateway.name}
    if gateway.namespace:
        parent["namespace"] = gateway.namespace
    if gateway.section_name:
        parent["sectionName"] = gateway.section_name
    stable = {"name": service.name, "port": HTTP_PORT}
    candidate = {"name": f"{service.name}{CANDIDATE_SUFFIX}", "port": HTTP_PORT}
    default: dict[str, Any] = {"backendRefs": route_backends(stable, candidate, service.candidate, traffic)}
    if service.candidate is not None and traffic.mirror_percent > 0:
        default["filters"] = [
            {"type": "RequestMirror", "requestMirror": {"backendRef": candidate, "percent": traffic.mirror_percent}}
        ]
    rules = [default]
    header = service.spec.rollout.header if service.spec.rollout is not None else None
    if header is not None:  # header-matched callers reach the candidate in its header phase, the stable otherwise
        match = {"headers": [{"type": "Exact", "name": header.name, "value": header.value}]}
        in_header_phase = service.candidate is not None and traffic.header
        track: Track = "candidate" if in_header_phase else "stable"
        target = candidate if in_header_phase else stable
        rules.append({"matches": [match], "backendRefs": [backend_ref(target, track, ROUTE_PARTS)]})
    spec: dict[str, Any] = {"parentRefs": [parent], "rules": rules}
    if gateway.hostnames:
        spec["hostnames"] = list(gateway.hostnames)
    return {
        "apiVersion": api_version,
        "kind": "HTTPRoute",
        "metadata": metadata(service, service.name),
        "spec": spec,
    }


def route_backends(
    stable: dict[str, Any], candidate: dict[str, Any], rolling: Service | None, traffic: Traffic
) -> list[dict[str, Any]]:
    """The default rule's two backendRefs: the first the stable Service's, the second the candidate's while it takes
    requests and the stable's otherwise, each with its share of ROUTE_PARTS and never below PARKED_PARTS."""
    share = traffic.weight * ROUTE_PARTS // 100 if rolling is not None else 0
    first = backend_ref(stable, "stable", max(ROUTE_PARTS - share, PARKED_PARTS))
    if share > 0:
        return [first, backend_ref(candidate, "candidate", share)]
    return [first, backend_ref(stable, "stable", PARKED_PARTS)]


def backend_ref(service: dict[str, Any], track: Track, weight: int) -> dict[str, Any]:
    """A backendRef of the HTTPRoute to one track's Service, naming its track in TRACK_HEADER."""
    named = {
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": TRACK_HEADER, "value": COMPONENTS[track]}]},
    }
    return {**service, "weight": weight, "filters": [named]}


ENVOY_GATEWAY_GROUP = "gateway.envoyproxy.io"
# Envoy's circuit-breaker thresholds are 32-bit counts: the largest stands for "no limit" on the whole backend.
NO_LIMIT = 2**32 - 1


def build_admission_policy(service: Service, api_version: str) -> dict[str, Any]:
    """Envoy Gateway's BackendTrafficPolicy for the service's HTTPRoute: Envoy refuses (503, at once) a request that
    the pods would reject, before its body reaches one (inferop_core.capacity.gateway_admission).

    The bound is on the backend's parallel requests, counted when a request is handed to a connection: a request
    beyond it is refused then, never held waiting for one, and callers arriving together are not refused while
    connections open. It counts every pod the route may reach: the stable track's most (the autoscaler's maximum)
    and, during a rollout, the candidate's. Envoy Gateway sets it on each of the route's clusters, one a backend
    (build_http_route): fewer pods, or one track's cluster, may be sent more than they hold, which their own bound
    then rejects; never less. Each Envoy replica counts its own."""
    tracks = [(service, most_pods(service.spec))]
    if service.candidate is not None:
        tracks.append((service.candidate, service.routing.candidate_replicas))
    admitted = sum(
        gateway_admission(
            pods,
            track.plan.threads.instances,
            track.plan.threads.executing,
            track.spec.batching.max_batch_size,
            track.plan.queue.size,
        )
        for track, pods in tracks
    )
    # Requests wait for a connection only while it opens: as many may as the pods hold.
    breaker = {"maxParallelRequests": admitted, "maxPendingRequests": admitted, "maxConnections": NO_LIMIT}
    return {
        "apiVersion": api_version,
        "kind": "BackendTrafficPolicy",
        "metadata": metadata(service, service.name),
        "spec": {
            "targetRefs": [{"group": GATEWAY_GROUP, "kind": "HTTPRoute", "name": service.name}],
            "circuitBreaker": breaker,
        },
    }


def most_pods(spec: InferenceServiceSpec) -> int:
    return spec.autoscaling.max_replicas if spec.autoscaling is not None else spec.replicas


def candidate_of(service: Service) -> Service:
    """The candidate track of a service that has one."""
    if service.candidate is None:
        raise ValueError(f"service {service.name} has no candidate")
    return service.candidate


def candidate_name(service: Service, suffix: str = "") -> str:
    return f"{service.name}{CANDIDATE_SUFFIX}{suffix}"


@dataclass(frozen=True)
class Child:
    """One kind of object an InferenceService owns, declared once: its API identity, how it is named and built,
    and whether the spec wants it.

    `versions` are the candidates, preferred first: the handlers use the first one the server offers (looked up
    once, where there are several) and pass it to `build` as the manifest's apiVersion. A child with a `when`
    is deleted while `when` is false; one without is always applied. An `extension` child is left alone (neither
    applied nor deleted) where the cluster does not serve its kind.
    """

    kind: str
    group: str  # "" for the core API
    plural: str
    versions: tuple[str, ...]
    name: Callable[[Service], str]
    build: Callable[[Service, str], dict[str, Any]]
    when: Callable[[Service], bool] | None = None
    removal: tuple[str, str] = ("ChildRemoved", "no longer wanted")  # Event reason and why, on deletion
    # An implementation's extension (not Kubernetes' or Gateway API's own): written only where the cluster serves it.
    extension: bool = False

    def wanted(self, service: Service) -> bool:
        return self.when is None or self.when(service)

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    @property
    def verbs(self) -> frozenset[str]:
        """What the reconcile loop needs the API server to allow on this child (the chart's RBAC grants exactly
        these): server-side apply is a PATCH, authorized as a create too while the object does not exist; a child
        with a `when` is also deleted."""
        return frozenset({"create", "patch", *(["delete"] if self.when is not None else [])})


def candidate_child(
    kind: str, group: str, plural: str, suffix: str, build: Callable[[Service], dict[str, Any]]
) -> Child:
    """A child of a rollout's candidate (<service>-canary<suffix>), built from the candidate track."""
    return Child(
        kind,
        group,
        plural,
        ("v1",),
        lambda service: candidate_name(service, suffix),
        lambda service, _: build(candidate_of(service)),
        when=lambda service: service.candidate is not None,
        removal=("CandidateRemoved", "the rollout is over"),
    )


# In the order they are applied. The Deployment comes last: a child the API server refuses leaves the running
# pods as they were (no rollout to a config whose Service or HPA is missing), and the Deployment's watch
# quiet. An unwanted child (the HPA once spec.autoscaling is unset) is deleted.
CHILDREN = (
    Child("ConfigMap", "", "configmaps", ("v1",), lambda s: s.config_map_name, lambda s, _: build_config_map(s)),
    Child("Service", "", "services", ("v1",), lambda s: s.name, lambda s, _: build_service(s)),
    Child(
        "HorizontalPodAutoscaler",
        "autoscaling",
        "horizontalpodautoscalers",
        ("v2", "v2beta2"),  # v2 from 1.23, v2beta2 until 1.25
        lambda s: s.name,
        build_hpa,
        when=lambda s: s.spec.autoscaling is not None,
        removal=("AutoscalingRemoved", "autoscaling unset"),
    ),
    Child(
        "PodDisruptionBudget",
        "policy",
        "poddisruptionbudgets",
        ("v1", "v1beta1"),  # v1 from 1.21, v1beta1 until 1.24
        lambda s: s.name,
        build_pdb,
        when=lambda s: most_pods(s.spec) > 1,
        removal=("DisruptionBudgetRemoved", "at most one pod runs"),
    ),
    Child(
        "NetworkPolicy",
        "networking.k8s.io",
        "networkpolicies",
        ("v1",),
        lambda s: s.name,
        lambda s, _: build_network_policy(s),
        when=lambda s: s.spec.network_policy.enabled,
        removal=("NetworkPolicyRemoved", "networkPolicy.enabled unset"),
    ),
    Child("Deployment", "apps", "deployments", ("v1",), lambda s: s.name, lambda s, _: build_deployment(s)),
    # The candidate during a rollout, built from the new spec: deleted once it is promoted or rolled back.
    candidate_child("ConfigMap", "", "configmaps", "-config", build_config_map),
    candidate_child("Service", "", "services", "", build_service),
    candidate_child("Deployment", "apps", "deployments", "", build_deployment),
    Child(
        "HTTPRoute",
        GATEWAY_GROUP,
        "httproutes",
        ("v1",),
        lambda s: s.name,
        build_http_route,
        when=lambda s: s.routing.gateway is not None,
        removal=("RouteRemoved", "no gateway"),
    ),
    Child(
        "BackendTrafficPolicy",
        ENVOY_GATEWAY_GROUP,
        "backendtrafficpolicies",
        ("v1alpha1",),
        lambda s: s.name,
        build_admission_policy,
        when=lambda s: s.routing.gateway is not None,
        removal=("AdmissionRemoved", "no gateway"),
        extension=True,
    ),
)

"""What the field drills that run on the local cluster's real node share: the node with the operator, the drill's
callers in the node's network, a Deployment of Triton as a user writes it by hand, the operator's pod for an
InferenceService, and each serving pod watched, held to the server's CPU and read from the cgroups the kubelet
made for it."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferop_core.scheduling import CpuScheduling
from inferop_core.tritonconfig import ServingConfig, render_model_config
from inferop_devtools.cluster.node import NodeSite, cgroup_hierarchies
from inferop_devtools.drills.harness import DrillCluster, operator_running, wait_until
from inferop_devtools.field.pods import OUT, REPO, Machine
from inferop_operator.identity import API_VERSION, INSTANCE, KIND

NAMESPACE = "default"
PORTS = (("http", 8000), ("grpc", 8001), ("metrics", 8002))
# NVIDIA's deploy/k8s-onprem chart: what a Deployment of Triton checks by hand.
NVIDIA_PROBES = {
    "livenessProbe": {"httpGet": {"path": "/v2/health/live", "port": "http"}, "initialDelaySeconds": 15,
                      "periodSeconds": 10, "failureThreshold": 3},
    "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "initialDelaySeconds": 5,
                       "periodSeconds": 5, "failureThreshold": 3},
    # "allows Triton to load the models during 30*10 = 300 sec": the others wait for it
    "startupProbe": {"httpGet": {"path": "/v2/health/ready", "port": "http"}, "periodSeconds": 10,
                     "failureThreshold": 30},
}  # fmt: skip


def model_repo(serving: ServingConfig, directory: Path) -> Path:
    """A model repository of the exported model with `serving`'s config, as a user lays it out by hand."""
    model = directory / serving.name
    shutil.copytree(REPO / serving.name, model, ignore=shutil.ignore_patterns("config.pbtxt"))
    (model / "config.pbtxt").write_text(render_model_config(serving))
    for path in (directory, *directory.rglob("*")):  # readable by the container's user
        path.chmod(0o755 if path.is_dir() else 0o644)
    return directory


def triton_deployment(
    name: str,
    image: str,
    repo: Path,
    limits: dict[str, str],
    policy: CpuScheduling = "normal",
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Triton on a model repository (a hostPath), as NVIDIA's examples deploy it: `tritonserver
    --model-repository` with their HTTP probes, under `policy` (SCHED_BATCH through chrt, as the operator's pods),
    with `limits` as both requests and limits, and `env`."""
    command = ["tritonserver", "--model-repository=/models"]
    container = {
        "name": "triton",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["chrt", "--batch", "0", *command] if policy == "batch" else command,
        "ports": [{"containerPort": port, "name": port_name} for port_name, port in PORTS],
        "env": [{"name": key, "value": value} for key, value in (env or {}).items()],
        "resources": {"limits": limits, "requests": limits},
        **NVIDIA_PROBES,
        "volumeMounts": [{"name": "models", "mountPath": "/models", "readOnly": True},
                         {"name": "tmp", "mountPath": "/tmp"}],
    }  # fmt: skip
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": {"runAsUser": 1000, "fsGroup": 1000},
                    "containers": [container],
                    "volumes": [{"name": "models", "hostPath": {"path": str(repo), "type": "Directory"}},
                                {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }  # fmt: skip


def inference_service(name: str, raw: dict[str, Any], env: dict[str, str] | None = None) -> dict[str, Any]:
    """The InferenceService of `raw` (an exported spec) serving the exported model from its hostPath, with `env`
    in spec.runtime.env."""
    spec = json.loads(json.dumps(raw))
    spec["model"]["storageUri"] = f"hostpath://{REPO / spec['model']['name']}"
    if env:
        spec.setdefault("runtime", {})["env"] = [{"name": key, "value": value} for key, value in env.items()]
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec}


def selector_of(manifest: dict[str, Any]) -> str:
    """The label selector of the serving pod `manifest` makes: a Deployment's own, or the operator's."""
    if manifest["kind"] == "Deployment":
        return ",".join(f"{k}={v}" for k, v in manifest["spec"]["selector"]["matchLabels"].items())
    return f"{INSTANCE}={manifest['metadata']['name']}"


@dataclass
class PodWatch:
    """The serving pod of `selector`, seen every `interval` seconds on a thread: its container's restarts, when
    its server process went away, when it was Ready again, with monotonic times."""

    cluster: DrillCluster
    selector: str
    site: NodeSite
    interval: float = 0.1
    pod: dict[str, Any] = field(default_factory=dict)
    server_pid: int | None = None
    gone_at: float | None = None
    ready_again_at: float | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def read(self) -> dict[str, Any]:
        (pod,) = json.loads(
            self.cluster.kubectl("get", "pods", "-n", NAMESPACE, "-l", self.selector, "-o", "json").stdout
        )["items"]
        return dict(pod)

    def container(self, pod: dict[str, Any] | None = None) -> dict[str, Any]:
        statuses = (pod or self.pod)["status"]["containerStatuses"]
        return dict(next(s for s in statuses if s["name"] == "triton"))

    @property
    def address(self) -> str:
        return str(self.pod["status"]["podIP"])

    def path(self, inside: str) -> Path:
        """`inside` (an absolute path in the container) as this machine reaches it, through the server process."""
        return Path(f"/proc/{self.server_pid}/root") / inside.lstrip("/")

    def start(self) -> PodWatch:
        self.pod = self.read()
        pids = self.site.container_pids(self.pod["metadata"]["uid"], self.container()["containerID"])
        servers = [pid for pid in pids if Path(f"/proc/{pid}/comm").read_text().strip() == "tritonserver"]
        self.server_pid = (servers or pids)[0]  # the server, which outlives its model's stub on a stop
        threading.Thread(target=self._loop, name="pod-watch", daemon=True).start()
        return self

    def _loop(self) -> None:
        last_read = 0.0
        while not self._stop.wait(self.interval):
            now = time.monotonic()
            if self.gone_at is None and not Path(f"/proc/{self.server_pid}").exists():
                self.gone_at = now
            if self.gone_at is not None and self.ready_again_at is None and now - last_read >= 0.5:
                last_read = now
                with contextlib.suppress(Exception):  # an apiserver blip: the next read tries again
                    container = self.container(self.read())
                    if container["restartCount"] > 0 and container.get("ready"):
                        self.ready_again_at = time.monotonic()

    def stop(self) -> dict[str, Any]:
        """The container's status at the end."""
        self._stop.set()
        self.pod = self.read()
        return self.container()

    def events(self) -> list[dict[str, Any]]:
        found = json.loads(self.cluster.kubectl(
            "get", "events", "-n", NAMESPACE, "--field-selector", f"involvedObject.name={self.pod['metadata']['name']}",
            "-o", "json").stdout)["items"]  # fmt: skip
        return [{"reason": e["reason"], "count": e.get("count", 1), "message": e["message"][:300]} for e in found]

    def usage(self) -> dict[str, int]:
        """The container's CPU time and throttled time (ns) and its memory peak (bytes) so far, from the cgroups
        the kubelet made for it."""
        uid, container_id = self.pod["metadata"]["uid"], self.container()["containerID"].split("://")[-1]
        found = {}
        for hierarchy in cgroup_hierarchies():
            for cgroup in (hierarchy / self.site.cgroup_root).glob(f"kubepods/**/pod{uid}/{container_id}"):
                found[hierarchy.name] = cgroup
        stat = dict(line.split() for line in (found["cpu"] / "cpu.stat").read_text().splitlines())
        return {
            "cpu_ns": int((found["cpuacct"] / "cpuacct.usage").read_text()),
            "throttled_ns": int(stat["throttled_time"]),
            "memory_peak_bytes": int((found["memory"] / "memory.max_usage_in_bytes").read_text()),
        }


@dataclass
class FieldNode:
    """The local cluster's node with the operator running, this thread in the node's network (its callers and
    Prometheus with it), a scratch directory for the hand-written model repositories."""

    cluster: DrillCluster
    machine: Machine
    work: Path

    @classmethod
    @contextlib.contextmanager
    def up(cls, machine: Machine, name: str) -> Iterator[FieldNode]:
        work = Path(tempfile.mkdtemp(prefix=f"inferop-{name}-"))
        work.chmod(0o755)
        try:
            with (
                DrillCluster(OUT / f"{name}-cluster", node=True) as cluster,
                operator_running(cluster, OUT / f"{name}-operator.log"),
                NodeSite.of(cluster.plane.layout.root).network(),
            ):
                yield cls(cluster, machine, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    @property
    def triton_image(self) -> str:
        assert self.cluster.node is not None
        return self.cluster.node.images()["triton"]

    def repo(self, name: str, serving: ServingConfig) -> Path:
        return model_repo(serving, self.work / name)

    @contextlib.contextmanager
    def serving(self, manifest: dict[str, Any]) -> Iterator[PodWatch]:
        """`manifest` applied and its pod Ready, held to the server's CPU, watched; deleted afterwards."""
        cluster, selector = self.cluster, selector_of(manifest)
        kind = "deployment" if manifest["kind"] == "Deployment" else "infsvc"
        name = manifest["metadata"]["name"]
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        try:
            pods = ("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "name")
            wait_until(lambda: cluster.kubectl(*pods).stdout.strip(), 120, f"a pod of {name}")
            cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "pod", "-l", selector, "--timeout=300s")
            site = NodeSite.of(cluster.plane.layout.root)
            watch = PodWatch(cluster, selector, site).start()
            if not site.pin_pod(watch.pod["metadata"]["uid"], ",".join(map(str, sorted(self.machine.server_cpus)))):
                raise SystemExit(f"error: no cgroup of the pod of {name} to hold to the server's CPU")
            yield watch
        finally:
            cluster.kubectl("delete", "-n", NAMESPACE, kind, name, "--wait=true", check=False)
            wait = ("wait", "-n", NAMESPACE, "--for=delete", "pod", "-l", selector, "--timeout=120s")
            cluster.kubectl(*wait, check=False)

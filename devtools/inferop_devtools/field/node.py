"""What the field drills that run on the local cluster's real node share: the node with the operator, the drill's
callers in the node's network, a Deployment of Triton as a user writes it by hand, the operator's pod for an
InferenceService, and each serving pod watched, held to the server's CPU and read from the cgroups the kubelet
made for it."""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferop.limits import oom_kills_from
from inferop.openloop import OpenLoopResult
from inferop_core.scheduling import CpuScheduling
from inferop_core.tritonconfig import ServingConfig, render_model_config
from inferop_devtools.cluster.node import NODE_NAME, NodeSite, probe_runs
from inferop_devtools.drills.harness import DrillCluster, operator_running, wait_until
from inferop_devtools.field.pods import OUT, REPO, Machine, open_loop
from inferop_devtools.field.work import Snapshot, snapshot
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
    """The label selector of the serving pod `manifest` makes: a Deployment's own (alone, or in a List with what it
    needs), or the operator's."""
    if manifest["kind"] == "List":
        return selector_of(next(item for item in manifest["items"] if item["kind"] == "Deployment"))
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
    _cgroups: dict[str, Path] = field(default_factory=dict)
    _memory: int = 0
    _memory_peak: int = 0  # the highest memory_current() since reset_peak()
    _usage: dict[str, int] = field(default_factory=dict)
    _kill_counted: bool = False

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

    @property
    def url(self) -> str:
        """Triton's HTTP endpoint in the pod."""
        return f"{self.address}:8000"

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

    def work(self, model: str) -> Snapshot:
        """Triton's execution statistics of `model` and the CPU time of the container's processes, now."""
        pids = self.site.container_pids(self.pod["metadata"]["uid"], self.container()["containerID"])
        assert self.server_pid is not None, "started"
        return snapshot(self.url, model, pids, self.server_pid)

    def alive(self) -> bool:
        """Whether the server process the watch started with still runs: no restart, no kill."""
        return self.gone_at is None and Path(f"/proc/{self.server_pid}").exists()

    def liveness_runs(self) -> Counter[str]:
        """The kubelet's runs of the pod's liveness probe so far, by result, from its probe metrics."""
        metrics = self.cluster.kubectl("get", "--raw", f"/api/v1/nodes/{NODE_NAME}/proxy/metrics/probes").stdout
        return probe_runs(metrics, self.pod["metadata"]["name"])

    def cgroups(self) -> dict[str, Path]:
        """The cgroups the kubelet made for the container the watch started with, by v1 hierarchy (cpu, cpuacct,
        memory); found once, as the memory probe reads them during a run."""
        if not self._cgroups:
            self._cgroups = self.site.container_cgroups(self.pod["metadata"]["uid"], self.container()["containerID"])
        return self._cgroups

    def memory_current(self) -> int:
        """Bytes charged to the container now; after it has gone (a kill of the server), the last figure read."""
        with contextlib.suppress(OSError):
            self._memory = int((self.cgroups()["memory"] / "memory.usage_in_bytes").read_text())
            self._memory_peak = max(self._memory_peak, self._memory)
        return self._memory

    def reset_peak(self) -> None:
        """Measure the container's memory peak afresh from now on."""
        (self.cgroups()["memory"] / "memory.max_usage_in_bytes").write_text("0")
        self._memory_peak = 0

    def usage(self) -> dict[str, int]:
        """The container's CPU time and throttled time (ns), its memory peak (bytes) and the processes the kernel's
        OOM killer took in it, so far, from the cgroups the kubelet made for it. Once the container is gone, what
        was last read (the peak at least the highest memory sampled), with the kill of the server that the kubelet saw
        (OOMKilled) counted."""
        found = self.cgroups()
        self._usage = {"cpu_ns": 0, "throttled_ns": 0, "oom_kills": 0, **self._usage}
        self._usage["memory_peak_bytes"] = max(self._usage.get("memory_peak_bytes", 0), self._memory_peak)
        try:
            stat = dict(line.split() for line in (found["cpu"] / "cpu.stat").read_text().splitlines())
            self._usage = {
                "cpu_ns": int((found["cpuacct"] / "cpuacct.usage").read_text()),
                "throttled_ns": int(stat["throttled_time"]),
                "memory_peak_bytes": int((found["memory"] / "memory.max_usage_in_bytes").read_text()),
                "oom_kills": oom_kills_from((found["memory"] / "memory.oom_control").read_text()),
            }
        except (OSError, KeyError):  # its cgroups removed, or never found
            killed = self.container(self.read()).get("lastState", {}).get("terminated", {}).get("reason")
            if killed == "OOMKilled" and not self._kill_counted:
                self._usage["oom_kills"] += 1
                self._kill_counted = True
        return dict(self._usage)

    def open_loop(
        self,
        serving: ServingConfig,
        rate: float,
        seconds: float,
        timeout: float | None,
        machine: Machine,
        url: str | None = None,
    ) -> tuple[OpenLoopResult, dict[str, int]]:
        """Open-loop arrivals at the pod's address, or through `url` (a gateway in front of it), from the callers'
        CPU, with the container's memory sampled; returns the result and the container's usage."""
        result = open_loop(url or self.url, serving, rate, seconds, timeout, machine, self.memory_current)
        return result, self.usage()


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

    def why_not_ready(self, selector: str) -> str:
        """What the kubelet says of the pods of `selector`, and the last words of their Triton container."""
        described = self.cluster.kubectl("describe", "pods", "-n", NAMESPACE, "-l", selector, check=False).stdout
        logs = ("logs", "-n", NAMESPACE, "-l", selector, "-c", "triton", "--tail=80")
        said = self.cluster.kubectl(*logs, "--previous", check=False).stdout
        said = said or self.cluster.kubectl(*logs, check=False).stdout
        return f"the pod as the kubelet sees it:\n{described[-3000:]}\nits Triton container said:\n{said[-8000:]}"

    def repo(self, name: str, serving: ServingConfig) -> Path:
        return model_repo(serving, self.work / name)

    @contextlib.contextmanager
    def serving(self, manifest: dict[str, Any], ready_seconds: int = 300) -> Iterator[PodWatch]:
        """`manifest` (an InferenceService, a Deployment, or a List of a Deployment and what it needs) applied and its
        pod Ready within `ready_seconds` (else CalledProcessError), held to the server's CPU, watched; deleted
        afterwards."""
        cluster, selector = self.cluster, selector_of(manifest)
        name = manifest.get("metadata", {}).get("name", selector)
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(manifest))
        try:
            pods = ("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "name")
            wait_until(lambda: cluster.kubectl(*pods).stdout.strip(), 120, f"a pod of {name}")
            try:
                cluster.kubectl("wait", "-n", NAMESPACE, "--for=condition=Ready", "pod", "-l", selector,
                               f"--timeout={ready_seconds}s")  # fmt: skip
            except subprocess.CalledProcessError as never:
                never.add_note(self.why_not_ready(selector))
                raise
            site = NodeSite.of(cluster.plane.layout.root)
            watch = PodWatch(cluster, selector, site).start()
            if not site.pin_pod(watch.pod["metadata"]["uid"], ",".join(map(str, sorted(self.machine.server_cpus)))):
                raise SystemExit(f"error: no cgroup of the pod of {name} to hold to the server's CPU")
            yield watch
        finally:
            cluster.kubectl("delete", "-f", "-", "--wait=true", stdin=json.dumps(manifest), check=False)
            wait = ("wait", "-n", NAMESPACE, "--for=delete", "pod", "-l", selector, "--timeout=120s")
            cluster.kubectl(*wait, check=False)

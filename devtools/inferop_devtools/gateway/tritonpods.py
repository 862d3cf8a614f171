"""Play the kubelet for the operator's Triton pods: each Running pod gets a real tritonserver bound to its own IP,
serving the model directory of its hostPath volume under the config.pbtxt of its ConfigMap volume (what the pod's
init container lays out), in a cgroup with the container's CPU limit; the pod becomes Ready when Triton answers
/v2/health/ready, as the kubelet's readiness probe would make it, and not before.

kwok plays the rest of the pod's life (scheduled, Running with an IP, deleted), with `played_stages`: its own stages
with one change, that the operator's pods start Running but not Ready. Without that, kwok would mark them Ready at
once, EndpointSlices would list them, and a gateway would send requests to a server still loading its model.

Faults come from the drill (`faults`: the pod's config text -> environment, e.g. model.py's INFEROP_FAULT_SLOWDOWN),
so a candidate can be slow or failing the way a real model would be, with nothing else changed.
"""

from __future__ import annotations

import copy
import logging
import re
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from inferop.limits import PodLimits
from inferop.serving.tritonserver import ServerError, TritonServer
from inferop_core.quantity import parse_quantity
from inferop_devtools.cluster.addons import KWOK_DIR, KWOK_STAGES
from inferop_operator.builders import CONFIG_KEY, HTTP_PORT, METRICS_PORT
from inferop_operator.identity import COMPONENT, INSTANCE, MANAGED, label_selector

log = logging.getLogger(__name__)
Json = dict[str, Any]
MANAGED_LABEL, MANAGED_VALUE = next(iter(MANAGED.items()))
# Requests answered and failed, and the time they spent in Triton (queue and compute, cumulative microseconds).
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_request_duration_us")


def played_stages(workdir: Path) -> list[Path]:
    """kwok's stages (scripts/kwok) with the operator's pods left unready: the pod-ready stage skips them, and a
    copy of it takes them to Running with their Ready and ContainersReady conditions False and no container
    ready. Written into `workdir`; the other stage files are used as they are."""
    stages = list(yaml.safe_load_all((KWOK_DIR / "pod.yaml").read_text()))
    ready = next(stage for stage in stages if stage["metadata"]["name"] == "pod-ready")
    started = copy.deepcopy(ready)
    managed = {"key": f'.metadata.labels["{MANAGED_LABEL}"]', "values": [MANAGED_VALUE]}
    ready["spec"]["selector"]["matchExpressions"].append({**managed, "operator": "NotIn"})
    started["metadata"]["name"] = "pod-started-unready"
    started["spec"]["selector"]["matchExpressions"].append({**managed, "operator": "In"})
    template = started["spec"]["next"]["statusTemplate"]
    unready = re.sub(r'status: "True"(\s+type: (?:Ready|ContainersReady))', r'status: "False"\1', template)
    unready = re.sub(r"ready: true(\s+started: true)", r"ready: false\1", unready, count=1)  # containerStatuses
    if unready.count('status: "False"') != 2 or "ready: false" not in unready:
        raise ValueError("scripts/kwok/pod.yaml's pod-ready template changed: update played_stages")
    started["spec"]["next"]["statusTemplate"] = unready
    path = workdir / "pod-played.yaml"
    path.write_text(yaml.safe_dump_all([*stages, started], sort_keys=False))
    return [
        KWOK_DIR / "node.yaml",
        path,
        *(KWOK_DIR / name for name in KWOK_STAGES if name not in ("node.yaml", "pod.yaml")),
    ]


def volume(pod: Json, kind: str) -> Json:
    """The pod's first volume of `kind` (hostPath, configMap)."""
    return next(v[kind] for v in pod["spec"]["volumes"] if kind in v)


def cpu_limit(pod: Json) -> float | None:
    container = pod["spec"]["containers"][0]
    limit = ((container.get("resources") or {}).get("limits") or {}).get("cpu")
    return None if limit is None else parse_quantity(limit)


class TritonPods:
    """The Triton pods of `namespace`, each played by a local tritonserver at its IP; `sync` is one round of the
    kubelet's loop (start what is new, stop what went, mark Ready what serves), `run` repeats it on a thread."""

    def __init__(
        self,
        api: Any,
        namespace: str,
        workdir: Path,
        faults: Callable[[str], Mapping[str, str]] = lambda config: {},
        on_change: Callable[[], None] = lambda: None,
        cpuset: Callable[[Json], str | None] = lambda pod: None,
    ) -> None:
        from kubernetes import client

        self.api, self.namespace, self.workdir, self.faults, self.on_change = api, namespace, workdir, faults, on_change
        self.cpuset = cpuset  # the CPUs a pod's server may use (a node of its own, where a drill needs one)
        self.core = client.CoreV1Api(api)
        self.servers: dict[str, TritonServer] = {}
        self.initial: dict[str, dict[str, float]] = {}  # each server's counts when it became ready (its warm-up)
        self.pods: dict[str, Json] = {}  # the pod as last listed, by name
        self.starting: dict[str, Future[TritonServer]] = {}
        self.failures: list[str] = []
        self._starter = ThreadPoolExecutor(4, thread_name_prefix="triton-pod")
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def running_pods(self) -> dict[str, Json]:
        listing = self.core.list_namespaced_pod(self.namespace, label_selector=label_selector(MANAGED))
        pods = [self.api.sanitize_for_serialization(pod) for pod in listing.items]
        return {
            pod["metadata"]["name"]: pod
            for pod in pods
            if (pod.get("status") or {}).get("phase") == "Running"
            and pod["status"].get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
        }

    def _start(self, pod: Json) -> TritonServer:
        name = pod["metadata"]["name"]
        config_map = self.core.read_namespaced_config_map(volume(pod, "configMap")["name"], self.namespace)
        config = (config_map.data or {})[CONFIG_KEY]
        source = Path(volume(pod, "hostPath")["path"])
        model = re.search(r'^name: "([^"]+)"', config, re.MULTILINE)
        if model is None:
            raise ServerError(f"pod {name}: its config names no model")
        repo = self.workdir / name / "repo"
        model_dir = repo / model.group(1)
        model_dir.mkdir(parents=True, exist_ok=True)
        (model_dir / "config.pbtxt").write_text(config)
        for entry in source.iterdir():  # as the layout init container links them
            if entry.name != "config.pbtxt" and not (model_dir / entry.name).exists():
                (model_dir / entry.name).symlink_to(entry.resolve())
        server = TritonServer(
            repo,
            http_port=HTTP_PORT,
            host=pod["status"]["podIP"],
            log_path=self.workdir / name / "tritonserver.log",
            limits=PodLimits(cpus=cpu_limit(pod), cpuset=self.cpuset(pod)),
            env=dict(self.faults(config)),
        )
        server.start()
        try:
            self.initial[name] = server.metrics(model.group(1), *COUNTERS)
            self._mark_ready(pod)
        except BaseException:  # a pod deleted while its server started: the server must not outlive it
            server.stop()
            raise
        return server

    def _mark_ready(self, pod: Json) -> None:
        """What the kubelet writes once the readiness probe passes."""
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = [
            {"type": kind, "status": "True", "lastTransitionTime": now} for kind in ("Ready", "ContainersReady")
        ]
        statuses = [{**status, "ready": True} for status in pod["status"].get("containerStatuses") or []]
        self.core.patch_namespaced_pod_status(
            pod["metadata"]["name"],
            self.namespace,
            {"status": {"conditions": conditions, "containerStatuses": statuses}},
        )

    def sync(self) -> None:
        running = self.running_pods()
        changed = False
        for name in [n for n in self.servers if n not in running]:
            self.servers.pop(name).stop()
            self.pods.pop(name, None)
            changed = True
        for name, future in list(self.starting.items()):
            if future.done():
                del self.starting[name]
                try:
                    self.servers[name] = future.result()
                    changed = True
                except Exception as error:  # a pod that does not start is reported, and tried again
                    self.failures.append(f"{name}: {error}")
                    log.warning("pod %s did not start: %s", name, error)
        for name, pod in running.items():
            self.pods[name] = pod
            if name not in self.servers and name not in self.starting:
                self.starting[name] = self._starter.submit(self._start, pod)
        if changed:
            self.on_change()

    def run(self, period: float = 0.5) -> TritonPods:
        def loop() -> None:
            while not self._stop.wait(period):
                try:
                    self.sync()
                except Exception as error:  # an apiserver hiccup: the next round tries again
                    log.warning("triton pods sync: %s", error)

        self._thread = threading.Thread(target=loop, name="triton-pods", daemon=True)
        self._thread.start()
        return self

    def targets(self) -> list[Json]:
        """Prometheus file_sd entries for the serving pods, labelled as the chart's PodMonitor labels them."""
        entries = []
        for name, server in self.servers.items():
            labels = self.pods[name]["metadata"].get("labels") or {}
            entries.append(
                {
                    "targets": [f"{server.host}:{METRICS_PORT}"],
                    "labels": {
                        "namespace": self.namespace,
                        "pod": name,
                        "app_kubernetes_io_instance": labels.get(INSTANCE, ""),
                        "app_kubernetes_io_component": labels.get(COMPONENT, ""),
                    },
                }
            )
        return entries

    def counts(self, model: str) -> dict[str, dict[str, float]]:
        """Each serving pod's requests as Triton counts them (successes, failures, time in the server) since it
        became ready (its model's warm-up requests left out), read off its metrics port."""
        found = {}
        for name, server in list(self.servers.items()):
            try:
                now = server.metrics(model, *COUNTERS)
            except OSError:
                continue
            found[name] = {key: value - self.initial.get(name, {}).get(key, 0.0) for key, value in now.items()}
        return found

    def component(self, name: str) -> str:
        return str((self.pods.get(name, {}).get("metadata", {}).get("labels") or {}).get(COMPONENT, ""))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        for future in self.starting.values():
            future.cancel()
        self._starter.shutdown(wait=True)
        for future in self.starting.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().stop()
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

"""Prometheus finding pods as a PodMonitor selects them, with Debian's Prometheus, which is built without Kubernetes
service discovery (its kubernetes_sd_configs is refused as an unknown field): `PodDiscovery` lists the pods through
the API every half second and writes each monitor's targets, labelled as Prometheus Operator's relabelling of that
PodMonitor labels them, into a file_sd file that the monitor's scrape job reads."""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger(__name__)
Json = dict[str, Any]


def label_name(label: str) -> str:
    """A Kubernetes label as a Prometheus label name (every character outside [a-zA-Z0-9_] an underscore)."""
    return re.sub("[^a-zA-Z0-9_]", "_", label)


@dataclass(frozen=True)
class PodMonitor:
    """What a PodMonitor says: the job's name, the pods' labels (each label's allowed values), the container port
    by name and the path scraped there, the pod labels copied onto every series (podTargetLabels), and the
    namespaces looked in (empty: all)."""

    job: str
    matches: Mapping[str, Sequence[str]]
    port: str
    target_labels: Sequence[str] = ()
    path: str = "/metrics"
    namespaces: Sequence[str] = field(default_factory=tuple)

    def selects(self, pod: Json) -> bool:
        labels = pod["metadata"].get("labels") or {}
        in_namespace = not self.namespaces or pod["metadata"]["namespace"] in self.namespaces
        return in_namespace and all(labels.get(label) in values for label, values in self.matches.items())

    def targets(self, pods: Sequence[Json]) -> list[Json]:
        """file_sd groups: one per container port named `port` of each selected pod that has an address and has
        not ended, labelled namespace, pod, container and with the target labels."""
        groups = []
        for pod in pods:
            status = pod.get("status") or {}
            if not self.selects(pod) or not status.get("podIP") or status.get("phase") in ("Failed", "Succeeded"):
                continue
            labels = pod["metadata"].get("labels") or {}
            for container in pod["spec"]["containers"]:
                for port in container.get("ports") or ():
                    if port.get("name") != self.port:
                        continue
                    shown = {label_name(label): labels.get(label, "") for label in self.target_labels}
                    groups.append(
                        {
                            "targets": [f"{status['podIP']}:{port['containerPort']}"],
                            "labels": {
                                "namespace": pod["metadata"]["namespace"],
                                "pod": pod["metadata"]["name"],
                                "container": container["name"],
                                **shown,
                            },
                        }
                    )
        return groups

    def scrape_job(self, directory: Path) -> Json:
        """The job in prometheus.yml, reading its targets from the file PodDiscovery keeps in `directory`."""
        files = [str(self.file(directory))]
        return {"job_name": self.job, "metrics_path": self.path, "file_sd_configs": [{"files": files}]}

    def file(self, directory: Path) -> Path:
        return directory / f"{label_name(self.job)}.json"


class PodDiscovery:
    """Keeps each monitor's file_sd file in `directory` up to date with the pods `list_pods()` returns."""

    def __init__(
        self,
        list_pods: Callable[[], list[Json]],
        monitors: Sequence[PodMonitor],
        directory: Path,
        interval: float = 0.5,
    ) -> None:
        self.list_pods, self.monitors, self.directory, self.interval = list_pods, monitors, directory, interval
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pod-discovery", daemon=True)
        directory.mkdir(parents=True, exist_ok=True)
        self._written: dict[str, list[Json]] = {}
        for monitor in monitors:
            self._write(monitor, [])

    def _write(self, monitor: PodMonitor, groups: list[Json]) -> None:
        if self._written.get(monitor.job) == groups:
            return
        path = monitor.file(self.directory)
        staged = path.with_suffix(".tmp")
        staged.write_text(json.dumps(groups))
        staged.replace(path)  # whole, so Prometheus never reads half a file
        self._written[monitor.job] = groups

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            try:
                pods = self.list_pods()
            except Exception as error:  # a failed list keeps the last targets, as Prometheus' own discovery does
                log.warning("listing pods for Prometheus failed: %s", error)
                continue
            for monitor in self.monitors:
                self._write(monitor, monitor.targets(pods))

    def __enter__(self) -> PodDiscovery:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self._stopped.set()
        self._thread.join()

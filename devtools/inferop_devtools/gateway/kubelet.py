"""Play the kubelet for one container of a pod that kwok reports Running: run its real program as a local
process, with the pod's own command, arguments and environment, and its Secret and ConfigMap volumes written to
disk and bind-mounted at their mount paths in a private mount namespace (namespaces.private_root_argv).

kwok makes pods Running and Ready without running anything. For Envoy Gateway's Envoy that is not enough: the
data plane is the thing under test, so the bootstrap Envoy Gateway rendered into the Deployment must run as it is
(paths such as /certs and /sds included), not a copy rewritten for this machine.

The builders at the top are pure and work on pods as the API serves them (camelCase JSON dicts).
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from inferop_devtools.cluster.addons import Daemon
from inferop_devtools.cluster.controlplane import ClusterError, http_get, stop_process
from inferop_devtools.gateway.namespaces import private_root_argv

Json = dict[str, Any]

# The downward API's `metadata.labels['x']` and `metadata.annotations['x']`.
_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
# Kubernetes' $(VAR) references in command and args; $$ escapes a dollar.
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def field_value(pod: Json, path: str) -> str:
    """The value the downward API gives a `fieldRef` (empty when the pod has none, as for a missing annotation)."""
    if match := _SUBSCRIPT.match(path):
        return str(pod["metadata"].get(match[1], {}).get(match[2], ""))
    simple = {
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"]["namespace"],
        "metadata.uid": pod["metadata"].get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
        "status.podIP": pod.get("status", {}).get("podIP", ""),
        "status.hostIP": pod.get("status", {}).get("hostIP", ""),
    }
    if path not in simple:
        raise ClusterError(f"fieldRef {path!r} is not played here: extend kubelet.field_value")
    return str(simple[path])


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of $(VAR) in command, args and env values: unknown references stay as written."""

    def replace(match: re.Match[str]) -> str:
        if match[0] == "$$":
            return "$"
        return env.get(match[1], match[0])

    return _REFERENCE.sub(replace, text)


def container_env(pod: Json, container: Json) -> dict[str, str]:
    """The container's environment from `value` and `valueFrom.fieldRef`, in order (later entries may refer to
    earlier ones)."""
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        source = variable.get("valueFrom", {})
        if "value" in variable:
            env[variable["name"]] = expand(variable["value"], env)
        elif "fieldRef" in source:
            env[variable["name"]] = field_value(pod, source["fieldRef"]["fieldPath"])
        elif "valueFrom" in variable:
            raise ClusterError(f"env {variable['name']}: only value and fieldRef are played here")
        else:
            env[variable["name"]] = ""
    return env


def volume_files(
    pod: Json, read_secret: Callable[[str], Json], read_config_map: Callable[[str], Json]
) -> dict[str, dict[str, bytes]]:
    """Each Secret and ConfigMap volume's files (relative path -> content), honouring `items`. Other kinds of
    volume (emptyDir...) are empty directories."""
    volumes: dict[str, dict[str, bytes]] = {}
    for volume in pod["spec"].get("volumes", []):
        if "secret" in volume:
            source = volume["secret"]
            secret = read_secret(source["secretName"])
            data = {key: base64.b64decode(value) for key, value in (secret.get("data") or {}).items()}
        elif "configMap" in volume:
            source = volume["configMap"]
            config_map = read_config_map(source["name"])
            data = {key: value.encode() for key, value in (config_map.get("data") or {}).items()}
            data |= {key: base64.b64decode(value) for key, value in (config_map.get("binaryData") or {}).items()}
        else:
            volumes[volume["name"]] = {}
            continue
        items = source.get("items")
        volumes[volume["name"]] = {item["path"]: data[item["key"]] for item in items} if items else data
    return volumes


def mount_binds(container: Json, volume_dirs: Mapping[str, Path]) -> dict[str, Path]:
    """Mount path -> directory (or file, with subPath) for each of the container's volume mounts."""
    binds: dict[str, Path] = {}
    for mount in container.get("volumeMounts", []):
        source = volume_dirs[mount["name"]]
        binds[mount["mountPath"]] = source / mount["subPath"] if mount.get("subPath") else source
    return binds


def container_argv(container: Json, env: Mapping[str, str], path: Sequence[Path]) -> list[str]:
    """command + args, expanded, with the program looked up in `path` (the image's binaries, here local ones)."""
    argv = [expand(part, env) for part in [*container.get("command", []), *container.get("args", [])]]
    if not argv:
        raise ClusterError(f"container {container['name']}: no command (an image's entrypoint cannot be played)")
    program = shutil.which(argv[0], path=os.pathsep.join(map(str, path)))
    if program is None:
        raise ClusterError(f"container {container['name']}: {argv[0]} not found in {', '.join(map(str, path))}")
    return [program, *argv[1:]]


# --------------------------------------------------------------------------------------------- processes


class WrappedDaemon(Daemon):
    """A Daemon whose command execs through wrappers (unshare, chroot, env) into `program`: its pid then runs
    `program`, which is what `stop` must find there before it signals the process group."""

    def __init__(self, argv: Sequence[str], log_path: Path, program: str) -> None:
        super().__init__(argv, log_path)
        self.program = program

    def stop(self) -> None:
        if self.process is None:
            return
        stop_process(self.process.pid, self.program)
        if self.process.poll() is None:  # still a wrapper, before its exec: our child, so the pid is ours
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.process = None


class PodContainer:
    """One container of a running pod, run here as the kubelet would run it; its files live in `workdir`.

    `path` replaces the image: where the container's program is looked up. `binds` adds mounts that the node,
    not the pod, provides (e.g. /etc/hosts standing in for cluster DNS)."""

    def __init__(
        self,
        api: Any,
        namespace: str,
        pod_name: str,
        container: str,
        workdir: Path,
        path: Sequence[Path],
        binds: Mapping[str, Path] | None = None,
    ) -> None:
        self.api, self.namespace, self.pod_name, self.container = api, namespace, pod_name, container
        self.workdir, self.path, self.binds = workdir, list(path), dict(binds or {})
        self.daemon: WrappedDaemon | None = None
        self.pod: Json = {}

    def _read(self) -> tuple[Json, Json]:
        from kubernetes import client

        core = client.CoreV1Api(self.api)
        pod: Json = self.api.sanitize_for_serialization(core.read_namespaced_pod(self.pod_name, self.namespace))
        for container in pod["spec"]["containers"]:
            if container["name"] == self.container:
                return pod, container
        raise ClusterError(f"pod {self.namespace}/{self.pod_name} has no container {self.container}")

    def _write_volumes(self, pod: Json) -> dict[str, Path]:
        from kubernetes import client

        core = client.CoreV1Api(self.api)

        def secret(name: str) -> Json:
            found: Json = self.api.sanitize_for_serialization(core.read_namespaced_secret(name, self.namespace))
            return found

        def config_map(name: str) -> Json:
            found: Json = self.api.sanitize_for_serialization(core.read_namespaced_config_map(name, self.namespace))
            return found

        dirs: dict[str, Path] = {}
        for volume, files in volume_files(pod, secret, config_map).items():
            directory = self.workdir / "volumes" / volume
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            for relative, content in files.items():
                (directory / relative).parent.mkdir(parents=True, exist_ok=True)
                (directory / relative).write_bytes(content)
            dirs[volume] = directory
        return dirs

    def start(self) -> PodContainer:
        """Write the volumes and start the program; the pod must be Running (kwok gave it its IP)."""
        pod, container = self._read()
        if pod.get("status", {}).get("phase") != "Running":
            raise ClusterError(f"pod {self.namespace}/{self.pod_name} is not Running yet")
        self.pod = pod
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = container_env(pod, container)
        argv = container_argv(container, env, self.path)
        binds = {**mount_binds(container, self._write_volumes(pod)), **self.binds}
        root = self.workdir / "root"
        root.mkdir(exist_ok=True)
        # A container's environment is its own, not the caller's: PATH is the image's, here `path`.
        clean_env = [f"PATH={os.pathsep.join(map(str, self.path))}", *(f"{k}={v}" for k, v in env.items())]
        wrapped = private_root_argv(root, binds, ["env", "-i", *clean_env, *argv])
        self.daemon = WrappedDaemon(wrapped, self.workdir / f"{self.container}.log", argv[0])
        self.daemon.start()
        return self

    @property
    def pod_ip(self) -> str:
        return str(self.pod["status"]["podIP"])

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the container's readiness probe (an httpGet) answers 200 at the pod's IP, as the kubelet probes."""
        if self.daemon is None:
            raise ClusterError("not started")
        _, container = self._read()
        probe = (container.get("readinessProbe") or {}).get("httpGet")
        if probe is None:
            raise ClusterError(f"container {self.container} has no httpGet readiness probe to wait for")
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container.get("ports", []) if p.get("name") == port)
        url = f"http://{self.pod_ip}:{port}{probe.get('path', '/')}"
        self.daemon.wait(lambda: http_get(url)[0] == 200, f"{self.pod_name}/{self.container} ({url})", timeout)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.daemon = None


class StandInPods:
    """One local process per Running pod of `namespace` matching `selector`, started from `argv_for(pod)` (a
    stand-in for the pod's image, e.g. backend.py bound to the pod's IP), stopped when the pod goes. `sync` does
    one pass, as one round of the kubelet's loop; a drill calls it after scaling or rolling out."""

    def __init__(
        self, api: Any, namespace: str, selector: str, workdir: Path, argv_for: Callable[[Json], Sequence[str]]
    ) -> None:
        self.api, self.namespace, self.selector, self.workdir, self.argv_for = (
            api,
            namespace,
            selector,
            workdir,
            argv_for,
        )
        self.daemons: dict[str, Daemon] = {}
        self.pods: dict[str, Json] = {}

    def running_pods(self) -> list[Json]:
        from kubernetes import client

        listing = client.CoreV1Api(self.api).list_namespaced_pod(self.namespace, label_selector=self.selector)
        pods: list[Json] = [self.api.sanitize_for_serialization(pod) for pod in listing.items]
        return [
            pod
            for pod in pods
            if pod.get("status", {}).get("phase") == "Running"
            and pod["status"].get("podIP")
            and not pod["metadata"].get("deletionTimestamp")
        ]

    def sync(self) -> None:
        running = {pod["metadata"]["name"]: pod for pod in self.running_pods()}
        for name in set(self.daemons) - set(running):
            self.daemons.pop(name).stop()
            self.pods.pop(name, None)
        self.workdir.mkdir(parents=True, exist_ok=True)
        for name, pod in running.items():
            if name not in self.daemons:
                daemon = Daemon(self.argv_for(pod), self.workdir / f"{name}.log")
                daemon.start()
                self.daemons[name], self.pods[name] = daemon, pod
        for daemon in self.daemons.values():
            daemon.check()

    def stop(self) -> None:
        for daemon in self.daemons.values():
            daemon.stop()
        self.daemons.clear()
        self.pods.clear()

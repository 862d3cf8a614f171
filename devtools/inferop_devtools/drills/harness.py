"""What every control-plane drill stands on: a fresh local control plane with the CRD, the operator as its own
process (so it can be killed, restarted and measured), and waiting on watches rather than polls."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from inferop.paths import repo_root
from inferop_devtools.cluster.controlplane import (
    KUBERNETES_1_20,
    KUBERNETES_1_37,
    ControlPlane,
    KubernetesRelease,
    free_ports,
    http_get,
)
from inferop_devtools.cluster.node import Node, NodeSite, start_with_node, stop_with_node
from inferop_devtools.cluster.tools import kube_tools, wait_established
from inferop_operator.identity import API_VERSION, CRD_NAME, GROUP, KIND, PLURAL, VERSION

ROOT = repo_root()
CRD_DIR = ROOT / "charts" / "inferop" / "crds"
EXAMPLE = ROOT / "operator" / "examples" / "conv-net.yaml"


def example_spec() -> dict[str, Any]:
    """The conv-net example's spec: a valid service that converges without pods running."""
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    return spec


def service(name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": spec if spec is not None else example_spec(),
    }


class DrillCluster:
    """A fresh control plane in `root` with the CRD established; `api` is a Kubernetes API client. With `node`, the
    current release and a real node beside it (`inferop cluster up`'s), the operator's default image its Triton."""

    def __init__(self, root: Path, release: KubernetesRelease = KUBERNETES_1_20, node: bool = False):
        self.root = root
        state_dir = root / "cluster"
        if node:
            self.plane = ControlPlane(state_dir, release=KUBERNETES_1_37, address=NodeSite.of(state_dir).host_address)
        else:
            self.plane = ControlPlane(state_dir, release=release)
        self.with_node = node
        self.node: Node | None = None
        self.tools = kube_tools()
        self.api: Any = None

    def __enter__(self) -> DrillCluster:
        from kubernetes import config

        if self.with_node:
            self.node, _, _ = start_with_node(self.plane, timeout=120)
        else:
            self.plane.up(timeout=120)
        try:
            self.env = {
                **os.environ,
                "KUBECONFIG": str(self.plane.kubeconfig),
                "PATH": f"{self.tools}{os.pathsep}{os.environ['PATH']}",
            }
            if self.node is not None:
                images = self.node.images()
                self.env |= {"INFEROP_TRITON_IMAGE": images["triton"], "INFEROP_FETCH_IMAGE": images["operator"]}
            self.kubectl("apply", *self.plane.release.kubectl_crd_flags, "-f", str(CRD_DIR))
            wait_established(self.tools / "kubectl", self.plane.kubeconfig, CRD_NAME)
            self.api = config.new_client_from_config(str(self.plane.kubeconfig))
        except BaseException:  # no __exit__ follows a failed __enter__: the control plane must not outlive it
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.with_node:
            stop_with_node(self.plane)
        else:
            self.plane.down()

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                [str(self.tools / "kubectl"), *args],
                input=stdin,
                text=True,
                env=self.env,
                check=check,
                capture_output=True,
            )
        except subprocess.CalledProcessError as failed:  # its message alone does not say why
            failed.add_note(f"kubectl said: {(failed.stderr or '').strip()[-2000:]}")
            raise

    @property
    def custom(self) -> Any:
        from kubernetes import client

        return client.CustomObjectsApi(self.api)

    @property
    def apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api)

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.api)

    def list_json(self, path: str) -> list[dict[str, Any]]:
        """The items of a GET of `path` (e.g. /apis/policy/v1beta1/namespaces/x/poddisruptionbudgets) as plain
        dicts, for kinds the typed client does not cover in every version."""
        response = self.api.call_api(
            "GET", self.api.configuration.host + path, header_params={"Accept": "application/json"}
        )
        response.read()
        return list(json.loads(response.data)["items"])

    def services(self, namespace: str) -> list[dict[str, Any]]:
        listing = self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)
        return list(listing["items"])

    def create_namespaces(self, names: list[str]) -> None:
        for name in names:
            self.kubectl("create", "namespace", name)

    def request_counts(self) -> dict[str, float]:
        """The apiserver's `apiserver_request_total`, summed by verb: what the drills divide by services."""
        status, body = self.plane.api_get("/metrics", timeout=10)
        if status != 200:
            raise RuntimeError(f"GET /metrics answered {status}")
        counts: dict[str, float] = {}
        for line in body.splitlines():
            if line.startswith("apiserver_request_total{"):
                labels, value = line.rsplit(" ", 1)
                verb = labels.split('verb="', 1)[1].split('"', 1)[0]
                counts[verb] = counts.get(verb, 0.0) + float(value)
        return counts


class OperatorProcess:
    """`inferop operator` as its own process, as the chart runs it: killed with SIGKILL and started again at will.

    Every start appends to one log, so tracebacks and restarts across the whole drill are counted."""

    def __init__(
        self, cluster: DrillCluster, log: Path, resync_seconds: float = 60, env: dict[str, str] | None = None
    ) -> None:
        self.cluster, self.log_path, self.resync_seconds = cluster, log, resync_seconds
        self.extra_env = dict(env or {})  # operator settings (INFEROP_*) beyond the resync
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.unexpected_exits: list[int] = []  # exit codes of runs that ended without being killed or stopped

    def start(self, timeout: float = 60) -> None:
        liveness = f"http://127.0.0.1:{free_ports(1)[0]}/healthz"
        env = {**self.cluster.env, "INFEROP_RESYNC_SECONDS": str(self.resync_seconds), **self.extra_env}
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "inferop_core.cli", "operator", "--all-namespaces", f"--liveness={liveness}"],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self.starts += 1
        wait_until(lambda: http_get(liveness)[0] == 200, timeout, "the operator's liveness endpoint")

    def running(self) -> bool:
        if self.process is None:
            return False
        code = self.process.poll()
        if code is not None and code not in self.unexpected_exits:
            self.unexpected_exits.append(code)
        return code is None

    def kill(self) -> None:
        """SIGKILL: no handler finishes, no state is saved."""
        assert self.process is not None
        if self.running():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.running():
            self.process.terminate()
            self.process.wait(30)
        self.process = None

    def rss_bytes(self) -> int:
        """Resident memory now."""
        assert self.process is not None
        return process_memory(self.process.pid, "VmRSS")

    def peak_rss_bytes(self) -> int:
        """The kernel's own high-water mark of resident memory since this run started: no sampling can miss the
        busiest moment."""
        assert self.process is not None
        return process_memory(self.process.pid, "VmHWM")

    def tracebacks(self) -> list[str]:
        """Each traceback the operator logged, by its last line (what was raised)."""
        lines = self.log_path.read_text(errors="replace").splitlines() if self.log_path.exists() else []
        found = []
        for index, line in enumerate(lines):
            if "Traceback (most recent call last)" in line:
                tail = next((x for x in lines[index + 1 :] if x and not x.startswith((" ", "\t"))), "")
                found.append(tail[:300])
        return found


def process_memory(pid: int, field: str) -> int:
    """A memory figure of /proc/<pid>/status (VmRSS, VmHWM...) in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} for pid {pid}")


def wait_until(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):  # a control plane on its way back answers with errors
            result = check()
            if result:
                return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def watch_until(
    what: str,
    timeout: float,
    count: int,
    ready: Callable[[dict[str, Any]], bool],
    list_call: Callable[..., Any],
    *args: Any,
    on_ready: Callable[[dict[str, Any]], None] | None = None,
    **selectors: Any,
) -> None:
    """Wait until `count` of the objects `list_call(*args, **selectors)` lists are `ready`: one list, then a watch.

    Waiting must cost the apiserver next to nothing, since the drills measure the operator on the CPUs the
    apiserver uses. Measured here (kube-apiserver 1.20.2, 2 cores), a list costs the apiserver about 0.5 ms of CPU
    per InferenceService and 0.17 ms per Deployment, so polling 1,000 of each every 10 ms took 0.7 of a CPU. A
    watch costs one list, then one event per change, sent from the apiserver's watch cache. `on_ready` sees each
    object the first time it is ready.
    """
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    deadline = time.monotonic() + timeout
    done: set[str] = set()

    def note(item: dict[str, Any]) -> None:
        key = f"{item['metadata'].get('namespace', '')}/{item['metadata']['name']}"
        if key not in done and on_ready is not None:
            on_ready(item)
        done.add(key)

    while True:  # again from a fresh list when the watch's resourceVersion has expired (410 Gone)
        listing = json.loads(list_call(*args, **selectors, _preload_content=False).data)
        for item in listing["items"]:
            if ready(item):
                note(item)
        if len(done) >= count:
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} ({len(done)} of {count})")
        stream = watch.Watch()
        try:
            for event in stream.stream(
                list_call,
                *args,
                **selectors,
                resource_version=listing["metadata"]["resourceVersion"],
                timeout_seconds=math.ceil(remaining),
                deserialize=False,
            ):
                item = event["object"]
                if event["type"] in ("ADDED", "MODIFIED") and ready(item):
                    note(item)
                if len(done) >= count:
                    stream.stop()
                    return
        except ApiException as error:
            if error.status != 410:
                raise


def converged(item: dict[str, Any]) -> bool:
    """The operator has reported on the service's current spec, and not as a failure."""
    status = item.get("status") or {}
    return bool(status.get("observedGeneration") == item["metadata"]["generation"] and status.get("phase") != "Failed")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))] if ordered else float("nan")


@contextlib.contextmanager
def operator_running(
    cluster: DrillCluster, log: Path, resync_seconds: float = 60, env: dict[str, str] | None = None
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(cluster, log, resync_seconds, env)
    operator.start()
    try:
        yield operator
    finally:
        operator.stop()

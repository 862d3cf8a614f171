"""One Envoy in front of one pod, admitting what the operator's BackendTrafficPolicy admits.

The overload drill puts a gateway in front of one pod on the callers' CPU, as a gateway runs on other machines than
the pods, which an Envoy that Envoy Gateway runs as a pod of the one node could not be. This Envoy (the binary Envoy
Gateway runs, from scripts/gateway.sh) gets, in a static bootstrap, the circuit breaker Envoy Gateway renders from
the policy's `circuitBreaker` (maxParallelRequests, maxPendingRequests and maxConnections to the cluster's
max_requests, max_pending_requests and max_connections), with the figure from the same
`inferop_core.capacity.gateway_admission`. Its count of refused requests comes from its admin API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import yaml

from inferop.paths import log_tail
from inferop_devtools.cluster.controlplane import ClusterError, free_ports, http_get
from inferop_devtools.gateway.envoygateway import gateway_binaries
from inferop_operator.builders import NO_LIMIT

ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
CONNECTION_MANAGER = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
# Requests Envoy refused for the backend: its parallel requests at their bound (counted when handed to a
# connection), or, never here, as many waiting for a connection.
REFUSED_STATS = ("cluster.pods.upstream_rq_active_overflow", "cluster.pods.upstream_rq_pending_overflow")


def bootstrap(port: int, admin_port: int, backend: str, admitted: int) -> dict[str, object]:
    """Callers on 127.0.0.1:`port` to the pod at `backend` (host:port); no route timeout (the callers keep their
    own)."""
    host, _, backend_port = backend.rpartition(":")
    route = {"match": {"prefix": "/"}, "route": {"cluster": "pods", "timeout": "0s"}}
    manager = {
        "@type": CONNECTION_MANAGER,
        "stat_prefix": "callers",
        "route_config": {"virtual_hosts": [{"name": "pods", "domains": ["*"], "routes": [route]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    endpoint = {"endpoint": {"address": {"socket_address": {"address": host, "port_value": int(backend_port)}}}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "callers",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                    "filter_chains": [
                        {
                            "filters": [
                                {"name": "envoy.filters.network.http_connection_manager", "typed_config": manager}
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "pods",
                    "type": "STATIC",
                    "connect_timeout": "5s",
                    "circuit_breakers": {
                        "thresholds": [
                            {"max_connections": NO_LIMIT, "max_requests": admitted, "max_pending_requests": admitted}
                        ],
                    },
                    "load_assignment": {"cluster_name": "pods", "endpoints": [{"lb_endpoints": [endpoint]}]},
                }
            ],
        },
    }


class StandaloneEnvoy:
    """Envoy on `cpus` (the callers' side: a gateway runs on other machines than the pods), one worker thread."""

    def __init__(self, backend: str, admitted: int, cpus: set[int] | None = None) -> None:
        self.port, self.admin_port = free_ports(2)
        self._config = bootstrap(self.port, self.admin_port, backend, admitted)
        self._cpus = cpus
        self._work = Path(tempfile.mkdtemp(prefix="inferop-envoy-"))
        self._log = self._work / "envoy.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> StandaloneEnvoy:
        config = self._work / "envoy.yaml"
        config.write_text(yaml.safe_dump(self._config))
        argv = [
            str(gateway_binaries() / "envoy"),
            "--config-path", str(config),
            "--concurrency", "1",
            "--disable-hot-restart",
            "--log-level", "warn",
        ]  # fmt: skip
        cpus = self._cpus
        with self._log.open("wb") as log:
            self.process = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                failure = ClusterError(f"envoy exited with {self.process.returncode}\n{log_tail(self._log)}")
                self.stop()
                raise failure
            if http_get(f"http://127.0.0.1:{self.admin_port}/ready")[0] == 200:
                return self
            time.sleep(0.1)
        failure = ClusterError(f"envoy not ready within {timeout:g} s\n{log_tail(self._log)}")
        self.stop()
        raise failure

    def refused(self) -> int:
        """Requests refused so far because the pod held its bound (503 at once)."""
        status, text = http_get(f"http://127.0.0.1:{self.admin_port}/stats?filter=overflow")
        if status != 200:
            raise ClusterError(f"envoy's admin API answered {status} for its stats")
        counters = dict(line.partition(": ")[::2] for line in text.splitlines())
        return sum(int(counters.get(name, 0)) for name in REFUSED_STATS)

    def stop(self) -> None:
        """Envoy gone, and its bootstrap and log with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self._work, ignore_errors=True)

    def __enter__(self) -> StandaloneEnvoy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

"""Start and stop NVIDIA's real `tritonserver` (from the nvidia-pytriton wheel) on 127.0.0.1.

The wheel carries the server, its libraries and the python backend with a stub per Python version. We lay
out a backend directory with the stub for this interpreter, so the stub imports numpy and onnxruntime
from this environment, and run the server in its own process group so stopping it leaves no stub behind.
With `limits`, the server and its stubs run in a cgroup with a pod's CPU and memory limits: the resources they
would have in Kubernetes.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from inferop.limits import PodCgroup, PodLimits
from inferop.paths import cache_dir, log_tail
from inferop.serving.localrepo import prepare_local_repo
from inferop_core import scheduling
from inferop_core.errors import InferopError
from inferop_core.quantity import format_bytes
from inferop_core.tritonconfig import RATE_LIMIT_ARG

READY_TIMEOUT_S = 120.0
# "failed to load 'name' version 1: <reason>", up to the reason's first escaped newline (a traceback follows).
_LOAD_FAILURE = re.compile(r"(failed to load '[^']+' version \d+: .*?)(?:\\n|\"?$)")


class ServerError(InferopError, RuntimeError):
    """tritonserver could not be started or died; the message carries the reason and the log's tail."""


@dataclass(frozen=True)
class TritonInstall:
    binary: Path
    libraries: Path
    backends: Path  # a directory holding python/ laid out for this interpreter

    @classmethod
    def locate(cls) -> TritonInstall:
        try:
            import pytriton
        except ImportError as error:
            raise ServerError(
                "tritonserver not found: install the serving extra (`pip install 'inferop[serve]'`, "
                "which brings nvidia-pytriton with NVIDIA's tritonserver binary)"
            ) from error
        package = Path(pytriton.__file__).parent / "tritonserver"
        libraries = package.parent.parent / "nvidia_pytriton.libs"
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = package / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise ServerError(f"nvidia-pytriton has no python backend stub for Python {version} ({stub})")
        backends = cache_dir() / "triton-backends" / f"py{version}"
        python_backend = backends / "python"
        if not (python_backend / "triton_python_backend_stub").is_file():
            staging = Path(tempfile.mkdtemp(dir=cache_dir()))
            shutil.copytree(
                package / "backends" / "python", staging / "python", ignore=shutil.ignore_patterns("__pycache__")
            )
            shutil.copy2(stub, staging / "python" / "triton_python_backend_stub")
            backends.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(python_backend, ignore_errors=True)
            (staging / "python").rename(python_backend)
            shutil.rmtree(staging, ignore_errors=True)
        return cls(binary=package / "bin" / "tritonserver", libraries=libraries, backends=backends)

    def environment(self) -> dict[str, str]:
        """The server's libraries and this interpreter's libpython for the stub; this environment's bin
        first in PATH so the stub's Python finds the same numpy and onnxruntime as we do."""
        env = dict(os.environ)
        lib_path = [str(sysconfig.get_config_var("LIBDIR")), str(self.libraries)]
        if env.get("LD_LIBRARY_PATH"):
            lib_path.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(lib_path)
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        return env


@dataclass
class TritonServer:
    """A local tritonserver on `repo` (an ONNX Runtime model repository, translated for the python backend).

    Use as a context manager, or `start()` / `stop()`. `extra_args` are passed to tritonserver as they are.
    `limits` run it in a pod's cgroup (`cgroup`); `stop()` keeps the cgroup's last measurements in `usage`.
    `cpu_scheduling` is the Linux scheduling policy of the operator's pods (see inferop_core.scheduling).
    """

    repo: Path
    http_port: int = 8000
    host: str = "127.0.0.1"  # the address every port binds (a pod's IP where a drill plays a pod)
    grpc_port: int | None = None
    metrics_port: int | None = None
    extra_args: list[str] = field(default_factory=list)
    log_path: Path | None = None
    limits: PodLimits | None = None
    env: dict[str, str] = field(default_factory=dict)  # more environment for the server and its stubs
    cpu_scheduling: scheduling.CpuScheduling = scheduling.DEFAULT_CPU_SCHEDULING  # as the operator's pods run
    cgroup: PodCgroup | None = field(default=None, init=False)
    usage: dict[str, float | int | str | None] | None = field(default=None, init=False)
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _workdir: Path | None = field(default=None, init=False)
    _own_log: bool = field(default=False, init=False)  # the log lives in the work directory and goes with it

    @property
    def url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    def command(self, install: TritonInstall, local_repo: Path) -> list[str]:
        return [
            str(install.binary),
            f"--model-repository={local_repo}",
            f"--backend-directory={install.backends}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            "--pinned-memory-pool-byte-size=0",
            "--cuda-memory-pool-byte-size=0:0",
            # Shutdown waits this long for in-flight requests and open connections, then ends them.
            "--exit-timeout-secs=5",
            RATE_LIMIT_ARG,  # instances that take turns (ServingConfig.take_turns)
            *self.extra_args,
        ]

    def start(self, timeout: float = READY_TIMEOUT_S) -> TritonServer:
        self.grpc_port = self.grpc_port or self.http_port + 1
        self.metrics_port = self.metrics_port or self.http_port + 2
        for name, port in (
            ("--http-port", self.http_port),
            ("--grpc-port", self.grpc_port),
            ("--metrics-port", self.metrics_port),
        ):
            if not port_is_free(port, self.host):
                raise ServerError(f"{name} {port}: port is already in use on {self.host}; choose another")
        install = TritonInstall.locate()
        self._workdir = Path(tempfile.mkdtemp(prefix="inferop-serve-"))
        local_repo = prepare_local_repo(self.repo.resolve(), self._workdir / "repo")
        if self.log_path is None:
            self.log_path, self._own_log = self._workdir / "tritonserver.log", True
        try:
            if self.limits is not None and not self.limits.empty:
                self.cgroup = PodCgroup(self.limits).create()
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    self.command(install, local_repo),
                    env={**install.environment(), **self.env},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,  # its own process group: stub processes are stopped with it
                    preexec_fn=self._enter_pod,
                )
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _enter_pod(self) -> None:
        """In the child before exec: the pod's cgroup and scheduling policy, for everything it starts too."""
        if self.cgroup is not None:
            self.cgroup.join()
        scheduling.apply(self.cpu_scheduling)

    def wait_ready(self, timeout: float) -> None:
        """Until the model is ready and the metrics endpoint answers: Triton starts its metrics server after its HTTP
        server, and a caller that reads the metrics at once was refused in that gap."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                failures = "".join(f"{line}\n" for line in self.load_failures())
                raise ServerError(f"{self.exit_reason()}:\n{failures}{self.log_tail()}")
            if http_status(f"http://{self.url}/v2/health/ready") == 200 and http_status(self.metrics_url) == 200:
                return
            time.sleep(0.2)
        raise ServerError(f"tritonserver not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM the whole process group (Triton unloads models and ends its stubs), SIGKILL on timeout."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGKILL)  # any stub that outlived its server
        if self.cgroup is not None:
            self.usage = self.cgroup.usage()  # peaks and counters outlive the processes, not the cgroup
            self.cgroup.destroy()
            self.cgroup = None
        if self._workdir is not None:
            # The log goes with it unless it was asked for elsewhere; errors above already quoted its tail.
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            if self._own_log:  # a restart (`start()` again, as a kubelet restarts a container) writes a new one
                self.log_path, self._own_log = None, False

    def exit_reason(self) -> str:
        """How the server ended, naming the OOM killer when it struck in the pod: a pod's most common death,
        which the server's own log cannot tell."""
        assert self.process is not None and self.process.returncode is not None
        code = self.process.returncode
        reason = f"tritonserver exited with code {code}"
        if code < 0:
            with contextlib.suppress(ValueError):
                reason += f" ({signal.Signals(-code).name})"
        usage = self.cgroup.usage() if self.cgroup is not None else self.usage
        if usage and usage["oom_kills"] and self.limits is not None and self.limits.memory_bytes is not None:
            reason += (
                f"; {usage['oom_kills']} process(es) in its cgroup killed by the kernel's OOM killer at the memory "
                f"limit {format_bytes(self.limits.memory_bytes)} (peak "
                f"{format_bytes(float(usage['memory_peak_bytes'] or 0))}): raise the limit or serve fewer models"
            )
        return reason

    def metrics(self, model: str, *names: str) -> dict[str, float]:
        """Triton's Prometheus series `names` for `model` (`model_metrics`)."""
        return model_metrics(self.metrics_url, model, *names)

    def load_failures(self) -> list[str]:
        """Triton's reason for each model that failed to load: far above the log's tail, which a startup
        failure fills with the options table and the shutdown."""
        if self.log_path is None or not self.log_path.exists():
            return []
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [match.group(1) for match in map(_LOAD_FAILURE.search, lines) if match]

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do: TIME_WAIT is no conflict
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port free now, with the next two free too (Triton's gRPC and metrics ports follow HTTP's)."""
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port < 65530 and port_is_free(port + 1) and port_is_free(port + 2):
            return port
    raise ServerError("no three consecutive free ports on 127.0.0.1")


def http_status(url: str, timeout: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (urllib.error.URLError, OSError):
        return None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def model_metrics(url: str, model: str, *names: str) -> dict[str, float]:
    """Triton's Prometheus series `names` for `model`, summed over their other labels, read off the metrics
    endpoint at `url`: what a scraper sees, without one."""
    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in totals and f'model="{model}"' in line:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals

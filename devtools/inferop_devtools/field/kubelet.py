"""A kubelet's liveness prober for a local tritonserver: the Deployment's rendered probe (exec, or httpGet), run
as the kubelet runs it (every periodSeconds, killed after timeoutSeconds, inside the pod's cgroup), restarting the
container after failureThreshold consecutive failures (SIGTERM, SIGKILL after terminationGracePeriodSeconds, then
a fresh start). The overload drill, which runs its pods as local servers, uses it to show a busy server left alone;
the hang drill and tests/node have the real kubelet run the probe.

Only the addresses and the interpreter change: the rendered command probes 127.0.0.1:8000/8002 and keeps its state
in the pod's /tmp; here it probes the local server's ports and keeps its state in a temporary directory, and runs on
the interpreter that runs the drill, as the image's python3 is a binary (a `python3` on PATH may be a shim, such as
pyenv's, a shell script that costs the pod's quota several times what the probe does).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferop.serving.tritonserver import TritonServer, http_status
from inferop_operator import liveness


def localized(command: list[str], server: TritonServer, state_dir: Path) -> list[str]:
    """The rendered probe command with the local server's addresses and a local state file; every value replaced
    must occur exactly once, so a change to the rendering cannot slip past unreplaced."""
    replacements = {
        "python3": os.path.realpath(sys.executable),
        liveness.LIVE_URL: f"http://{server.url}/v2/health/live",
        liveness.METRICS_URL: server.metrics_url,
        liveness.STATE_FILE: str(state_dir / Path(liveness.STATE_FILE).name),
    }
    for old in replacements:
        if command.count(old) != 1:
            raise ValueError(f"the rendered probe command should hold {old!r} once: {command}")
    return [replacements.get(arg, arg) for arg in command]


@dataclass
class ProbeRun:
    at: float  # seconds since the prober started
    ok: bool
    seconds: float  # how long the command ran
    output: str


@dataclass
class Restart:
    at: float  # when the threshold was reached
    stopped_at: float  # when the old server had exited
    ready_at: float | None  # when the new one answered ready (None: it did not)
    exit_reason: str


@dataclass
class LivenessProber:
    """Runs `probe` (a Deployment container's livenessProbe) against `server` until `stop()`; with
    `restart=True` a threshold of failures restarts the server, after `on_restart()` (e.g. clearing a fault)."""

    server: TritonServer
    probe: dict[str, Any]
    state_dir: Path
    grace_seconds: float  # terminationGracePeriodSeconds
    restart: bool = True
    on_restart: Callable[[], None] | None = None
    runs: list[ProbeRun] = field(default_factory=list)
    restarts: list[Restart] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def period(self) -> float:
        return float(self.probe["periodSeconds"])

    def now(self) -> float:
        return time.monotonic() - self.started

    def run_once(self) -> ProbeRun:
        began = time.monotonic()
        if "httpGet" in self.probe:  # a plain HTTP check, as the kubelet makes it: 2xx and 3xx pass
            path = self.probe["httpGet"]["path"]
            status = http_status(f"http://{self.server.url}{path}", timeout=float(self.probe["timeoutSeconds"]))
            ok, output = status is not None and 200 <= status < 400, f"GET {path}: {status}"
            run = ProbeRun(round(began - self.started, 3), ok, round(time.monotonic() - began, 3), output)
            self.runs.append(run)
            return run
        command = localized(self.probe["exec"]["command"], self.server, self.state_dir)
        cgroup = self.server.cgroup
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=float(self.probe["timeoutSeconds"]),
                preexec_fn=cgroup.join if cgroup is not None else None,  # the probe is charged to the pod, as there
                check=False,
            )
            ok, output = done.returncode == 0, (done.stdout + done.stderr).strip()
        except subprocess.TimeoutExpired:
            ok, output = False, f"probe timed out after {self.probe['timeoutSeconds']} s"
        run = ProbeRun(round(began - self.started, 3), ok, round(time.monotonic() - began, 3), output[-300:])
        self.runs.append(run)
        return run

    def _loop(self) -> None:
        failures = 0
        next_run = time.monotonic() + self.period
        while not self._stop.wait(max(0.0, next_run - time.monotonic())):
            next_run += self.period
            failures = 0 if self.run_once().ok else failures + 1
            if failures >= int(self.probe["failureThreshold"]):
                failures = 0
                if self.restart:
                    self._restart()
                    next_run = time.monotonic() + self.period

    def _restart(self) -> None:
        at = self.now()
        process = self.server.process
        self.server.stop(timeout=self.grace_seconds)
        reason = self.server.exit_reason() if process is not None else "not running"
        stopped = self.now()
        if self.on_restart is not None:
            self.on_restart()
        ready: float | None = None
        try:
            self.server.start()  # same ports, a fresh process, as a restarted container
            ready = self.now()
        except Exception as error:  # a server that does not come back is a finding, not a crash of the drill
            reason += f"; restart failed: {error}"
        self.restarts.append(
            Restart(round(at, 3), round(stopped, 3), None if ready is None else round(ready, 3), reason)
        )

    def start(self) -> LivenessProber:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="liveness-prober", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self) -> dict[str, Any]:
        return {
            "probe": {k: v for k, v in self.probe.items() if k != "exec"},
            "runs": len(self.runs),
            "failures": sum(1 for run in self.runs if not run.ok),
            "slowest_run_seconds": max((run.seconds for run in self.runs), default=None),
            "failed_runs": [run.__dict__ for run in self.runs if not run.ok][:20],
            "restarts": [restart.__dict__ for restart in self.restarts],
        }

    def __enter__(self) -> LivenessProber:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

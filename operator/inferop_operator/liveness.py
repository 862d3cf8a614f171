"""The Triton container's liveness check: it fails when a model stops completing work while requests wait for it.

Triton's `/v2/health/live` answers 200 while a model instance hangs inside `execute`: the server is up, the
batch inside the instance never returns, and the queue's timeout only ends the requests still queued. Nothing
restarts such a pod. This check reads Triton's own metrics on the metrics port, where executions count only when
they complete (`nv_inference_exec_count`), requests wait in `nv_inference_pending_request_count`, and requests
that timed out of the queue count as `nv_inference_request_failure{reason="REJECTED"}` (a full queue's
rejections do not). Each run compares them with the previous run's, model by model, kept in the pod's /tmp (an
emptyDir), and fails when a model completed no execution since then while requests waited for it (pending now, or
timed out meanwhile): in an image pipeline, a hung model does not hide behind its decoding stage, which goes on
completing requests that then wait for the model. It also fails when `/v2/health/live` does not answer 200, as the
plain HTTP check did.

The kubelet restarts the container after `failureThreshold` consecutive failures `periodSeconds` apart, that is
after between (failureThreshold - 1) and failureThreshold periods without a completed execution. The window is
derived from the timeouts: a caller's request times out after `timeouts.requestSeconds`, so when no execution
completed for that long while requests waited, every waiting caller has failed; a pod whose single batch takes
longer than that (a slow pod, a large batch) gets two batches' time instead, so a healthy pod under any load
never goes that long without completing one.

The command runs in NVIDIA's Triton image: `python3` (Python's standard library only) is installed there by
Triton's build (`build.py` installs python3-pip in every Linux image, python3 for the python backend), and
runs with a read-only root filesystem, writing only its state file under /tmp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Consecutive failures before the kubelet restarts the container: a restart comes after no execution completed
# for between 2 and 3 periods, the first run after a stall seeing part of a period's executions.
FAILURE_THRESHOLD = 3
# A run answers within this (the kubelet counts a longer one as a failure); the metrics request gets a second less.
MAX_TIMEOUT_SECONDS = 5
STATE_FILE = "/tmp/inferop-liveness.json"
LIVE_URL = "http://127.0.0.1:8000/v2/health/live"
METRICS_URL = "http://127.0.0.1:8002/metrics"

# Run as `python3 -I -S -c SCRIPT LIVE_URL METRICS_URL STATE_FILE PERIOD HTTP_TIMEOUT`. Exit 0: live; 1: not (the
# kubelet shows the printed line in the container's events). A state older than two and a half periods (the
# container restarted, or a run was missed) or counters that went down (a new server) start over.
#
# The run is charged to the pod's CPU quota, which an overloaded server spends to the last millisecond: what the
# script costs decides how long it takes there. So no site module (-S) and no http or urllib package: a plain
# HTTP/1.0 GET on a socket (the server closes after its answer, which is never chunked). Measured here: 20 ms of CPU
# against 60 ms with urllib.request.
PROBE_SCRIPT = """\
import json, os, socket, sys, time
live, metrics, path, period, timeout = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
def get(url):
    address, _, target = url.split("//", 1)[1].partition("/")
    host, _, port = address.partition(":")
    with socket.create_connection((host, int(port or 80)), timeout) as connection:
        connection.sendall(("GET /%s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" % (target, address)).encode())
        chunks = []
        while True:
            chunk = connection.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\\r\\n\\r\\n")
    status = head.split(b" ", 2)[1:2]
    if not status or not status[0].startswith(b"2"):
        raise OSError("%s answered %r" % (url, head.split(b"\\r\\n", 1)[0].decode(errors="replace")))
    return body.decode()
try:
    get(live)
    text = get(metrics)
except Exception as error:
    print("tritonserver does not answer: %s" % error)
    sys.exit(1)
models = {}
for line in text.splitlines():
    name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[-1]
    if name not in ("nv_inference_exec_count", "nv_inference_pending_request_count", "nv_inference_request_failure"):
        continue
    model = line.split('model="', 1)[1].split('"', 1)[0] if 'model="' in line else ""
    now = models.setdefault(model, {"executions": 0.0, "pending": 0.0, "rejected": 0.0, "failed": 0.0})
    if name == "nv_inference_exec_count":
        now["executions"] += float(value)
    elif name == "nv_inference_pending_request_count":
        now["pending"] += float(value)
    else:
        now["failed"] += float(value)
        if 'reason="' in line:
            now["labelled"] = True
            now["rejected"] += float(value) if 'reason="REJECTED"' in line else 0.0
for now in models.values():
    if not now.pop("labelled", False):
        now["rejected"] = now["failed"]
try:
    with open(path) as state:
        last = json.load(state)
except (OSError, ValueError):
    last = None
with open(path + ".new", "w") as state:
    json.dump({"time": time.time(), "models": models}, state)
os.replace(path + ".new", path)
if not isinstance(last, dict) or "models" not in last or time.time() - last["time"] > 2.5 * period:
    sys.exit(0)
before = last["models"]
if any(model in before and now["executions"] < before[model]["executions"] for model, now in models.items()):
    sys.exit(0)
for model, now in sorted(models.items()):
    if model not in before or now["executions"] != before[model]["executions"]:
        continue
    timed_out = now["rejected"] - before[model]["rejected"]
    if now["pending"] > 0 or timed_out > 0:
        print(
            "no execution of model %s completed in %.0f s while requests waited (%d pending, %d timed out of the "
            "queue)" % (model, time.time() - last["time"], now["pending"], timed_out)
        )
        sys.exit(1)
"""


@dataclass(frozen=True)
class StallCheck:
    """The liveness probe's timing, derived from the timeouts (and the pod's capacity, where known)."""

    window_seconds: float  # a restart needs at least this long without a completed execution
    period_seconds: int
    failure_threshold: int
    timeout_seconds: int

    def explain(self) -> str:
        return (
            f"restart after no execution completed for {self.window_seconds:g}-"
            f"{self.period_seconds * self.failure_threshold} s while requests waited (every "
            f"{self.period_seconds} s, {self.failure_threshold} failures)"
        )


def stall_check(request_seconds: float, capacity: float | None, instances: int, samples_per_batch: int) -> StallCheck:
    """The window is the request timeout, or two batches of one instance at the pod's capacity if that is longer
    (`capacity`: samples per second of the pod, None when unknown); the period a half of it, so that the
    threshold's two whole periods span it."""
    window = float(request_seconds)
    if capacity:
        window = max(window, 2 * samples_per_batch * instances / capacity)
    period = max(1, math.ceil(window / (FAILURE_THRESHOLD - 1)))
    return StallCheck(
        window_seconds=round(window, 3),
        period_seconds=period,
        failure_threshold=FAILURE_THRESHOLD,
        timeout_seconds=min(period, MAX_TIMEOUT_SECONDS),
    )


def probe_command(check: StallCheck) -> list[str]:
    """The exec probe's command, with the pod's own addresses and state file."""
    http_timeout = max(0.5, check.timeout_seconds - 1)
    return [
        "python3",
        "-I",  # isolated: no user site, no PYTHON* variables of the image
        "-S",  # no site module: the run's CPU is the pod's
        "-c",
        PROBE_SCRIPT,
        LIVE_URL,
        METRICS_URL,
        STATE_FILE,
        f"{check.period_seconds}",
        f"{http_timeout:g}",
    ]


def liveness_probe(check: StallCheck) -> dict[str, object]:
    return {
        "exec": {"command": probe_command(check)},
        "periodSeconds": check.period_seconds,
        "timeoutSeconds": check.timeout_seconds,
        "failureThreshold": check.failure_threshold,
    }

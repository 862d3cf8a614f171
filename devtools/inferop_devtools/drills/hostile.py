"""Hostile requests against `inferop serve`: what a real tritonserver answers to malformed, oversized, slow and
idle clients, how fast, and whether valid traffic and the health probes carry on meanwhile.

Every hostile request is written byte for byte on a raw socket, so what is sent is exactly what the case says
(a Content-Length above the body, a binary tensor shorter than its header declares), and every socket has a
timeout, so the drill ends whatever the server does: no answer within the case's timeout is recorded as
"timeout" with its time, a failure of the goal. The goal of a rejected request is a 4xx, or the connection
closed, within 1 s. NaN and Inf are valid IEEE floats: Triton computes with them and answers 200 with NaN
outputs, which is the right outcome for a server (it cannot know whether a model treats NaN as a missing
value), so the goal there is an answer within 1 s and a server still live; our client sends what it is given.

What Triton 2.51 cannot defend (it has no HTTP body size limit and no header or body timeout: a stalled body or
an idle connection stays open for minutes, and a 40 MB JSON tensor is parsed whole before its batch size is
refused) belongs to an ingress: `NginxFront` runs the same cases through nginx with a body limit, header and
body timeouts and request buffering (`nginx_config`), the settings the report recommends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from inferop.limits import PodLimits, cgroup_unavailable_reason
from inferop.serving.tritonserver import TritonServer, free_port, http_status
from inferop_core.quantity import format_bytes

GOAL_SECONDS = 1.0  # a hostile request is answered (4xx) or its connection closed within this
GOODPUT_GOAL = 0.9  # valid traffic during the hostile cases keeps this share of its goodput alone
CASE_TIMEOUT_S = 5.0  # the drill's own limit per case: it never hangs, whatever the server does
CALLERS = 4  # closed-loop valid callers, batch 1
HEALTH_INTERVAL_S = 0.2
JSON_ELEMENTS = 10**7  # the oversized JSON tensor: about 40 MB of "0.5,"
DECLARED_HUGE = 2**31  # a 2 GiB Content-Length with a few bytes sent
IDLE_CONNECTIONS = 2_000
IDLE_HOLD_S = 5.0
SLOW_BYTE_INTERVAL_S = 0.2  # slow loris: one header byte every this many seconds

Expect = Literal["reject", "tolerate", "hold"]
GOALS: dict[str, str] = {
    "reject": "4xx or closed within 1 s",
    "tolerate": "200 or 4xx within 1 s, server stays live",
    "hold": "all opened; live, ready and valid requests answered while held",
}


# ------------------------------------------------------------------------------------------ pure helpers


@dataclass(frozen=True)
class Model:
    """What the hostile requests need to know of the served model (read from the server)."""

    name: str
    input: str
    datatype: str
    dims: tuple[int, ...]  # without the batch axis
    max_batch_size: int
    outputs: tuple[str, ...]

    @property
    def sample_elements(self) -> int:
        return int(np.prod(self.dims))

    def infer_path(self, name: str | None = None, version: str | None = None) -> str:
        model = name or self.name
        return f"/v2/models/{model}/versions/{version}/infer" if version else f"/v2/models/{model}/infer"


def http_request(
    path: str,
    body: bytes = b"",
    *,
    method: str = "POST",
    content_type: str = "application/json",
    content_length: int | None = None,
    headers: dict[str, str] | None = None,
) -> bytes:
    """An HTTP/1.1 request as bytes on the wire; `content_length` may lie about the body (the hostile point)."""
    fields = {"Host": "127.0.0.1", "Content-Type": content_type, **(headers or {})}
    fields["Content-Length"] = str(len(body) if content_length is None else content_length)
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{key}: {value}\r\n" for key, value in fields.items())
    return head.encode() + b"\r\n" + body


def json_infer(
    model: Model,
    *,
    datatype: str | None = None,
    shape: list[int] | None = None,
    data: list[Any] | None = None,
    outputs: list[str] | None = None,
) -> bytes:
    """A JSON inference request for the model's input, zeros by default; each argument overrides one field."""
    shape = shape if shape is not None else [1, *model.dims]
    values = data if data is not None else [0.0] * int(np.prod(shape))
    request: dict[str, Any] = {
        "inputs": [{"name": model.input, "datatype": datatype or model.datatype, "shape": shape, "data": values}]
    }
    if outputs is not None:
        request["outputs"] = [{"name": name} for name in outputs]
    return json.dumps(request).encode()  # NaN and Infinity as the bare tokens Python's json writes


def binary_infer(model: Model, array: np.ndarray, declared_bytes: int | None = None) -> tuple[bytes, dict[str, str]]:
    """A binary-tensor request (JSON header, then raw bytes) and its extra headers; `declared_bytes` may claim
    more bytes than the array has (a truncated tensor)."""
    raw = array.tobytes()
    header = {
        "inputs": [
            {
                "name": model.input,
                "datatype": model.datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw) if declared_bytes is None else declared_bytes},
            }
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": False}} for name in model.outputs],
    }
    head = json.dumps(header).encode()
    return head + raw, {"Inference-Header-Content-Length": str(len(head))}


def large_json_infer(model: Model, elements: int) -> bytes:
    """A JSON tensor of about `elements` values (whole samples, so the shape is honest; the batch is what makes
    it too large), built without a Python list of that many floats."""
    batch = max(1, -(-elements // model.sample_elements))
    count = batch * model.sample_elements
    head = json.dumps({"name": model.input, "datatype": model.datatype, "shape": [batch, *model.dims]})[:-1]
    return b'{"inputs":[' + head.encode() + b',"data":[' + b",".join([b"0.5"] * count) + b"]}]}"


_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})")


def parse_status(response: bytes) -> int | None:
    """The status code of an HTTP response's first line; None when there is no (complete) status line."""
    match = _STATUS_LINE.match(response)
    return int(match.group(1)) if match else None


def response_complete(response: bytes) -> bool:
    """True once the head and the Content-Length's worth of body have arrived."""
    head, sep, body = response.partition(b"\r\n\r\n")
    if not sep:
        return False
    match = re.search(rb"(?im)^content-length:\s*(\d+)", head)
    return match is None or len(body) >= int(match.group(1))


def error_text(response: bytes, limit: int = 160) -> str:
    """The server's words: the JSON "error" of a refusal; for an answer, how many of each output's values are
    finite (what NaN inputs turn into); else the body's start."""
    body = response.partition(b"\r\n\r\n")[2]
    try:
        answer = json.loads(body)  # Python's json, like tritonclient's rapidjson, reads Triton's bare NaN tokens
        if "outputs" in answer:
            message = "; ".join(
                f"{o['name']}: {np.isfinite(np.asarray(o['data'], dtype=np.float64)).sum()} of {len(o['data'])} finite"
                for o in answer["outputs"]
            )
        else:
            message = str(answer["error"])
    except (ValueError, KeyError, TypeError):
        message = body.decode(errors="replace")
        title = re.search(r"<title>(.*?)</title>", message, re.IGNORECASE | re.DOTALL)
        message = title.group(1) if title else message  # an ingress's HTML page
    message = re.sub(r"^\[request id: [^\]]*\] ", "", message)
    return message if len(message) <= limit else message[: limit - 1] + "…"


@dataclass(frozen=True)
class Answer:
    answer: str  # the status code ("400"), "closed", "timeout" (no answer within the case's timeout) or "refused"
    status: int | None
    seconds: float  # from the first byte sent to the answer (or to the timeout)
    detail: str = ""


def classify(response: bytes, closed: bool, timed_out: bool) -> str:
    """One word for what came back: the status code if one did, else whether the server closed or said nothing."""
    status = parse_status(response)
    if status is not None:
        return str(status)
    if timed_out:
        return "timeout"
    return "closed" if closed else "no answer"


def goal_met(expect: Expect, answer: Answer, limit: float = GOAL_SECONDS) -> bool:
    """Whether an answer meets its case's goal (see GOALS); a hold is judged by its own checks."""
    if answer.seconds > limit:
        return False
    if expect == "reject":
        return answer.answer == "closed" or (answer.status is not None and 400 <= answer.status < 500)
    if expect == "tolerate":
        return answer.status is not None and (answer.status == 200 or 400 <= answer.status < 500)
    raise ValueError(f"goal {expect!r} is not judged by its answer")


@dataclass(frozen=True)
class Probe:
    """Bytes to send: all at once, or (slow loris) one chunk every `interval` seconds; then wait for the answer
    with the socket open, as a stalled client does."""

    chunks: tuple[bytes, ...]
    interval: float = 0.0


@dataclass(frozen=True)
class Case:
    name: str
    sent: str  # what is sent, in words, for the report
    expect: Expect
    probe: Callable[[Model], Probe] | None  # None: a case with its own procedure (idle connections)


def _once(build: Callable[[Model], bytes]) -> Callable[[Model], Probe]:
    return lambda model: Probe((build(model),))


def _binary(model: Model, value: float) -> bytes:
    body, headers = binary_infer(model, np.full((1, *model.dims), value, dtype=np.float32))
    return http_request(model.infer_path(), body, content_type="application/octet-stream", headers=headers)


def _truncated(model: Model) -> bytes:
    array = np.zeros((1, *model.dims), dtype=np.float32)
    body, headers = binary_infer(model, array, declared_bytes=array.nbytes)
    cut = body[: len(body) - array.nbytes // 2]  # half the tensor's bytes missing, Content-Length honest
    return http_request(model.infer_path(), cut, content_type="application/octet-stream", headers=headers)


def _slow_loris(model: Model) -> Probe:
    request = http_request(model.infer_path(), json_infer(model))
    return Probe(tuple(request[i : i + 1] for i in range(len(request))), interval=SLOW_BYTE_INTERVAL_S)


def cases(json_elements: int = JSON_ELEMENTS, idle: int = IDLE_CONNECTIONS) -> list[Case]:
    """The hostile cases, in the order they are sent."""
    return [
        Case("wrong dtype", "JSON INT64 tensor for an FP32 input", "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, datatype="INT64", data=[0] * m.sample_elements))
                   )),
        Case("wrong shape", "JSON tensor with its dims transposed", "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, shape=[1, *reversed(m.dims)])))),
        Case("batch above max", "JSON batch of maxBatchSize + 1", "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, shape=[m.max_batch_size + 1, *m.dims])))),
        Case("NaN (binary)", "binary tensor of NaN", "tolerate", _once(lambda m: _binary(m, float("nan")))),
        Case("Inf (binary)", "binary tensor of +Inf", "tolerate", _once(lambda m: _binary(m, float("inf")))),
        Case("NaN (JSON token)", "JSON with bare NaN tokens (as Python's json writes them)", "tolerate",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, data=[float("nan")] * m.sample_elements)))),
        Case("NaN (JSON string)", 'JSON with "NaN" strings', "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, data=["NaN"] * m.sample_elements)))),
        Case("number out of range", "JSON with 1e400 (beyond a double)", "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m).replace(b"0.0", b"1e400", 1)))),
        Case("empty body", "POST infer, Content-Length: 0", "reject", _once(lambda m: http_request(m.infer_path()))),
        Case("truncated binary", "binary_data_size above the bytes sent", "reject", _once(_truncated)),
        Case("Content-Length above body", "Content-Length 100000, 6 bytes sent, socket kept open", "reject",
             _once(lambda m: http_request(m.infer_path(), b'{"inpu', content_length=100_000))),
        Case("2 GiB declared", "Content-Length 2147483648, 6 bytes sent, socket kept open", "reject",
             _once(lambda m: http_request(m.infer_path(), b'{"inpu', content_length=DECLARED_HUGE))),
        Case(f"JSON of {json_elements:.0e} elements", "one JSON tensor, batch far above max", "reject",
             _once(lambda m: http_request(m.infer_path(), large_json_infer(m, json_elements)))),
        Case("unknown model", "infer on a model not served", "reject",
             _once(lambda m: http_request(m.infer_path("no_such_model"), json_infer(m)))),
        Case("unknown version", "infer on version 7", "reject",
             _once(lambda m: http_request(m.infer_path(version="7"), json_infer(m)))),
        Case("unknown output", "asks for an output the model lacks", "reject",
             _once(lambda m: http_request(m.infer_path(), json_infer(m, outputs=["no_such_output"])))),
        Case("slow loris", f"a valid request's headers one byte every {SLOW_BYTE_INTERVAL_S:g} s", "reject",
             _slow_loris),
        Case(f"{idle} idle connections", "opened, held, then closed", "hold", None),
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------- the wire


def exchange(address: tuple[str, int], probe: Probe, timeout: float = CASE_TIMEOUT_S) -> Answer:
    """Send the probe's bytes and wait for an answer, the server closing, or `timeout` seconds from the first byte."""
    start = time.monotonic()
    deadline = start + timeout
    response = b""
    closed = False
    try:
        sock = socket.create_connection(address, timeout=timeout)
    except OSError as error:
        return Answer("refused", None, time.monotonic() - start, str(error))
    with sock:
        try:
            for index, chunk in enumerate(probe.chunks):
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                sock.sendall(chunk)
                if probe.interval and index < len(probe.chunks) - 1:
                    # Between the slow bytes, watch for the server answering or closing.
                    wait = min(probe.interval, deadline - time.monotonic())
                    if wait <= 0:
                        break
                    if readable([sock], wait):
                        break
            while time.monotonic() < deadline and not response_complete(response):
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    data = sock.recv(65536)
                except TimeoutError:
                    break
                if not data:
                    closed = True
                    break
                response += data
        except (BrokenPipeError, ConnectionResetError):
            closed = True
            with contextlib.suppress(OSError):  # an answer may have come before the close
                sock.settimeout(0.2)
                response += sock.recv(65536)
        except TimeoutError:
            pass
    seconds = time.monotonic() - start
    timed_out = not closed and not response_complete(response) and seconds >= timeout - 0.05
    word = classify(response, closed, timed_out)
    return Answer(word, parse_status(response), seconds, error_text(response) if response else "")


def read_model(url: str, model: str) -> Model:
    """The model's first input, batch limit and outputs from Triton's config endpoint."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/config", timeout=10) as response:
        config = json.loads(response.read())
    first = config["input"][0]
    return Model(
        name=model,
        input=first["name"],
        datatype=first["data_type"].removeprefix("TYPE_"),
        dims=tuple(int(d) for d in first["dims"]),
        max_batch_size=int(config.get("max_batch_size", 0)),
        outputs=tuple(o["name"] for o in config["output"]),
    )


# ------------------------------------------------------------------------------ background measurements


class Traffic:
    """Closed-loop valid callers (batch 1, binary tensors), one tritonclient per thread (it is not thread-safe);
    successes and errors are timestamped, so any window's goodput can be read afterwards."""

    def __init__(self, url: str, model: Model, callers: int = CALLERS):
        self.url, self.model, self.callers = url, model, callers
        self.successes: list[float] = []
        self.errors: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _call(self, seed: int) -> None:
        import tritonclient.http as httpclient

        client = httpclient.InferenceServerClient(self.url, connection_timeout=10, network_timeout=10)
        board = np.random.default_rng(seed).standard_normal((1, *self.model.dims)).astype(np.float32)
        tensor = httpclient.InferInput(self.model.input, list(board.shape), self.model.datatype)
        tensor.set_data_from_numpy(board, binary_data=True)
        try:
            while not self._stop.is_set():
                try:
                    client.infer(self.model.name, [tensor])
                    self.successes.append(time.monotonic())
                except Exception as error:
                    self.errors.append((time.monotonic(), f"{type(error).__name__}: {error}"[:200]))
                    time.sleep(0.05)
        finally:
            client.close()

    def start(self) -> Traffic:
        self._threads = [threading.Thread(target=self._call, args=(i,), daemon=True) for i in range(self.callers)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(15)

    def window(self, start: float, end: float) -> dict[str, Any]:
        done = sum(start <= t < end for t in self.successes)
        errors = [text for t, text in self.errors if start <= t < end]
        seconds = max(end - start, 1e-9)
        return {
            "seconds": round(seconds, 2),
            "requests": done,
            "goodput_per_s": done / seconds,
            "errors": len(errors),
            "first_error": errors[0] if errors else None,
        }


class Monitor:
    """Polls /v2/health/live and /ready and samples the server's memory (its cgroup, else the RSS of its process
    group from /proc) until stopped; failures are kept with their time."""

    def __init__(self, server: TritonServer):
        self.server = server
        self.checks = 0
        self.failures: list[dict[str, Any]] = []
        self.slowest = 0.0
        self.memory: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        cgroup = server.cgroup
        self.memory_source = f"cgroup v{cgroup.version}" if cgroup else "RSS of the server's process group (/proc)"

    def memory_now(self) -> int:
        if self.server.cgroup is not None:
            return self.server.cgroup.memory_current()
        assert self.server.process is not None
        return group_rss(self.server.process.pid)

    def sample(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.memory.append((time.monotonic(), self.memory_now()))

    def _run(self) -> None:
        while not self._stop.is_set():
            for endpoint in ("live", "ready"):
                start = time.monotonic()
                status = http_status(f"http://{self.server.url}/v2/health/{endpoint}")
                took = time.monotonic() - start
                self.checks += 1
                self.slowest = max(self.slowest, took)
                if status != 200:
                    self.failures.append(
                        {"at": start, "endpoint": endpoint, "status": status, "seconds": round(took, 3)}
                    )
            self.sample()
            self._stop.wait(HEALTH_INTERVAL_S)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def memory_peak(self, start: float = 0.0, end: float = float("inf")) -> int:
        return max((value for t, value in self.memory if start <= t <= end), default=0)

    def begin(self) -> float:
        """Start a measurement window: the cgroup's peak is reset, so it covers this window alone."""
        if self.server.cgroup is not None:
            with contextlib.suppress(OSError):
                self.server.cgroup.reset_peak()
        self.sample()
        return time.monotonic()

    def peak_since(self, start: float) -> int:
        """The window's peak: the kernel's (every byte charged, between samples too) with a cgroup, else the
        highest RSS sample."""
        self.sample()
        sampled = self.memory_peak(start)
        if self.server.cgroup is not None:
            with contextlib.suppress(OSError, ValueError):
                return max(sampled, self.server.cgroup.memory_peak())
        return sampled


def group_rss(pgid: int) -> int:
    """Resident bytes of every process in a process group (the server and its python backend stubs)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ...
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # rss in pages
    return total


@contextlib.contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """Run the drill's own threads (callers, probes) on `cpus`, off the server's, and restore afterwards."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def idle_connections(address: tuple[str, int], model: Model, count: int, hold: float) -> tuple[Answer, dict[str, Any]]:
    """Open `count` connections to `address` that send nothing, hold them, and check liveness, readiness and a
    valid request there meanwhile; the answer's time is that valid request's."""
    url = f"{address[0]}:{address[1]}"
    sockets: list[socket.socket] = []
    failures: list[str] = []
    try:
        for _ in range(count):
            try:
                sockets.append(socket.create_connection(address, timeout=CASE_TIMEOUT_S))
            except OSError as error:
                failures.append(str(error))
                if len(failures) > 20:
                    break
        live = http_status(f"http://{url}/v2/health/live")
        ready = http_status(f"http://{url}/v2/health/ready")
        valid = exchange(address, Probe((http_request(model.infer_path(), json_infer(model)),)))
        time.sleep(max(0.0, hold - valid.seconds))
        still = exchange(address, Probe((http_request(model.infer_path(), json_infer(model)),)))
        # Did the server close any idle connection while it was held?
        dropped = sum(1 for sock in readable(sockets, 0) if not _peek(sock))
    finally:
        for sock in sockets:
            sock.close()
    after = http_status(f"http://{url}/v2/health/ready")
    checks = {
        "opened": len(sockets),
        "open_failures": len(failures),
        "first_open_failure": failures[0] if failures else None,
        "closed_by_server": dropped,
        "live": live,
        "ready": ready,
        "valid_answer": valid.answer,
        "valid_after_hold": still.answer,
        "ready_after_close": after,
    }
    met = (
        len(sockets) == count and live == 200 and ready == 200 and valid.status == 200 and still.status == 200
        and after == 200 and valid.seconds <= GOAL_SECONDS
    )  # fmt: skip
    detail = f"{len(sockets)} open, {dropped} closed by the server; live {live}, ready {ready}, valid {valid.answer}"
    return Answer(f"held {len(sockets)}", valid.status, valid.seconds, detail), {"met": met, **checks}


def readable(sockets: list[socket.socket], wait: float) -> list[socket.socket]:
    """The sockets with data or a close to read, waiting up to `wait` seconds (poll: no 1024-descriptor limit)."""
    poller = select.poll()
    by_fd = {sock.fileno(): sock for sock in sockets}
    for fd in by_fd:
        poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
    return [by_fd[fd] for fd, _ in poller.poll(wait * 1000)]


def _peek(sock: socket.socket) -> bytes:
    try:
        return sock.recv(1, socket.MSG_PEEK)
    except OSError:
        return b""


# ------------------------------------------------------------------------------------------- an ingress


class Front(Protocol):
    """An ingress in front of the server: started for it, yielding the address callers use."""

    @property
    def describe(self) -> str: ...

    def __call__(self, server: TritonServer, work: Path) -> AbstractContextManager[tuple[str, int]]: ...


def nginx_config(
    listen_port: int,
    upstream_port: int,
    work: Path,
    max_body_bytes: int,
    body_timeout_s: float,
    header_timeout_s: float,
) -> str:
    """An nginx in front of Triton with the defences Triton lacks: a body size limit (413 before any byte reaches
    Triton), header and body timeouts (a stalled or slow client is cut off), and request buffering, so Triton
    only ever sees complete requests. The same settings are the ingress note of the report."""
    return f"""daemon off;
master_process off;
worker_processes 1;
worker_rlimit_nofile 16384;
pid {work}/nginx.pid;
error_log {work}/nginx-error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {work}/body;
    proxy_temp_path {work}/proxy;
    fastcgi_temp_path {work}/fastcgi;
    uwsgi_temp_path {work}/uwsgi;
    scgi_temp_path {work}/scgi;
    upstream triton {{ server 127.0.0.1:{upstream_port}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{listen_port} backlog=4096;
        client_max_body_size {max_body_bytes};
        client_body_buffer_size {max_body_bytes};
        client_body_timeout {round(body_timeout_s * 1000)}ms;
        client_header_timeout {round(header_timeout_s * 1000)}ms;
        keepalive_timeout 10s;
        location / {{
            proxy_pass http://triton;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_request_buffering on;
            proxy_read_timeout 30s;
        }}
    }}
}}
"""


@dataclass(frozen=True)
class NginxFront:
    """nginx (a binary given, e.g. Debian's `nginx` package unpacked) as the ingress, with `nginx_config`."""

    binary: Path
    max_body_bytes: int = 2**20
    body_timeout_s: float = 0.8  # under the goal's 1 s: nginx closes when it expires, a few ms later
    header_timeout_s: float = 0.8

    @property
    def describe(self) -> str:
        return (
            f"nginx: client_max_body_size {format_bytes(self.max_body_bytes)}, client_body_timeout "
            f"{self.body_timeout_s:g}s, client_header_timeout {self.header_timeout_s:g}s, request buffering"
        )

    @contextlib.contextmanager
    def __call__(self, server: TritonServer, work: Path) -> Iterator[tuple[str, int]]:
        port = free_port()
        folder = work / "nginx"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "nginx.conf"
        text = nginx_config(port, server.http_port, folder, self.max_body_bytes, self.body_timeout_s,
                            self.header_timeout_s)  # fmt: skip
        conf.write_text(text)
        process = subprocess.Popen(
            [str(self.binary), "-p", str(folder), "-c", str(conf), "-e", str(folder / "nginx-error.log")],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 10
            while http_status(f"http://127.0.0.1:{port}/v2/health/ready") != 200:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "nginx-error.log").read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"nginx did not start in front of tritonserver:\n{log}")
                time.sleep(0.1)
            yield ("127.0.0.1", port)
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --------------------------------------------------------------------------------------------- the drill


def default_limits() -> PodLimits | None:
    """A pod's limits for the server when cgroups are writable: 1 CPU on the last core, 1 GiB; None otherwise
    (the memory is then the RSS sampled from /proc)."""
    cpus = sorted(os.sched_getaffinity(0))
    if cgroup_unavailable_reason() is not None:
        return None
    return PodLimits(cpus=1.0, memory_bytes=2**30, cpuset=str(cpus[-1]) if len(cpus) > 1 else None)


def run_hostile_drill(
    repo: Path,
    out: Path,
    seconds: float = 20.0,
    quick: bool = False,
    *,
    model: str = "conv_net",
    limits: PodLimits | Literal["auto"] | None = "auto",
    extra_args: list[str] | None = None,
    case_timeout: float = CASE_TIMEOUT_S,
    front: Front | None = None,
) -> dict[str, Any]:
    """Serve `model` from `repo` (alone: the repository's other models would change the memory figures) with a
    real tritonserver, measure valid goodput alone for `seconds`, then send every hostile
    case while the same traffic runs; write hostile.json and hostile.md to `out` and return the result.
    `quick`: a tenth of the JSON tensor, a tenth of the idle connections, shorter holds (for a smoke run).
    `case_timeout`: how long the drill waits for each answer (a hung case costs this much).
    `front`: an ingress started in front of the server (see `nginx_front`); the valid traffic and the hostile
    cases then go through it, the health checks straight to the server as a kubelet's probes do."""
    out.mkdir(parents=True, exist_ok=True)
    pod = default_limits() if limits == "auto" else limits
    json_elements, idle, hold = (JSON_ELEMENTS // 10, IDLE_CONNECTIONS // 10, 1.0) if quick else (
        JSON_ELEMENTS, IDLE_CONNECTIONS, IDLE_HOLD_S)  # fmt: skip
    if not (repo / model / "config.pbtxt").is_file():
        raise FileNotFoundError(f"{repo / model}/config.pbtxt: `inferop export {model} --repo {repo}` makes one")
    alone = Path(tempfile.mkdtemp(prefix="inferop-hostile-"))
    shutil.copytree(repo / model, alone / model)
    server = TritonServer(alone, http_port=free_port(), limits=pod, extra_args=list(extra_args or []),
                          log_path=out / "hostile-tritonserver.log")  # fmt: skip
    server_cpus = pod.cpu_list() if pod is not None else None
    drill_cpus = (set(os.sched_getaffinity(0)) - server_cpus) if server_cpus else None
    rows: list[dict[str, Any]] = []
    windows: list[tuple[float, float]] = []  # each case's start and end, for the valid goodput meanwhile
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, alone, ignore_errors=True)
        stack.enter_context(server)
        stack.enter_context(pinned(drill_cpus))  # after the server started: it keeps its own CPUs
        address = stack.enter_context(front(server, out)) if front else ("127.0.0.1", server.http_port)
        entry = f"{address[0]}:{address[1]}"
        described = read_model(server.url, model)
        monitor = Monitor(server).start()
        time.sleep(1.0)
        idle_memory = monitor.memory_peak()
        traffic = Traffic(entry, described).start()
        try:
            time.sleep(min(2.0, seconds / 4))  # callers connect and the batcher warms up
            # Every request is built before anything is measured: 40 MB of JSON made during a case would take
            # the callers' CPU (and their interpreter's lock), and count against the server.
            planned = [(case, case.probe(described) if case.probe else None) for case in cases(json_elements, idle)]
            base_start = monitor.begin()
            time.sleep(seconds)
            baseline_peak = monitor.peak_since(base_start)
            base_end = hostile_start = time.monotonic()
            for case, probe in planned:
                started = monitor.begin()
                extra: dict[str, Any] = {}
                try:
                    if probe is None:
                        answer, extra = idle_connections(address, described, idle, hold)
                        met = bool(extra.pop("met"))
                    else:
                        answer = exchange(address, probe, case_timeout)
                        met = goal_met(case.expect, answer)
                except Exception as error:  # the drill's own failure: recorded, and the other cases still run
                    answer, met = Answer("drill error", None, time.monotonic() - started, repr(error)[:200]), False
                case_peak = monitor.peak_since(started)
                windows.append((started, time.monotonic()))
                rows.append({
                    "case": case.name, "sent": case.sent, "expect": case.expect, "goal": GOALS[case.expect],
                    **asdict(answer), "goal_met": met,
                    "memory_peak_bytes": case_peak,
                    "live_after": http_status(f"http://{server.url}/v2/health/live"), **extra,
                })  # fmt: skip
            # Valid traffic keeps running as long after the cases as it ran alone, to see it recover.
            hostile_end = time.monotonic()
            time.sleep(max(5.0, seconds / 2))
            recovery_end = time.monotonic()
        finally:
            traffic.stop()
            monitor.stop()
    for row, (start, end) in zip(rows, windows, strict=True):
        # A case answered in milliseconds has no goodput of its own to speak of: 0 or 2,000 req/s by chance.
        row["valid_goodput_per_s"] = traffic.window(start, end)["goodput_per_s"] if end - start >= 0.5 else None
    baseline = traffic.window(base_start, base_end)
    during = traffic.window(hostile_start, hostile_end)
    after = traffic.window(hostile_end, recovery_end)
    # Against valid traffic alone before and after the cases: on a shared machine one window alone can be off.
    without_cases = (baseline["goodput_per_s"] + after["goodput_per_s"]) / 2
    ratio = during["goodput_per_s"] / without_cases if without_cases else 0.0
    health_failures = [
        {**failure, "at": round(failure["at"] - base_start, 2)} for failure in monitor.failures
    ]  # fmt: skip
    result: dict[str, Any] = {
        "model": model,
        "limits": pod.describe() if pod is not None else "none (no writable cgroups)",
        "server_args": list(extra_args or []),
        "front": front.describe if front else "none: straight to tritonserver",
        "quick": quick,
        "case_timeout_s": case_timeout,
        "callers": CALLERS,
        "baseline": baseline,
        "during_cases": during,
        "after_cases": after,
        "goodput_ratio": ratio,
        "goodput_goal": GOODPUT_GOAL,
        "cases": rows,
        "health": {"checks": monitor.checks, "failures": health_failures, "slowest_s": round(monitor.slowest, 3)},
        "memory": {
            "source": monitor.memory_source,
            "idle_bytes": idle_memory,
            "baseline_peak_bytes": baseline_peak,
            "cases_peak_bytes": max((row["memory_peak_bytes"] for row in rows), default=0),
            "oom_kills": (server.usage or {}).get("oom_kills"),
        },
    }
    result["goals"] = {
        "cases_met": sum(row["goal_met"] for row in rows),
        "cases": len(rows),
        "goodput_met": ratio >= GOODPUT_GOAL,
        "health_met": not health_failures,
    }
    (out / "hostile.json").write_text(json.dumps(result, indent=2) + "\n")
    (out / "hostile.md").write_text(format_hostile(result))
    return result


# ------------------------------------------------------------------------------------------------ report


def _bytes(value: Any) -> str:
    return format_bytes(float(value)) if value else "-"


def format_hostile(result: dict[str, Any]) -> str:
    """A markdown section: the goals' summary, one table row per case, and what the background checks saw."""
    goals, memory, health = result["goals"], result["memory"], result["health"]
    base, during, after = result["baseline"], result["during_cases"], result["after_cases"]
    oom = "" if memory["oom_kills"] is None else f", {memory['oom_kills']} OOM kills"
    lines = [
        "Hostile requests:",
        "",
        f"`{result['model']}` served by tritonserver ({result['limits']}); in front: {result['front']}. "
        f"{result['callers']} closed-loop valid callers (batch 1) alone, then while each case is sent on its own "
        f"connection, then alone again. Goal per case: "
        f"{GOALS['reject']} (NaN/Inf: {GOALS['tolerate']}); goodput during the cases ≥ {GOODPUT_GOAL:g} of alone; "
        f"live and ready throughout.",
        "",
        f"- cases meeting their goal: {goals['cases_met']} of {goals['cases']}",
        f"- goodput: {base['goodput_per_s']:.1f} req/s alone before ({base['seconds']:g} s), "
        f"{during['goodput_per_s']:.1f} during the cases ({during['seconds']:g} s, {during['errors']} errors), "
        f"{after['goodput_per_s']:.1f} alone after ({after['seconds']:g} s): ratio to alone "
        f"{result['goodput_ratio']:.2f} ({'met' if goals['goodput_met'] else 'NOT met'})",
        f"- health: {health['checks']} checks of live and ready, {len(health['failures'])} failed, slowest "
        f"{health['slowest_s']:.3f} s",
        f"- server memory ({memory['source']}): idle {_bytes(memory['idle_bytes'])}, peak under valid traffic "
        f"{_bytes(memory['baseline_peak_bytes'])}, highest peak of a case {_bytes(memory['cases_peak_bytes'])}"
        f"{oom}",
        "",
        "| case | sent | answer | time | server peak memory | valid req/s meanwhile | goal | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in result["cases"]:
        answer = row["answer"] + (f": {row['detail']}" if row["detail"] else "")
        answer = answer.replace("|", "\\|").replace("\n", " ")
        goodput = "-" if row["valid_goodput_per_s"] is None else f"{row['valid_goodput_per_s']:.0f}"
        lines.append(
            f"| {row['case']} | {row['sent']} | {answer} | {row['seconds']:.3f} s | {_bytes(row['memory_peak_bytes'])} "
            f"| {goodput} | {row['goal']} | {'yes' if row['goal_met'] else '**no**'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inferop_devtools.drills.hostile", description=__doc__)
    parser.add_argument("--repo", type=Path, required=True, help="model repository holding the model")
    parser.add_argument("--out", type=Path, default=Path("out/drills"), help="where hostile.json and .md go")
    parser.add_argument("--model", default="conv_net")
    parser.add_argument("--seconds", type=float, default=20.0, help="seconds of valid traffic alone (baseline)")
    parser.add_argument("--quick", action="store_true", help="smaller JSON tensor, fewer idle connections")
    parser.add_argument("--no-limits", action="store_true", help="no cgroup: memory as RSS from /proc")
    parser.add_argument("--server-arg", action="append", default=[], help="an extra tritonserver flag; repeat")
    parser.add_argument("--nginx", type=Path, help="an nginx binary: send everything through it as the ingress")
    parser.add_argument("--max-body", type=int, default=2**20, help="the ingress's body limit in bytes (1 MiB)")
    args = parser.parse_args(argv)
    if not (args.repo / args.model / "config.pbtxt").is_file():
        print(f"error: {args.repo}/{args.model} has no config.pbtxt: `inferop export conv_net --repo {args.repo}` "
              "makes one", file=sys.stderr)  # fmt: skip
        return 2
    limits: PodLimits | Literal["auto"] | None = None if args.no_limits else "auto"
    result = run_hostile_drill(args.repo, args.out, args.seconds, args.quick, model=args.model, limits=limits,
                               extra_args=args.server_arg,
                               front=NginxFront(args.nginx, args.max_body) if args.nginx else None)  # fmt: skip
    print(format_hostile(result))
    goals = result["goals"]
    return 0 if goals["cases_met"] == goals["cases"] and goals["goodput_met"] and goals["health_met"] else 1


if __name__ == "__main__":
    sys.exit(main())

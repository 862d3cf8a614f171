"""Open-loop load: requests offered at a fixed or Poisson rate, whatever the server does with them.

Closed-loop callers (`inferop bench --concurrency`) wait for each answer, so they never offer more than the
server takes and an overload never shows. Here every arrival is sent at its scheduled time from one asyncio
loop, as independent users would send them, so a slow or full server shows what it does to them: queueing,
rejections (503), queue timeouts, and callers without a timeout left waiting.

The request body (V2 protocol with binary tensor data) is encoded once and posted as it is, so one core
offers thousands of small requests per second, or tens of 1 MB images, and keeps thousands in flight. Several
bodies (an image pipeline's files) are encoded once each and sent in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

Kind = Literal["ok", "rejected", "timed_out", "client_timeout", "failed", "unfinished"]
KINDS: tuple[Kind, ...] = ("ok", "rejected", "timed_out", "client_timeout", "failed", "unfinished")
Process = Literal["poisson", "fixed"]

# One asyncio loop posting pre-encoded bodies manages a few thousand requests a second on one core; above
# this the generator, not the server, would set the rate.
MAX_RATE = 5000.0
# Generator lateness p99 above this means the offered rate was not the asked one.
LATE_WARNING_MS = 50.0
MEMORY_INTERVAL_S = 0.25
# The first arrival is this far after the loop starts, so setting up the session does not make it late.
LEAD_S = 0.05

# Triton 2.51 over HTTP, both with status 503 (observed against the real server):
# a full queue answers at once with {"error":"[request id: <id_unknown>] Exceeds maximum queue size"};
# the queue policy's timeout answers {"error":"Request timeout expired"}.
QUEUE_FULL = "Exceeds maximum queue size"
QUEUE_TIMEOUT = "Request timeout expired"
# Envoy refusing for a full backend (a gateway's circuit breaker, sized from the queue bound): 503 with this body.
GATEWAY_FULL = "reset reason: overflow"


def arrival_times(rate: float, seconds: float, process: Process = "poisson", seed: int = 0) -> np.ndarray:
    """Arrival offsets in seconds within [0, seconds): evenly spaced, or a seeded Poisson process
    (exponential gaps), the arrivals of many independent users."""
    if not rate > 0 or not seconds > 0:
        raise ValueError(f"rate and seconds must be positive, got rate {rate}, seconds {seconds}")
    if process == "fixed":
        times = np.arange(math.ceil(rate * seconds)) / rate
        return times[times < seconds]
    if process != "poisson":
        raise ValueError(f"process {process!r}: expected 'poisson' or 'fixed'")
    rng = np.random.default_rng(seed)
    expected = rate * seconds
    gaps = rng.exponential(1 / rate, size=int(expected + 6 * math.sqrt(expected) + 16))
    while gaps.sum() < seconds:  # rare: draw more gaps from the same stream
        gaps = np.concatenate([gaps, rng.exponential(1 / rate, size=len(gaps))])
    times = np.cumsum(gaps)
    return times[times < seconds]


def classify(status: int, message: str) -> Kind:
    """What a non-200 answer from Triton, or from a gateway in front of it, means for the caller."""
    if status == 503 and (QUEUE_FULL in message or GATEWAY_FULL in message):
        return "rejected"
    if status == 503 and QUEUE_TIMEOUT in message:
        return "timed_out"
    return "failed"


@dataclass(frozen=True)
class Outcome:
    """One request. Latency counts from the scheduled arrival, as a user would: a late send is part of it."""

    sent_at: float  # seconds from the start (scheduled arrival time)
    started_late_ms: float  # how late it was actually sent against the schedule (generator health)
    latency_s: float  # until the answer, the error, or the end of the run (unfinished)
    kind: Kind

    @property
    def finished_at(self) -> float:
        return self.sent_at + self.latency_s


@dataclass(frozen=True)
class OpenLoopResult:
    model: str
    rate: float  # offered requests per second
    seconds: float  # offered duration
    process: str
    batch: int  # samples per request
    timeout: float | None  # the caller's timeout in seconds; None: callers wait for ever
    sent: int
    ok: int
    rejected: int
    timed_out: int
    client_timeout: int
    failed: int
    unfinished: int
    goodput: float  # samples per second answered successfully within the run window
    latency_ms: dict[str, float]  # p50/p90/p99/max of successes; empty when none
    # p50/p99/max time from the send to a rejection (full queue or gateway): how fast the server refuses, without
    # the generator's own lateness (late_ms_p99, reported apart)
    reject_ms: dict[str, float]
    server_timeout_ms: dict[str, float]  # p50/p99/max time to a queue-timeout answer
    late_ms_p99: float  # generator lateness p99
    timeline: list[dict[str, Any]]  # per second of the run and its drain
    memory: list[tuple[float, int]]  # (seconds from the start, bytes) from the memory probe
    first_errors: dict[str, str]  # kind -> first message of that kind
    request_bytes: float = 0.0  # mean request body of those sent in turn: the V2 header and the tensors
    started_at: float = 0.0  # time.monotonic() of arrival 0, to line outcomes up with other events
    outcomes: tuple[Outcome, ...] = ()  # every request, in order of arrival (not in as_dict: a drill picks)

    def warnings(self) -> list[str]:
        if self.late_ms_p99 > LATE_WARNING_MS:
            return [
                f"generator lateness p99 {self.late_ms_p99:.0f} ms > {LATE_WARNING_MS:.0f} ms: the generator could "
                "not keep the rate, so less than the stated load was offered (give it its own CPUs)"
            ]
        return []

    def as_dict(self) -> dict[str, Any]:
        fields = {name: value for name, value in asdict(self).items() if name != "outcomes"}
        return {**fields, "memory": [list(sample) for sample in self.memory], "warnings": self.warnings()}

    def in_flight_at(self, moment: float) -> list[Outcome]:
        """The requests sent before `moment` (time.monotonic()) and not answered by then."""
        at = moment - self.started_at
        return [o for o in self.outcomes if o.sent_at <= at < o.finished_at]


def _quantiles(values: list[float], names: tuple[str, ...]) -> dict[str, float]:
    """Named percentiles in milliseconds of seconds `values` ("max" included); empty when there are none."""
    if not values:
        return {}
    points = [100.0 if name == "max" else float(name[1:]) for name in names]
    return {
        name: round(float(v), 3) for name, v in zip(names, np.percentile(np.asarray(values) * 1e3, points), strict=True)
    }


def summarise(
    outcomes: list[Outcome],
    memory: list[tuple[float, int]],
    first_errors: dict[str, str],
    *,
    model: str,
    rate: float,
    seconds: float,
    process: str,
    batch: int,
    timeout: float | None,
    request_bytes: float = 0.0,
    started_at: float = 0.0,
) -> OpenLoopResult:
    """Counts, percentiles and the per-second timeline of one run's outcomes."""
    by_kind: dict[str, list[Outcome]] = {kind: [] for kind in KINDS}
    for outcome in outcomes:
        by_kind[outcome.kind].append(outcome)
    in_window = sum(1 for o in by_kind["ok"] if o.finished_at <= seconds)
    late = [o.started_late_ms for o in outcomes]
    end = max([seconds, *(o.finished_at for o in outcomes), *(t for t, _ in memory)])
    timeline: list[dict[str, Any]] = [
        {"t": second, "offered": 0, **dict.fromkeys(KINDS, 0)} for second in range(math.ceil(end) or 1)
    ]
    answered: list[list[float]] = [[] for _ in timeline]
    for outcome in outcomes:
        timeline[int(outcome.sent_at)]["offered"] += 1
        second = min(int(outcome.finished_at), len(timeline) - 1)
        timeline[second][outcome.kind] += 1
        if outcome.kind == "ok":
            answered[second].append(outcome.latency_s)
    for row, latencies in zip(timeline, answered, strict=True):
        row["p99_ms"] = round(float(np.percentile(latencies, 99)) * 1e3, 3) if latencies else None
    if memory:
        for row in timeline:
            row["memory"] = None
        for t, used in memory:
            row = timeline[min(int(t), len(timeline) - 1)]
            row["memory"] = max(used, row["memory"] or 0)
    return OpenLoopResult(
        model=model,
        rate=rate,
        seconds=seconds,
        process=process,
        batch=batch,
        timeout=timeout,
        sent=len(outcomes),
        ok=len(by_kind["ok"]),
        rejected=len(by_kind["rejected"]),
        timed_out=len(by_kind["timed_out"]),
        client_timeout=len(by_kind["client_timeout"]),
        failed=len(by_kind["failed"]),
        unfinished=len(by_kind["unfinished"]),
        goodput=in_window * batch / seconds,
        latency_ms=_quantiles([o.latency_s for o in by_kind["ok"]], ("p50", "p90", "p99", "max")),
        reject_ms=_quantiles(
            [o.latency_s - o.started_late_ms / 1e3 for o in by_kind["rejected"]], ("p50", "p99", "max")
        ),
        server_timeout_ms=_quantiles([o.latency_s for o in by_kind["timed_out"]], ("p50", "p99", "max")),
        late_ms_p99=round(float(np.percentile(late, 99)), 3) if late else 0.0,
        timeline=timeline,
        memory=memory,
        first_errors=first_errors,
        request_bytes=request_bytes,
        started_at=started_at,
        outcomes=tuple(outcomes),
    )


def cgroup_memory_probe(path: Path) -> Callable[[], int]:
    """Bytes charged to a cgroup: `memory.current` (v2) or `memory.usage_in_bytes` (v1 memory hierarchy),
    the figure the kernel compares with the limit; it includes the page cache the server touches."""
    for name in ("memory.current", "memory.usage_in_bytes"):
        file = path / name
        if file.is_file():
            int(file.read_text())  # readable and a number, or fail now rather than in the middle of a run

            def probe(file: Path = file) -> int:
                return int(file.read_text())

            return probe
    raise ValueError(f"{path} has neither memory.current (cgroup v2) nor memory.usage_in_bytes (cgroup v1)")


@contextlib.contextmanager
def generator_process(client_cpus: set[int] | None) -> Iterator[None]:
    """Room for thousands of open sockets, and the generator on its own CPUs for the run.

    An overloaded server without a queue bound holds every request open, one socket each, beyond the usual
    soft limit of 1,024 files. On the server's CPUs the generator would take cycles from the model, and a
    busy server would delay its sends exactly when the load matters; a real client runs elsewhere.
    Affinity is set for this thread, where the loop runs, and any threads it starts, and restored afterwards;
    the file limit stays raised (harmless, and sockets of the run may still be closing).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    previous = os.sched_getaffinity(0)
    if client_cpus:
        os.sched_setaffinity(0, client_cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, previous)


def encode_request(inputs: Mapping[str, np.ndarray], outputs: list[str]) -> tuple[bytes, dict[str, str]]:
    """The V2 inference request with binary tensor data, encoded once and reused for every arrival."""
    import tritonclient.http.aio as httpclient
    from tritonclient.utils import np_to_triton_dtype

    tensors = []
    for name, data in inputs.items():
        tensor = httpclient.InferInput(name, list(data.shape), np_to_triton_dtype(data.dtype))
        tensor.set_data_from_numpy(data, binary_data=True)
        tensors.append(tensor)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    body, json_size = httpclient.InferenceServerClient.generate_request_body(tensors, outputs=wanted)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(json_size)}
    return body, headers


async def _offer(
    endpoint: str,
    requests: Sequence[tuple[bytes, dict[str, str]]],
    times: np.ndarray,
    timeout: float | None,
    seconds: float,
    drain: float,
    memory_probe: Callable[[], int] | None,
) -> tuple[list[Outcome], list[tuple[float, int]], dict[str, str], float]:
    import aiohttp

    loop = asyncio.get_running_loop()
    outcomes: list[Outcome] = []
    first_errors: dict[str, str] = {}
    memory: list[tuple[float, int]] = []
    in_flight: set[asyncio.Task[None]] = set()
    per_request = aiohttp.ClientTimeout(total=timeout)

    def record(scheduled: float, late_s: float, kind: Kind, message: str | None = None) -> None:
        outcomes.append(Outcome(scheduled, round(late_s * 1e3, 3), loop.time() - start - scheduled, kind))
        if message is not None:
            first_errors.setdefault(kind, message[:300])

    async def send(session: aiohttp.ClientSession, scheduled: float, body: bytes, headers: dict[str, str]) -> None:
        late_s = loop.time() - start - scheduled
        try:
            async with session.post(endpoint, data=body, headers=headers, timeout=per_request) as response:
                answer = await response.read()
        except asyncio.CancelledError:  # the run ended with this caller still waiting
            record(scheduled, late_s, "unfinished")
            raise
        except asyncio.TimeoutError:  # aiohttp's; the builtin one only from Python 3.11
            record(scheduled, late_s, "client_timeout", f"no answer within the client timeout ({timeout} s)")
        except Exception as error:  # refused connection, reset, anything else: counted, never lost
            record(scheduled, late_s, "failed", f"{type(error).__name__}: {error}")
        else:
            if response.status == 200:
                record(scheduled, late_s, "ok")
            else:
                message = answer.decode(errors="replace")
                record(scheduled, late_s, classify(response.status, message), f"{response.status} {message}")

    async def sample_memory(probe: Callable[[], int]) -> None:
        while True:
            memory.append((round(loop.time() - start, 3), probe()))
            await asyncio.sleep(MEMORY_INTERVAL_S)

    # No pool cap: an overloaded server holds thousands of requests, and a cap would turn them into waits
    # inside the client, a closed loop again.
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = loop.time() + LEAD_S
        sampler = loop.create_task(sample_memory(memory_probe)) if memory_probe else None
        for index, scheduled in enumerate(times.tolist()):
            delay = start + scheduled - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = loop.create_task(send(session, scheduled, *requests[index % len(requests)]))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        # With a timeout every request ends by itself; `drain` is the grace after the last possible answer.
        deadline = start + seconds + (timeout or 0.0) + drain
        if in_flight:
            await asyncio.wait(set(in_flight), timeout=max(0.0, deadline - loop.time()))
        waiting = set(in_flight)
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
        if sampler is not None:
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
    outcomes.sort(key=lambda o: o.sent_at)
    return outcomes, memory, first_errors, start  # the loop's clock is time.monotonic()


def run_open_loop(
    url: str,
    model: str,
    data: np.ndarray | Mapping[str, np.ndarray] | Sequence[Mapping[str, np.ndarray]],
    rate: float,
    seconds: float,
    *,
    timeout: float | None,
    process: Process = "poisson",
    seed: int = 0,
    memory_probe: Callable[[], int] | None = None,
    drain: float = 5.0,
    input_name: str | None = None,
    outputs: list[str] | None = None,
    client_cpus: set[int] | None = None,
) -> OpenLoopResult:
    """Offer `rate` requests/s of `data` (one request's input, batch axis included; or every input by name, for
    a model with several; or several requests' inputs by name, sent in turn) for `seconds`.

    `timeout=None` is a caller that waits for ever: requests still waiting `drain` seconds after the last
    arrival are cancelled and counted `unfinished`. The input and output names are read from the server
    when not given. Blocks; runs its own event loop.
    """
    if not 0 < rate <= MAX_RATE:
        raise ValueError(f"rate {rate}: expected more than 0 and at most {MAX_RATE:g} requests/s")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"timeout {timeout}: expected a positive number of seconds, or None for no timeout")
    named = not isinstance(data, np.ndarray)
    if (input_name is None and not named) or outputs is None:
        from inferop.client import connect, describe

        client = connect(url, 30.0)
        try:
            info = describe(client, model)
        finally:
            client.close()
        input_name, outputs = input_name or info.input_name, outputs or info.outputs
    if isinstance(data, np.ndarray):
        requests = [{str(input_name): data}]
    else:
        requests = [dict(data)] if isinstance(data, Mapping) else [dict(inputs) for inputs in data]
    times = arrival_times(rate, seconds, process, seed)
    encoded = [encode_request(inputs, outputs) for inputs in requests]
    endpoint = f"http://{url}/v2/models/{model}/infer"
    with generator_process(client_cpus):
        outcomes, memory, first_errors, started_at = asyncio.run(
            _offer(endpoint, encoded, times, timeout, seconds, drain, memory_probe)
        )
    return summarise(
        outcomes,
        memory,
        first_errors,
        model=model,
        rate=rate,
        seconds=seconds,
        process=process,
        batch=len(next(iter(requests[0].values()))),
        timeout=timeout,
        request_bytes=sum(len(body) for body, _ in encoded) / len(encoded),
        started_at=started_at,
    )


def format_table(result: OpenLoopResult) -> str:
    def ms(values: dict[str, float], key: str) -> str:
        return f"{values[key]:.1f}" if key in values else "-"

    timeout = f"{result.timeout:g} s" if result.timeout is not None else "none"
    rows = [
        f"{result.model}: open loop, {result.process} arrivals, batch {result.batch} per request, "
        f"client timeout {timeout}",
        f"  offered            {result.rate:g} req/s for {result.seconds:g} s ({result.sent} sent)",
        f"  request body       {result.request_bytes:,.0f} bytes (mean)",
        f"  goodput            {result.goodput:.1f} samples/s ({result.ok} ok)",
        f"  rejected           {result.rejected} (queue full)",
        f"  timed out          {result.timed_out} (server queue timeout)",
        f"  client timeouts    {result.client_timeout}",
        f"  failed             {result.failed}",
        f"  unfinished         {result.unfinished}",
        f"  success p50/p99    {ms(result.latency_ms, 'p50')} / {ms(result.latency_ms, 'p99')} ms",
        f"  time-to-reject p99 {ms(result.reject_ms, 'p99')} ms (from the send)",
        f"  generator late p99 {result.late_ms_p99:.1f} ms",
    ]
    rows += [f"  first {kind}: {message}" for kind, message in result.first_errors.items()]
    return "\n".join(rows)


def plot(result: OpenLoopResult, path: Path) -> None:
    """Requests per second (offered, answered, refused) from zero, success p99 on a second axis, and the
    server's memory below when it was sampled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.timeline
    t = [row["t"] + 0.5 for row in rows]
    panels = 2 if result.memory else 1
    figure, axes = plt.subplots(panels, 1, figsize=(8, 3.4 * panels), sharex=True, squeeze=False)
    rate_axis = axes[0][0]
    rate_axis.plot(t, [row["offered"] for row in rows], marker=".", label="offered /s")
    rate_axis.plot(t, [row["ok"] for row in rows], marker=".", label="goodput (ok /s)")
    rate_axis.plot(t, [row["rejected"] + row["timed_out"] for row in rows], marker=".", label="rejected /s")
    rate_axis.plot(t, [row["client_timeout"] for row in rows], marker=".", label="client timeouts /s")
    rate_axis.set_ylim(bottom=0)
    rate_axis.set_ylabel("requests / s")
    latency_axis = rate_axis.twinx()
    latency_axis.plot(
        t, [row["p99_ms"] if row["p99_ms"] is not None else np.nan for row in rows], color="black", label="p99 ms"
    )
    latency_axis.set_ylim(bottom=0)
    latency_axis.set_ylabel("success latency p99 (ms)")
    handles = rate_axis.get_legend_handles_labels()[0] + latency_axis.get_legend_handles_labels()[0]
    rate_axis.legend(handles=handles, loc="upper left", fontsize="small")
    rate_axis.axvline(result.seconds, color="grey", linestyle=":")
    rate_axis.set_title(f"{result.model}: {result.rate:g} req/s offered ({result.process}) for {result.seconds:g} s")
    if result.memory:
        memory_axis = axes[1][0]
        memory_axis.plot([s for s, _ in result.memory], [b / 2**20 for _, b in result.memory], color="purple")
        memory_axis.set_ylim(bottom=0)
        memory_axis.set_ylabel("server memory (MiB)")
    axes[-1][0].set_xlabel("seconds from the start")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

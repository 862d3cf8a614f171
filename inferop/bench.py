"""`inferop bench`: latency and throughput of a Triton model against concurrency, or under offered load.

Each level runs `concurrency` closed-loop callers for a fixed time with binary tensors and reports what a
caller sees (throughput, latency percentiles, requests a full queue rejected, errors) beside what Triton saw
(queue and compute time per request, and the batch size the dynamic batcher formed), from the differences of
Triton's statistics.
Closed-loop callers wait for answers and so never overload the server; `--rate` offers load open-loop
instead (`inferop.openloop`): requests at a fixed or Poisson rate, whatever the server does with them.
Requests carry generated tensors, or for an image pipeline the JPEG and PNG files of `--images DIR` as they are, in
turn; either way the report gives the mean request body, so the bytes a request costs compare between the two.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferop.client import (
    InferError,
    ModelInfo,
    TensorInfo,
    call,
    connect,
    describe,
    encoded_images,
    image_bytes,
    sample_inputs,
)
from inferop.limits import describe_usage, parse_cpu_list, read_pod_usage
from inferop.openloop import MAX_RATE, classify

if TYPE_CHECKING:
    from matplotlib.figure import Figure

Inputs = list[tuple[TensorInfo, np.ndarray]]  # one request's tensors


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    rejected: int  # answered at once by a full queue: the queue bound at work, by design
    errors: int  # every other failure
    seconds: float
    throughput: float  # samples per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    queue_ms: float  # Triton's mean queue time per request
    compute_ms: float  # Triton's mean compute time per request
    mean_batch: float  # samples per model execution
    client_cpu_ms: float = 0.0  # this client's CPU per request: what it adds to a shared machine
    first_error: str | None = None
    request_bytes: float = 0.0  # mean request body: the V2 header and the tensors (or the image files) it carries


def percentiles(latencies: list[float]) -> tuple[float, float, float]:
    if not latencies:
        return (float("nan"),) * 3
    p50, p90, p99 = np.percentile(np.asarray(latencies) * 1e3, [50, 90, 99])
    return float(p50), float(p90), float(p99)


def statistics_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Per-request queue/compute milliseconds and mean batch from two `get_inference_statistics` answers.

    Counters are cumulative (warm-up included), so only differences describe this run.
    """

    def totals(stats: dict[str, Any]) -> dict[str, float]:
        model = stats["model_stats"][0]
        inference = model["inference_stats"]
        return {
            "success": float(inference["success"]["count"]),
            "queue_ns": float(inference["queue"]["ns"]),
            "compute_ns": float(
                inference["compute_input"]["ns"] + inference["compute_infer"]["ns"] + inference["compute_output"]["ns"]
            ),
            "inferences": float(model["inference_count"]),
            "executions": float(model["execution_count"]),
        }

    a, b = totals(before), totals(after)
    requests = b["success"] - a["success"]
    executions = b["executions"] - a["executions"]
    return {
        "requests": requests,
        "queue_ms": (b["queue_ns"] - a["queue_ns"]) / requests / 1e6 if requests else 0.0,
        "compute_ms": (b["compute_ns"] - a["compute_ns"]) / requests / 1e6 if requests else 0.0,
        "mean_batch": (b["inferences"] - a["inferences"]) / executions if executions else 0.0,
    }


def bench_requests(info: ModelInfo, images: Sequence[Path], batch: int) -> list[Inputs]:
    """What the callers send in turn: generated tensors, or for an image pipeline the bytes of the `images` files (read
    once), `batch` a request, in the files' order and wrapping around until every file is in them equally often."""
    from inferop_core.tritonconfig import IMAGE_INPUT

    if not images:
        if info.image_pipeline:
            raise InferError(f"model {info.name!r} is an image pipeline: give it JPEG or PNG files with --images DIR")
        return [sample_inputs(info, batch)]
    if not info.image_pipeline:
        raise InferError(
            f"--images: model {info.name!r} is not an image pipeline (an ensemble taking encoded images as "
            f"{IMAGE_INPUT}); it takes {[(t.name, t.datatype) for t in info.inputs]}: leave --images out for tensors"
        )
    files = [image_bytes(path) for path in images]
    per_request = batch if info.batched else 1
    cycle = [files[i % len(files)] for i in range(math.lcm(len(files), per_request))]
    return [
        [(info.inputs[0], encoded_images(info, cycle[start : start + per_request]))]
        for start in range(0, len(cycle), per_request)
    ]


def run_level(url: str, info: ModelInfo, data: Inputs, concurrency: int, seconds: float, timeout: float) -> LevelResult:
    """`run_requests` with one request, `data`, sent over and over."""
    return run_requests(url, info, [data], concurrency, seconds, timeout)


def run_requests(
    url: str, info: ModelInfo, requests: Sequence[Inputs], concurrency: int, seconds: float, timeout: float
) -> LevelResult:
    """`concurrency` callers, each with its own connection, sending `requests` in turn back to back until time is up.

    The callers share one event loop that posts pre-encoded requests (`Exchange`): a caller that costs
    little CPU per request is timed by the server's answers, not by its own wait for a CPU. Threads of
    tritonclient cost about five times as much each and queue for the interpreter's lock, which stretched the
    median and hid the dynamic batcher's 500 ms stalls that NVIDIA's perf_analyzer shows (issue 43's runs).
    """
    samples = len(requests[0][0][1]) if info.batched else 1
    exchange = Exchange.for_model(url, info, requests)
    admin = connect(url, timeout)
    before = call(admin.get_inference_statistics, info.name, what="statistics")
    began_cpu = time.process_time()
    callers, elapsed = asyncio.run(exchange.closed_loop(concurrency, seconds, timeout))
    cpu = time.process_time() - began_cpu
    after = call(admin.get_inference_statistics, info.name, what="statistics")
    admin.close()  # an open connection holds up the server's shutdown
    flat = [x for caller in callers for x in caller.latencies]
    failures = [e for caller in callers for e in caller.errors]
    delta = statistics_delta(before, after)
    p50, p90, p99 = percentiles(flat)
    answered = len(flat) + sum(caller.rejected for caller in callers) + len(failures)
    return LevelResult(
        concurrency=concurrency,
        requests=len(flat),
        rejected=sum(caller.rejected for caller in callers),
        errors=len(failures),
        seconds=round(elapsed, 3),
        throughput=len(flat) * samples / elapsed,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        queue_ms=delta["queue_ms"],
        compute_ms=delta["compute_ms"],
        mean_batch=delta["mean_batch"],
        client_cpu_ms=cpu * 1e3 / answered if answered else 0.0,
        first_error=failures[0] if failures else None,
        request_bytes=exchange.request_bytes,
    )


@dataclass
class Caller:
    """What one closed-loop caller saw."""

    latencies: list[float] = field(default_factory=list)  # seconds, successful answers
    rejected: int = 0
    errors: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Exchange:
    """V2 inference requests with binary tensors, each encoded once as the bytes of an HTTP/1.1 POST and sent in
    turn, and the least work that reads an answer: the status line, the length, the body (kept only when it is an
    error)."""

    host: str
    port: int
    requests: tuple[bytes, ...]
    request_bytes: float  # the mean body, without the HTTP head

    @classmethod
    def for_model(cls, url: str, info: ModelInfo, requests: Sequence[Inputs]) -> Exchange:
        from inferop.openloop import encode_request

        host, _, port = url.rpartition(":")
        if not host or not port.isdigit():
            raise InferError(f"--url {url!r}: expected host:port, like 127.0.0.1:8000")
        posts, sizes = [], []
        for data in requests:
            body, headers = encode_request({tensor.name: array for tensor, array in data}, info.outputs)
            head = [f"POST /v2/models/{info.name}/infer HTTP/1.1", f"Host: {url}", f"Content-Length: {len(body)}"]
            head += [f"{name}: {value}" for name, value in headers.items()]
            posts.append(("\r\n".join(head) + "\r\n\r\n").encode() + body)
            sizes.append(len(body))
        return cls(host, int(port), tuple(posts), sum(sizes) / len(sizes))

    async def closed_loop(
        self, concurrency: int, seconds: float, timeout: float, turns: Iterator[bytes] | None = None
    ) -> tuple[list[Caller], float]:
        """Every caller sends, waits for the answer and sends again until `seconds` have passed; returns what
        each saw and the seconds from the first send to the last answer. `turns`: the requests in the order they are
        sent, shared by the callers (by default `requests` over and over); a caller's own work before each request,
        such as decoding the image it sends, is done where it yields the next."""
        loop = asyncio.get_running_loop()
        callers = [Caller() for _ in range(concurrency)]
        connections = [await self.connect(timeout) for _ in range(concurrency)]
        turns = turns or itertools.cycle(self.requests)  # shared: the callers take the next request in turn
        began = loop.time()
        stop_at = began + seconds
        await asyncio.gather(
            *(
                self.call_until(stop_at, timeout, c, connection, turns)
                for c, connection in zip(callers, connections, strict=True)
            )
        )
        return callers, loop.time() - began

    async def connect(self, timeout: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | OSError:
        try:
            return await asyncio.wait_for(asyncio.open_connection(self.host, self.port), timeout)
        except (OSError, asyncio.TimeoutError) as error:
            return OSError(f"cannot connect to {self.host}:{self.port}: {error or type(error).__name__}")

    async def call_until(
        self,
        stop_at: float,
        timeout: float,
        caller: Caller,
        connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | OSError,
        turns: Iterator[bytes],
    ) -> None:
        loop = asyncio.get_running_loop()
        while loop.time() < stop_at:
            if isinstance(connection, OSError):
                caller.errors.append(str(connection)[:200])
                return
            reader, writer = connection
            begin = time.perf_counter()
            try:
                async with asyncio.timeout(timeout):
                    writer.write(next(turns))
                    status, body = await read_answer(reader)
            except (
                OSError,
                EOFError,
                ValueError,
                TimeoutError,
                asyncio.LimitOverrunError,
            ) as error:  # counted, then a new connection
                said = f"no answer within {timeout:g} s" if isinstance(error, TimeoutError) else str(error)
                caller.errors.append(f"{type(error).__name__}: {said}"[:200])
                writer.close()
                connection = await self.connect(timeout)
                continue
            if status == 200:
                caller.latencies.append(time.perf_counter() - begin)
            elif classify(status, message := body.decode(errors="replace")) == "rejected":
                caller.rejected += 1
            else:
                caller.errors.append(f"{status} {message}"[:200])
        if not isinstance(connection, OSError):
            connection[1].close()


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """The status and body of one HTTP/1.1 answer (Content-Length or chunked, as Triton or a gateway sends)."""
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP answer: {lines[0][:80]!r}")
    fields = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
    fields = {name.strip().lower(): value.strip() for name, value in fields.items()}
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size + 2))
        await reader.readuntil(b"\r\n")  # the trailer's end
        return int(parts[1]), b"".join(chunk[:-2] for chunk in chunks)
    return int(parts[1]), await reader.readexactly(int(fields.get(b"content-length", b"0")))


def served_queue_bound(url: str, model: str, timeout: float = 60.0) -> int | None:
    """The served config's queue bound (dynamic_batching's max_queue_size); None: unbounded."""
    client = connect(url, timeout)
    try:
        config = call(client.get_model_config, model, what=f"model {model!r}")
    finally:
        client.close()
    policy = (config.get("dynamic_batching") or {}).get("default_queue_policy") or {}
    return int(policy.get("max_queue_size") or 0) or None


def sweep(
    url: str,
    model: str,
    levels: list[int],
    seconds: float,
    batch: int,
    timeout: float = 60.0,
    images: Sequence[Path] = (),
) -> list[LevelResult]:
    client = connect(url, timeout)
    info = describe(client, model)
    client.close()
    requests = bench_requests(info, images, batch)
    return [run_requests(url, info, requests, level, seconds, timeout) for level in levels]


def format_table(model: str, batch: int, results: list[LevelResult]) -> str:
    body = f", request body {results[0].request_bytes:,.0f} bytes (mean)" if results else ""
    header = f"{model} (batch {batch} per request{body})\n" + (
        f"{'conc':>5} {'samples/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'rejected':>8} {'errors':>6} "
        f"{'queue ms':>9} {'compute ms':>10} {'batch':>6} {'client CPU ms':>13}"
    )
    rows = [
        f"{r.concurrency:>5} {r.throughput:>10.1f} {r.p50_ms:>8.1f} {r.p90_ms:>8.1f} {r.p99_ms:>8.1f} {r.rejected:>8} "
        f"{r.errors:>6} {r.queue_ms:>9.1f} {r.compute_ms:>10.1f} {r.mean_batch:>6.2f} {r.client_cpu_ms:>13.3f}"
        for r in results
    ]
    notes = []
    if any(r.rejected for r in results):
        notes.append(
            "  rejected: answered at once with 503 by a full queue, the bound the config sets (batching.maxQueueSize): "
            "callers beyond what the server answers in time are turned away fast, by design, instead of waiting"
        )
    failures = [f"  concurrency {r.concurrency}: first error: {r.first_error}" for r in results if r.first_error]
    return "\n".join([header, *rows, *notes, *failures])


def plot(model: str, results: list[LevelResult], path: Path) -> None:
    build_figure(model, results).savefig(path, dpi=110)


def build_figure(model: str, results: list[LevelResult]) -> Figure:
    """Latency percentiles and throughput against concurrency, both axes from zero: an axis that starts at the
    lowest value draws 14.0 against 14.2 samples/s as a fourfold rise."""
    from matplotlib.figure import Figure  # a figure of its own: no pyplot state, nothing to close

    levels = [r.concurrency for r in results]
    figure = Figure(figsize=(7, 4.6), layout="constrained")
    latency_axis = figure.subplots()
    latencies = {
        "p50": [r.p50_ms for r in results],
        "p90": [r.p90_ms for r in results],
        "p99": [r.p99_ms for r in results],
    }
    for label, values in latencies.items():
        latency_axis.plot(levels, values, marker="o", label=f"latency {label}")
    latency_axis.set_xlabel("concurrent callers")
    latency_axis.set_ylabel("latency (ms)")
    latency_axis.set_xscale("log", base=2)
    _from_zero(latency_axis, [v for values in latencies.values() for v in values])
    throughput_axis = latency_axis.twinx()
    throughput = [r.throughput for r in results]
    throughput_axis.plot(levels, throughput, marker="s", color="black", label="throughput")
    throughput_axis.set_ylabel("samples / s")
    _from_zero(throughput_axis, throughput)
    lines = latency_axis.get_legend_handles_labels()[0] + throughput_axis.get_legend_handles_labels()[0]
    # Below the plot: with rates from zero the lines fill the top, where a legend inside would hide points.
    figure.legend(handles=lines, loc="outside lower center", ncols=len(lines))
    latency_axis.set_title(f"{model}: latency and throughput against concurrency")
    return figure


def _from_zero(axis: Any, values: list[float]) -> None:
    """From zero to a little above the largest value, so the highest point shows clear of the frame."""
    finite = [v for v in values if math.isfinite(v)]
    axis.set_ylim(0, max(finite, default=0.0) * 1.08 or 1.0)


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _rate(text: str) -> float:
    rate = _number(text)
    if rate <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of requests per second")
    if rate > MAX_RATE:
        raise argparse.ArgumentTypeError(
            f"{text} requests/s is more than one generator can offer ({MAX_RATE:g}/s from one event loop); "
            "above that it would measure the generator, not the server: run several generators"
        )
    return rate


def _seconds(text: str) -> float:
    seconds = _number(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return seconds


def _timeout(text: str) -> float:
    timeout = _number(text)
    if timeout < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected seconds, or 0 for no client timeout")
    return timeout


def _image_folder(text: str) -> list[Path]:
    """The JPEG and PNG files of a folder, sorted: the formats the image pipeline decodes."""
    from PIL import Image

    from inferop.serving.pipeline import FORMATS

    suffixes = sorted(suffix for suffix, name in Image.registered_extensions().items() if name in FORMATS)
    folder = Path(text)
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: not a directory")
    files = sorted(file for file in folder.iterdir() if file.is_file() and file.suffix.lower() in suffixes)
    if not files:
        raise argparse.ArgumentTypeError(f"{text}: holds no JPEG or PNG file ({', '.join(suffixes)})")
    return files


def _cpuset(text: str) -> set[int]:
    """A cpuset list like the kernel's: `0`, `0-1`, `0,2-3`."""
    try:
        cpus = parse_cpu_list(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{text!r}: {error}; expected CPU numbers like 0 or 0-1,3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(f"{text!r}: this process may run on CPUs {sorted(allowed)} only")
    return cpus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint host:port")
    parser.add_argument("--model", required=True)
    parser.add_argument(
        "--concurrency", help="comma-separated closed-loop caller counts (default 1,2,4,8; not with --rate)"
    )
    parser.add_argument(
        "--seconds", type=_seconds, default=5.0, help="time per level, or the offered duration with --rate (default 5)"
    )
    parser.add_argument("--batch", type=int, default=1, help="samples per request (default 1)")
    parser.add_argument(
        "--images",
        type=_image_folder,
        metavar="DIR",
        help="send the JPEG and PNG files of DIR as they are, in turn (image pipelines; default: generated tensors)",
    )
    parser.add_argument(
        "--timeout", type=_timeout, default=60.0, help="client timeout per request, seconds (0: none, with --rate)"
    )
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--plot", type=Path, help="write a PNG: against concurrency, or over time with --rate")
    open_loop = parser.add_argument_group("open loop (offered load)")
    open_loop.add_argument("--rate", type=_rate, help="offer this many requests/s whatever the server answers")
    open_loop.add_argument(
        "--arrivals", choices=["poisson", "fixed"], default="poisson", help="arrival process (default poisson)"
    )
    open_loop.add_argument(
        "--client-cpuset", type=_cpuset, help="run the load generator on these CPUs (e.g. 0), apart from the server's"
    )
    open_loop.add_argument(
        "--memory-cgroup",
        type=Path,
        help="the server's cgroup directory (v1 memory or v2): its memory usage is sampled as server memory, "
        "and its peak and OOM kills reported",
    )
    open_loop.add_argument(
        "--cpu-cgroup", type=Path, help="the server's cgroup directory with cpu.stat: its throttled periods reported"
    )


def run(args: argparse.Namespace) -> int:
    if args.rate is not None:
        return run_offered_load(args)
    for flag, value in (
        ("--client-cpuset", args.client_cpuset),
        ("--memory-cgroup", args.memory_cgroup),
        ("--cpu-cgroup", args.cpu_cgroup),
    ):
        if value is not None:
            print(f"error: {flag} needs --rate (open-loop load)", file=sys.stderr)
            return 2
    if args.timeout == 0:
        print(
            "error: --timeout 0 (no client timeout) needs --rate: closed-loop callers would wait for ever",
            file=sys.stderr,
        )
        return 2
    concurrency = args.concurrency or "1,2,4,8"
    try:
        levels = [int(x) for x in concurrency.split(",")]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --concurrency {concurrency!r}: expected positive integers like 1,2,4,8", file=sys.stderr)
        return 2
    try:
        results = sweep(args.url, args.model, levels, args.seconds, args.batch, args.timeout, args.images or ())
    except InferError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.plot:
        plot(args.model, results, args.plot)
    if args.json:
        print(json.dumps({"model": args.model, "batch": args.batch, "levels": [asdict(r) for r in results]}, indent=2))
    else:
        print(format_table(args.model, args.batch, results))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


def run_offered_load(args: argparse.Namespace) -> int:
    from inferop import openloop

    if args.concurrency is not None:
        print(
            f"error: --concurrency {args.concurrency} cannot be combined with --rate: "
            "--rate offers load open-loop, --concurrency runs callers that wait for answers",
            file=sys.stderr,
        )
        return 2
    probe = None
    if args.memory_cgroup is not None:
        try:
            probe = openloop.cgroup_memory_probe(args.memory_cgroup)
        except (OSError, ValueError) as error:
            print(f"error: --memory-cgroup {args.memory_cgroup}: {error}", file=sys.stderr)
            return 2
    try:
        client = connect(args.url, 30.0)
        try:
            info = describe(client, args.model)
        finally:
            client.close()
        requests = bench_requests(info, args.images or (), args.batch)
    except InferError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    result = openloop.run_open_loop(
        args.url,
        info.name,
        [{tensor.name: array for tensor, array in data} for data in requests],
        args.rate,
        args.seconds,
        timeout=args.timeout or None,
        process=args.arrivals,
        memory_probe=probe,
        outputs=info.outputs,
        client_cpus=args.client_cpuset,
    )
    pod = read_pod_usage(args.memory_cgroup, args.cpu_cgroup) if args.memory_cgroup is not None else None
    if args.plot:
        openloop.plot(result, args.plot)
    if args.json:
        print(json.dumps({**result.as_dict(), "pod": pod}, indent=2))
    else:
        print(openloop.format_table(result))
        if pod is not None:
            print(f"server pod: {describe_usage(pod)}")
        if args.plot:
            print(f"plot: {args.plot}")
    for warning in result.warnings():
        print(f"warning: {warning}", file=sys.stderr)
    return 0

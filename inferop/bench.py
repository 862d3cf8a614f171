"""`inferop bench`: latency and throughput of a Triton model against concurrency.

Each level runs `concurrency` closed-loop callers for a fixed time with binary tensors and reports what a
caller sees (throughput, latency percentiles, errors) beside what Triton saw (queue and compute time per
request, and the batch size the dynamic batcher formed), from the differences of Triton's statistics.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferop.client import InferError, ModelInfo, call, connect, describe


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    requests: int
    errors: int
    seconds: float
    throughput: float  # samples per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    queue_ms: float  # Triton's mean queue time per request
    compute_ms: float  # Triton's mean compute time per request
    mean_batch: float  # samples per model execution
    first_error: str | None = None


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


def sample_input(info: ModelInfo, batch: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((batch, *info.input_dims)).astype(np.float32)


def run_level(
    url: str, info: ModelInfo, data: np.ndarray, concurrency: int, seconds: float, timeout: float
) -> LevelResult:
    """`concurrency` callers, each with its own connection, sending back to back until time is up."""
    import tritonclient.http as httpclient

    latencies: list[list[float]] = [[] for _ in range(concurrency)]
    errors: list[list[str]] = [[] for _ in range(concurrency)]
    stop_at = time.monotonic() + seconds
    start_gate = threading.Barrier(concurrency + 1)

    def caller(index: int) -> None:
        client = connect(url, timeout)
        request = httpclient.InferInput(info.input_name, list(data.shape), "FP32")
        request.set_data_from_numpy(data, binary_data=True)
        outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in info.outputs]
        start_gate.wait()
        while time.monotonic() < stop_at:
            begin = time.perf_counter()
            try:
                client.infer(info.name, [request], outputs=outputs)
                latencies[index].append(time.perf_counter() - begin)
            except Exception as error:  # every failure is counted and the first one reported
                errors[index].append(str(error)[:200])
        client.close()

    admin = connect(url, timeout)
    before = call(admin.get_inference_statistics, info.name, what="statistics")
    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    start_gate.wait()
    began = time.monotonic()
    for thread in threads:
        thread.join(seconds + timeout + 5)
    elapsed = time.monotonic() - began
    after = call(admin.get_inference_statistics, info.name, what="statistics")
    admin.close()  # an open connection holds up the server's shutdown
    flat = [x for per in latencies for x in per]
    failures = [e for per in errors for e in per]
    delta = statistics_delta(before, after)
    p50, p90, p99 = percentiles(flat)
    return LevelResult(
        concurrency=concurrency,
        requests=len(flat),
        errors=len(failures),
        seconds=round(elapsed, 3),
        throughput=len(flat) * len(data) / elapsed,
        p50_ms=p50,
        p90_ms=p90,
        p99_ms=p99,
        queue_ms=delta["queue_ms"],
        compute_ms=delta["compute_ms"],
        mean_batch=delta["mean_batch"],
        first_error=failures[0] if failures else None,
    )


def sweep(
    url: str, model: str, levels: list[int], seconds: float, batch: int, timeout: float = 60.0
) -> list[LevelResult]:
    client = connect(url, timeout)
    info = describe(client, model)
    client.close()
    data = sample_input(info, batch)
    return [run_level(url, info, data, level, seconds, timeout) for level in levels]


def format_table(model: str, batch: int, results: list[LevelResult]) -> str:
    header = f"{model} (batch {batch} per request)\n" + (
        f"{'conc':>5} {'samples/s':>10} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'errors':>6} "
        f"{'queue ms':>9} {'compute ms':>10} {'batch':>6}"
    )
    rows = [
        f"{r.concurrency:>5} {r.throughput:>10.1f} {r.p50_ms:>8.1f} {r.p90_ms:>8.1f} {r.p99_ms:>8.1f} {r.errors:>6} "
        f"{r.queue_ms:>9.1f} {r.compute_ms:>10.1f} {r.mean_batch:>6.2f}"
        for r in results
    ]
    failures = [f"  concurrency {r.concurrency}: first error: {r.first_error}" for r in results if r.first_error]
    return "\n".join([header, *rows, *failures])


def plot(model: str, results: list[LevelResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = [r.concurrency for r in results]
    figure, latency_axis = plt.subplots(figsize=(7, 4.2))
    for label, values in (
        ("p50", [r.p50_ms for r in results]),
        ("p90", [r.p90_ms for r in results]),
        ("p99", [r.p99_ms for r in results]),
    ):
        latency_axis.plot(levels, values, marker="o", label=f"latency {label}")
    latency_axis.set_xlabel("concurrent callers")
    latency_axis.set_ylabel("latency (ms)")
    latency_axis.set_xscale("log", base=2)
    throughput_axis = latency_axis.twinx()
    throughput_axis.plot(levels, [r.throughput for r in results], marker="s", color="black", label="throughput")
    throughput_axis.set_ylabel("samples / s")
    lines = latency_axis.get_legend_handles_labels()[0] + throughput_axis.get_legend_handles_labels()[0]
    latency_axis.legend(handles=lines, loc="upper left")
    latency_axis.set_title(f"{model}: latency and throughput against concurrency")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint host:port")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated caller counts (default 1,2,4,8)")
    parser.add_argument("--seconds", type=float, default=5.0, help="time per level (default 5)")
    parser.add_argument("--batch", type=int, default=1, help="samples per request (default 1)")
    parser.add_argument("--timeout", type=float, default=60.0, help="client timeout per request, seconds")
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--plot", type=Path, help="write a PNG of latency and throughput against concurrency")


def run(args: argparse.Namespace) -> int:
    try:
        levels = [int(x) for x in args.concurrency.split(",")]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --concurrency {args.concurrency!r}: expected positive integers like 1,2,4,8", file=sys.stderr)
        return 2
    try:
        results = sweep(args.url, args.model, levels, args.seconds, args.batch, args.timeout)
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

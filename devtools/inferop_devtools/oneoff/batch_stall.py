"""One-off study of the 500 ms batch stall that NVIDIA's perf_analyzer sees: the conv net as the operator renders it
for a pod of `--cpus` CPUs, served by the local tritonserver under that quota, perf_analyzer at 16 callers, under
variants of the rendering; for each, perf_analyzer's throughput, p50, p99, longest answer and the answers in
480-700 ms. With --trace, Triton's own trace (every request, timestamps) of the first variant locates the stalled
requests' time. `make bench` measures the planned rendering and its ablation every run (bench/stall.py).

    python -m inferop_devtools.oneoff.batch_stall [--cpus 2] [--beside N] [--seconds 15] [--variants planned,...]
        [--trace]

Run by hand, quote as a one-off measurement with its date.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferop.limits import PodLimits
from inferop_core.scheduling import CpuScheduling
from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.bench.clients import STALL_BAND_MS, run_perf_analyzer
from inferop_devtools.bench.stall import busy, one_instance
from inferop_devtools.cluster.tools import built
from inferop_devtools.field.pods import local_server, planned, pod_spec

CALLERS = 16
# Each variant: how it changes the planned config, and the scheduling policy it runs under.
VARIANTS: dict[str, tuple[Callable[[ServingConfig, float], ServingConfig], CpuScheduling]] = {
    "planned": (lambda s, cpus: s, "batch"),
    "planned under SCHED_OTHER": (lambda s, cpus: s, "normal"),
    "one instance": (one_instance, "batch"),
    "one instance, queue delay 0": (
        lambda s, cpus: one_instance(s, cpus).model_copy(update={"max_queue_delay_microseconds": 0}),
        "batch",
    ),
    "two instances": (lambda s, cpus: s.model_copy(update={"instances": 2, "take_turns": False}), "batch"),
    "two instances taking turns": (lambda s, cpus: s.model_copy(update={"instances": 2, "take_turns": True}), "batch"),
}


def trace_args(path: Path) -> list[str]:
    """Triton's own trace of every request, its timestamps written to `path` as JSON."""
    settings = ["mode=triton", f"triton,file={path}", "rate=1", "level=TIMESTAMPS", "count=-1"]
    return [arg for setting in settings for arg in ("--trace-config", setting)]


def stalled_requests(path: Path) -> dict[str, Any]:
    """From a Triton trace: the requests whose queue time (queue start to compute start) reached the stall band,
    and where their time went, as medians in milliseconds."""
    stamps: dict[int, dict[str, int]] = defaultdict(dict)
    for entry in json.loads(path.read_text()):
        for stamp in entry.get("timestamps", []):
            stamps[entry["id"]][stamp["name"]] = stamp["ns"]
    requests = [s for s in stamps.values() if {"QUEUE_START", "COMPUTE_START", "COMPUTE_END"} <= s.keys()]
    stalled = [s for s in requests if (s["COMPUTE_START"] - s["QUEUE_START"]) / 1e6 >= STALL_BAND_MS[0]]

    def median_ms(start: str, end: str, among: list[dict[str, int]]) -> float | None:
        spans = [(s[end] - s[start]) / 1e6 for s in among]
        return round(statistics.median(spans), 2) if spans else None

    return {
        "requests": len(requests),
        "stalled": len(stalled),
        "stalled_queue_ms": median_ms("QUEUE_START", "COMPUTE_START", stalled),
        "stalled_compute_ms": median_ms("COMPUTE_START", "COMPUTE_END", stalled),
        "all_queue_ms": median_ms("QUEUE_START", "COMPUTE_START", requests),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cpus", type=float, default=2.0, help="the server's CPU quota (default 2)")
    parser.add_argument("--beside", type=int, default=0, help="CPU-bound processes running beside the server")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--trace", action="store_true", help="trace every request of the first variant")
    args = parser.parse_args(argv)
    binary = built("perf-analyzer.sh", "perf_analyzer", build=True) / "perf_analyzer"
    serving = planned(pod_spec("conv_net", cpus=args.cpus))
    limits = PodLimits.from_strings(f"{args.cpus:g}", None, None)
    results = {}
    for index, name in enumerate(args.variants.split(",")):
        change, policy = VARIANTS[name]
        config = change(serving, args.cpus)
        with tempfile.TemporaryDirectory(prefix="inferop-stall-") as work:
            trace = Path(work) / "trace.json"
            extra = trace_args(trace) if args.trace and index == 0 else []
            with local_server(config, limits, cpu_scheduling=policy, extra_args=extra) as server, busy(args.beside):
                figures = run_perf_analyzer(binary, server.url, "conv_net", CALLERS, args.seconds)
            if extra:
                figures["trace"] = stalled_requests(trace)
        turns = " taking turns" if config.take_turns else ""
        figures["config"] = f"{config.instances}{turns} x {config.intra_op_threads} thread(s), delay "
        figures["config"] += f"{config.max_queue_delay_microseconds} us, {policy}, {args.cpus:g} CPU(s), "
        figures["config"] += f"{args.beside} busy process(es) beside"
        results[name] = figures
        print(json.dumps({name: figures}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

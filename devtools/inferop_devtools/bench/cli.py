"""`make bench`: the speed and memory targets, measured in one run and printed as ratios.

Serving (Inception V3): images/s through the local Triton against ONNX Runtime in-process with the same
threads, and against this machine's fp32 ceiling (MACs x 2 / a measured large-matmul FLOP rate); int8 (the
exporter's quantization) through Triton against fp32, with the served config and each tuned by `inferop tune`,
with its accuracy gate's agreement beside it.
GPU (only where one exists): both networks exported for the GPU, served on it, callers from 1 to 64, and the
device memory they take against the memory fit's estimate.
Tuning (the conv net under a 2-CPU quota and a p99 budget): `inferop tune`'s climb against the exhaustive sweep of
the same grid, in trials, time and best throughput, the two winners measured again side by side.
Operator: time from `kubectl apply` to the Deployment existing (p50 of 20), time for 100 services
applied at once to converge, and the operator's peak resident memory.
Clients: NVIDIA's perf_analyzer against `inferop bench` on the same server (both networks, 1, 4 and 16 callers):
throughput, p50, p99, client CPU a request, and the answers in the band of the batcher's 500 ms timer.
Stall: perf_analyzer at 16 callers against both networks as the operator renders them for 1 and 2 CPUs, under that
quota, idle and beside a CPU-bound process: p99 against p50 and the answers in that band, with the one-instance
rendering as the ablation.
Capacity: the export's capacity measure three times idle and three times beside busy processes, and the same timed by
the clock (the ablation).
Image pipeline (Inception V3 under one CPU): JPEG -> top-5 through the planned ensemble against the bare model fed
tensors, against callers that decode at the same total CPU, the bytes a request carries, the naive ensemble, bad
input, and the memory peak with the pipeline full of its largest images against the plan's limit.

Exits 1 when a part fails or a target is missed, and says which.
"""

from __future__ import annotations

import argparse
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from inferop.paths import repo_root
from inferop_devtools.bench.report import report_lines, targets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make bench", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="duration of each throughput measurement")
    parser.add_argument("--services", type=int, default=100)
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--skip-serving", action="store_true")
    parser.add_argument("--skip-gpu", action="store_true")
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--skip-operator", action="store_true")
    parser.add_argument("--skip-clients", action="store_true")
    parser.add_argument("--skip-stall", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--skip-pipeline", action="store_true")
    parser.add_argument("--json", type=Path, default=repo_root() / "out" / "bench.json", help="write the figures here")
    args = parser.parse_args(argv)

    from inferop.serving.gpu import local_gpu
    from inferop_devtools.bench.capacity import capacity_bench
    from inferop_devtools.bench.clients import clients_bench
    from inferop_devtools.bench.gpu import gpu_bench
    from inferop_devtools.bench.operator import operator_bench
    from inferop_devtools.bench.pipeline import pipeline_bench
    from inferop_devtools.bench.serving import serving_bench
    from inferop_devtools.bench.stall import stall_bench
    from inferop_devtools.bench.tune import tune_bench

    sections: dict[str, Callable[[], dict[str, Any]]] = {
        "serving": lambda: serving_bench(args.seconds),
        "gpu": lambda: gpu_bench(args.seconds / 3) if local_gpu() else {"not_measured": "no NVIDIA GPU with CUDA here"},
        "tune": tune_bench,
        "operator": lambda: operator_bench(args.services, args.samples),
        "clients": lambda: clients_bench(args.seconds),
        "stall": lambda: stall_bench(args.seconds),
        "capacity": capacity_bench,
        "pipeline": lambda: pipeline_bench(args.seconds),
    }
    results: dict[str, Any] = {}
    failed: dict[str, str] = {}
    for name, measure in sections.items():
        if getattr(args, f"skip_{name}"):
            continue
        try:
            results[name] = measure()
        except Exception as error:  # one part failing must not lose what the others measured
            traceback.print_exc()
            failed[name] = f"{type(error).__name__}: {error}"

    print("\n=== results (measured in this run)")
    for line in report_lines(results):
        print(line)
    checked = targets(results)
    print("\n=== targets")
    for target in checked:
        print(f"  {target.describe()}")
    for name, reason in failed.items():
        print(f"{name}: FAILED, not measured: {reason}")
    missed = [target.name for target in checked if target.missed]
    if missed:
        print(f"missed: {'; '.join(missed)}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    summary = [{**vars(target), "met": target.met, "missed": target.missed} for target in checked]
    args.json.write_text(json.dumps({**results, "targets": summary, "failed": failed}, indent=2))
    print(f"figures: {args.json}")
    return 1 if failed or missed else 0

"""The dynamic batcher's 500 ms stall, as NVIDIA's perf_analyzer sees it: each network as the operator renders it
for a pod of 1 and of 2 CPUs, served by the local tritonserver under that CPU quota (`inferop serve --cpus`), with the
machine otherwise idle and with a CPU-bound process beside it; perf_analyzer at 16 callers against each. The
ablation serves the conv net at 1 and 2 CPUs as the plan rendered it before instances were derived (one instance with
every thread), so the report shows that the stall is there to find when the mechanism is removed.
"""

from __future__ import annotations

import contextlib
import math
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.bench.clients import STALL_BAND_MS, run_perf_analyzer
from inferop_devtools.bench.targets import Target

CALLERS = 16
CPUS = (1, 2)
BESIDE = (0, 1)  # CPU-bound processes beside the server
# p99 / p50 at 16 callers (issue 43): the conv net's batches are short against the timer, Inception V3's long.
TAIL_RATIO = {"conv_net": 3.0, "inception_v3": 2.0}
ABLATION = (("conv_net", 1), ("conv_net", 2))  # network and CPUs served with one instance


@contextlib.contextmanager
def busy(processes: int) -> Iterator[None]:
    """`processes` CPU-bound processes beside the server for as long as the context lasts."""
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        yield
    finally:
        for process in spinning:
            process.kill()
            process.wait()


def one_instance(serving: ServingConfig, cpus: float) -> ServingConfig:
    """The rendering before instances were derived: one instance with every whole CPU's thread."""
    return serving.model_copy(
        update={"instances": 1, "take_turns": False, "intra_op_threads": max(1, math.floor(cpus))}
    )


def stall_bench(seconds: float) -> dict[str, Any]:
    """perf_analyzer at 16 callers against each network, quota and neighbour, and against the ablation."""
    from inferop.limits import PodLimits
    from inferop_devtools.cluster.tools import built
    from inferop_devtools.field.pods import local_server, planned, pod_spec

    binary = built("perf-analyzer.sh", "perf_analyzer", build=True) / "perf_analyzer"
    runs = []
    cases = [(network, cpus, beside, "planned") for network in TAIL_RATIO for cpus in CPUS for beside in BESIDE]
    cases += [(*ablated, beside, "one instance") for ablated in ABLATION for beside in BESIDE]
    for network, cpus, beside, rendering in cases:
        serving = planned(pod_spec(network, cpus=cpus))
        if rendering == "one instance":
            serving = one_instance(serving, cpus)
        print(f"{network} at {cpus} CPU(s), {beside} busy process(es) beside, {rendering} ...", flush=True)
        limits = PodLimits.from_strings(str(cpus), None, None)
        with local_server(serving, limits) as server, busy(beside):
            figures = run_perf_analyzer(binary, server.url, network, CALLERS, seconds)
        runs.append({
            "network": network, "cpus": cpus, "beside": beside, "rendering": rendering,
            "instances": serving.instances, "intra_op": serving.intra_op_threads, "take_turns": serving.take_turns,
            **figures,
        })  # fmt: skip
    return {"seconds": seconds, "callers": CALLERS, "runs": runs}


def stall_targets(figures: dict[str, Any]) -> list[Target]:
    """Issue 43's goals: p99 within its ratio of p50 and no answer in the stall band, for every planned run; the
    ablation's runs together must show the stall (answers in the band), or they had no power to find it. At 2 CPUs one
    instance's stall is rare (two of six 12 s runs found it, none of two 60 s runs, 2026-12-05); at 1 CPU it came
    in three of four runs; so the ablation is judged over both quotas, and the table shows each."""
    low, high = STALL_BAND_MS
    targets = []
    ablation = []
    for run in figures["runs"]:
        where = f"{run['network']} at {run['cpus']} CPU(s), {run['beside']} beside"
        if run["rendering"] != "planned":
            ablation.append(run)
            continue
        targets += [
            Target(f"{where}: perf_analyzer p99 / p50", run["p99_ms"] / run["p50_ms"], TAIL_RATIO[run["network"]],
                   at_least=False),
            Target(f"{where}: answers in {low:g}-{high:g} ms", run["in_stall_band"] or 0, 0, at_least=False,
                   not_applicable=None if run["in_stall_band"] is not None else "requests too large to export"),
        ]  # fmt: skip
    if ablation:
        found = sum(run["in_stall_band"] or 0 for run in ablation)
        quotas = " and ".join(f"{cpus:g}" for cpus in sorted({run["cpus"] for run in ablation}))
        name = f"ablation, conv_net at {quotas} CPU(s) as one instance, {len(ablation)} run(s): answers in {low:g}-"
        targets.append(Target(f"{name}{high:g} ms (the stall found)", found, 1))
    return targets


def stall_lines(figures: dict[str, Any]) -> list[str]:
    low, high = STALL_BAND_MS
    lines = [
        f"The batcher's 500 ms stall: perf_analyzer at {figures['callers']} callers, {figures['seconds']:g} s a run, "
        "the server under a CPU quota:",
        f"  {'network':<13}{'CPUs':>5}{'beside':>7}  {'rendering':<14}{'layout':>11}{'samples/s':>10}{'p50 ms':>9}"
        f"{'p99 ms':>9}{'p99/p50':>8}{'max ms':>9}{f'{low:g}-{high:g}ms':>10}",
    ]
    for run in figures["runs"]:
        band = "-" if run["in_stall_band"] is None else run["in_stall_band"]
        longest = "-" if run["max_ms"] is None else run["max_ms"]
        layout = f"{run['instances']}x{run['intra_op']}{' turns' if run.get('take_turns') else ''}"
        lines.append(
            f"  {run['network']:<13}{run['cpus']:>5}{run['beside']:>7}  {run['rendering']:<14}{layout:>11}"
            f"{run['throughput']:>10.1f}{run['p50_ms']:>9.1f}{run['p99_ms']:>9.1f}{run['p99_ms'] / run['p50_ms']:>8.2f}"
            f"{longest:>9}{band:>10}"
        )
    return lines

"""The export's capacity on a loaded machine: `inferop export`'s measure (one ONNX Runtime thread, timed by the CPU
time it was given) three times with the machine idle and three times beside as many CPU-bound processes as it has
CPUs, each beside the same measure timed by the clock instead (the ablation). The queue bound and every drill's
reference are derived from this figure, so a busy neighbour must not move it.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from inferop_devtools.bench.targets import Target

REPEATS = 3
SPREAD = 0.10  # (largest - smallest) / median of the repeats, and loaded against idle
NETWORK = "conv_net"
BATCH = 8


def capacity_bench() -> dict[str, Any]:
    import onnx

    from inferop_core.threads import local_cpus
    from inferop_devtools.bench.serving import exported
    from inferop_devtools.bench.stall import busy
    from inferop_export.exporter import measure_capacity
    from inferop_export.signature import read_signature
    from inferop_export.sources import OnnxFile

    path = exported(NETWORK) / "1" / "model.onnx"
    source, signature = OnnxFile(NETWORK, path), read_signature(onnx.load(str(path)))
    figures: dict[str, Any] = {"network": NETWORK, "batch": BATCH, "busy": local_cpus()}
    for condition, beside in (("idle", 0), ("loaded", local_cpus())):
        print(f"{NETWORK}: the export's capacity, {condition} ...", flush=True)
        with busy(beside):
            runs = [
                (measure_capacity(source, path, signature, BATCH, seed=0),
                 measure_capacity(source, path, signature, BATCH, seed=0, clock=time.perf_counter))
                for _ in range(REPEATS)
            ]  # fmt: skip
        figures[condition] = {"cpu_time": [cpu for cpu, _ in runs], "clock": [wall for _, wall in runs]}
    return figures


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def capacity_targets(figures: dict[str, Any]) -> list[Target]:
    """Issue 43: three measures on a loaded machine within 10% of each other and of the idle ones; timed by the clock
    they must not be, or this machine was not loaded enough to show anything."""
    idle, loaded = figures["idle"], figures["loaded"]

    def against_idle(key: str) -> float:
        return abs(statistics.median(loaded[key]) / statistics.median(idle[key]) - 1)

    return [
        Target("export capacity, loaded: spread of 3", spread(loaded["cpu_time"]), SPREAD, at_least=False),
        Target("export capacity: |loaded / idle - 1|", against_idle("cpu_time"), SPREAD, at_least=False),
        Target("ablation, timed by the clock: |loaded / idle - 1| (the load found)", against_idle("clock"), SPREAD),
    ]


def capacity_lines(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"The export's capacity ({figures['network']}, one thread, batch {figures['batch']}, samples/s), "
        f"idle and beside {figures['busy']} busy process(es):"
    ]
    for condition in ("idle", "loaded"):
        for key, label in (("cpu_time", "the thread's CPU time"), ("clock", "the clock (ablation)")):
            values = figures[condition][key]
            lines.append(
                f"  {condition:<7} timed by {label:<22} {', '.join(f'{v:.0f}' for v in values)}"
                f"  (spread {spread(values):.1%})"
            )
    return lines

"""`make field`: the four field failures reproduced under a pod's real limits, naive against inferop, in one run.

Each drill runs its pods on the local cluster's real node (containerd, runc and the kubelet, which writes each pod's
CPU quota and memory limit into its cgroups), holds them to the last CPU, and drives them from the other CPUs in the
node's network. The naive deployment is what a user writes by hand with Triton's and ONNX Runtime's defaults;
inferop's is what the operator renders for the same model and limits. Writes out/field/report.md, one JSON per
drill and PNG plots.

    python scripts/field.py [--drills threads,overload,memory,hang] [--calibrate]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from inferop.limits import cgroup_unavailable_reason
from inferop_core.threads import local_cpus
from inferop_devtools.choices import add_subset_option
from inferop_devtools.field.hang import drill_hang
from inferop_devtools.field.memory import calibrate, drill_memory, measured_points
from inferop_devtools.field.overload import drill_overload
from inferop_devtools.field.pods import OUT, ROOT, Machine
from inferop_devtools.field.report import plot_drill, report
from inferop_devtools.field.threads import drill_threads

DRILLS: dict[str, Callable[[Machine], dict[str, Any]]] = {
    "threads": drill_threads,
    "overload": drill_overload,
    "memory": drill_memory,
    "hang": drill_hang,
}


def main() -> int:
    parser = argparse.ArgumentParser(prog="make field", description=(__doc__ or "").splitlines()[0])
    add_subset_option(parser, "--drills", DRILLS)
    parser.add_argument(
        "--calibrate", action="store_true", help="print the memory model's constants fitted on the fit set"
    )
    args = parser.parse_args()
    chosen: list[str] = args.drills
    reason = cgroup_unavailable_reason()
    if reason:
        print(f"error: the drills need a pod's limits: {reason}", file=sys.stderr)
        return 1
    machine = Machine.split()
    OUT.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    results: dict[str, Any] = {}
    for name in chosen:
        print(f"=== drill {name}", flush=True)
        results[name] = DRILLS[name](machine)
        results[name]["plot"] = plot_drill(name, results[name])
        (OUT / f"{name}.json").write_text(json.dumps(results[name], indent=2, default=str))
    if "memory" in results:  # the points tests/core/test_memory.py holds the constants to (tests/data/)
        (OUT / "memory-points.json").write_text(json.dumps(measured_points(results["memory"]), indent=1))
    if args.calibrate and "memory" in results:
        constants = calibrate(results["memory"]["fitted"], f"make field's fit set, {time.strftime('%Y-%m-%d')}")
        print(json.dumps(constants, indent=2))
    text = report(results, time.monotonic() - started)
    (OUT / "report.md").write_text(text)
    print(text)
    print(f"report: {(OUT / 'report.md').relative_to(ROOT)} (local CPUs {local_cpus()})")
    return 0 if all(drill["goal"]["met"] for drill in results.values()) else 1

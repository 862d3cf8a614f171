"""One-off measurement behind the README's overload figures: how far inferop's goodput at 2x and 4x capacity moves
between repeats of the same run, at one CPU quota. The overload drill (`make field`) makes each run once; this makes
the inferop side of it `--repeats` times on one capacity measure, each run compared with the capacity measured on
its own server just before and just after, as the drill compares it.

    python -m inferop_devtools.oneoff.overload_spread [--cpus 1] [--repeats 3] [--seconds 60]

Run by hand, quote as a one-off measurement with its date.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING
from inferop_devtools.field.overload import NETWORK, WINDOW_SECONDS, answered_rate, overloaded, quota_pod
from inferop_devtools.field.pods import Machine, closed_loop, pod


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cpus", type=float, default=1.0, help="the pod's CPU quota")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0, help="open-loop arrivals per run")
    args = parser.parse_args()
    machine = Machine.split()
    quota = quota_pod(machine, args.cpus)
    with pod(quota.ours, quota.limits) as server, quota.gateway(server, machine) as gateway:
        measured = closed_loop(server, NETWORK, quota.capacity_callers, WINDOW_SECONDS, machine, gateway.url)
    capacity = measured.throughput
    runs: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for factor in (2.0, 4.0):
            run = overloaded(
                "inferop", quota, quota.ours, DEFAULT_CPU_SCHEDULING, capacity * factor, args.seconds,
                quota.timeout * 1.1, machine,
            )  # fmt: skip
            paired, in_run, served = run.capacity_windows, run.capacity_in_run, answered_rate(run.result)
            around = sum(paired) / len(paired) if paired else None
            share = round(run.result.goodput / around, 3) if around else None
            runs.append({"repeat": repeat, "factor": factor, "goodput": round(run.result.goodput, 3),
                         "capacity_windows": [round(v, 3) for v in paired], "share_of_capacity_around": share,
                         "share_of_capacity_in_run": round(served / in_run, 3) if served and in_run else None,
                         "rejected": run.result.rejected, "refused_at_gateway": run.refused_at_gateway,
                         "alive": run.alive})  # fmt: skip
            print(json.dumps(runs[-1]), flush=True)
    shares = {
        f"{f:g}x {reference}": [r[f"share_of_capacity_{reference}"] for r in runs if r["factor"] == f]
        for f in (2.0, 4.0)
        for reference in ("around", "in_run")
    }
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": args.cpus, "capacity": round(capacity, 3),
                      "shares": shares}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

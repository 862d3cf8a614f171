"""One-off measurement behind the README's scheduling policy rule: what SCHED_BATCH does for Triton's dynamic batcher
under a queue bound, on one CPU. Both networks with inferop's rendering (derived queue bound, request timeout) in a
1-CPU cgroup as `inferop serve --cpus 1` makes it, under SCHED_OTHER and under SCHED_BATCH: the capacity (closed-loop
callers enough for full batches), then goodput at 1x and 2x that capacity offered open-loop, as a share of it.

    python -m inferop_devtools.oneoff.sched_batch [--seconds 20] [--across-cpus]

--across-cpus puts the server on every CPU (the load generator shares one), as a pod without a cpuset would be.
Run by hand, quote as a one-off measurement with its date (the field drills' threads drill measures SCHED_BATCH's
share of closed-loop throughput in every `make field`).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from inferop.limits import PodLimits
from inferop_core.scheduling import CpuScheduling
from inferop_devtools.field.pods import Machine, closed_loop, local_server, open_loop, planned, pod_spec

POLICIES: tuple[CpuScheduling, ...] = ("normal", "batch")


def measure(network: str, policy: CpuScheduling, limits: PodLimits, machine: Machine, seconds: float) -> dict[str, Any]:
    serving = planned(pod_spec(network, cpus=1))
    callers = 2 * serving.instances * serving.max_batch_size
    timeout = (serving.request_timeout_microseconds or 10_000_000) / 1e6
    with local_server(serving, limits, cpu_scheduling=policy) as server:
        capacity = closed_loop(server.url, network, callers, seconds, machine).throughput
        shares = {}
        for factor in (1.0, 2.0):
            assert server.cgroup is not None
            result = open_loop(
                server.url, serving, capacity * factor, seconds, timeout * 1.1, machine, server.cgroup.memory_current
            )
            shares[f"{factor:g}x"] = round(result.goodput / capacity, 3)
    return {"capacity": round(capacity, 2), "goodput_share": shares, "queue_bound": serving.max_queue_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--networks", default="conv_net,inception_v3")
    parser.add_argument("--across-cpus", action="store_true", help="the server on every CPU, not the last alone")
    args = parser.parse_args()
    machine = Machine.split()
    cpuset = ",".join(map(str, sorted(os.sched_getaffinity(0) if args.across_cpus else machine.server_cpus)))
    limits = PodLimits(cpus=1.0, cpuset=cpuset)
    figures: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "limits": limits.describe()}
    for network in args.networks.split(","):
        for policy in POLICIES:
            figures[f"{network}/{policy}"] = row = measure(network, policy, limits, machine, args.seconds)
            print(f"{network} under SCHED_{'BATCH' if policy == 'batch' else 'OTHER'}: {row}", flush=True)
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

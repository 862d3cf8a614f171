"""One-off measurement behind the README's gateway admission: what receiving and rejecting overload costs a pod.

One inferop Inception V3 pod at a CPU quota, offered 4x its capacity open-loop in alternating windows: straight to
the pod (Triton rejects the excess) and through Envoy with the operator's circuit breaker (Envoy refuses it before
the body reaches the pod). Each window reports goodput against the capacity measured through Envoy right after it,
the share of the pod's capacity in the same run that it answered (as the overload drill judges it,
inferop_devtools.field.work), and the CPU time of the tritonserver process itself (its HTTP and scheduling
threads; the model runs in the Python backend's stub process).

    python -m inferop_devtools.oneoff.rejection_cost [--cpus 1] [--pairs 3] [--seconds 30]

Run by hand, quote as a one-off measurement with its date.
"""

from __future__ import annotations

import argparse
import json
import time

from inferop_devtools.field.overload import NETWORK, WINDOW_SECONDS, Overloaded, answered_rate, quota_pod
from inferop_devtools.field.pods import Machine, closed_loop, open_loop, pod
from inferop_devtools.field.work import cpu_seconds, snapshot, work_between


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--cpus", type=float, default=1.0, help="the pod's CPU quota")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="open-loop arrivals per window")
    args = parser.parse_args()
    machine = Machine.split()
    quota = quota_pod(machine, args.cpus)
    rows = []
    with pod(quota.ours, quota.limits) as server, quota.gateway(server, machine) as gateway:
        assert server.process is not None
        model, batch, instances = quota.ours.name, quota.ours.max_batch_size, quota.ours.instances
        start = snapshot(server, model)
        capacity = closed_loop(server, NETWORK, quota.capacity_callers, WINDOW_SECONDS, machine, gateway.url)
        at_capacity = work_between(start, snapshot(server, model), batch, instances)
        for pair in range(args.pairs):
            for where, url in (("at the pod", None), ("at the gateway", gateway.url)):
                before, spent_before = snapshot(server, model), cpu_seconds(server.process.pid)
                result, _ = open_loop(
                    server, quota.ours, capacity.throughput * 4, args.seconds, quota.timeout * 1.1, machine, url
                )
                spent = cpu_seconds(server.process.pid) - spent_before
                work = work_between(before, snapshot(server, model), batch, instances)
                in_run = Overloaded(result, {}, True, work=work, work_at_capacity=at_capacity).capacity_in_run
                served = answered_rate(result)
                after = closed_loop(server, NETWORK, quota.capacity_callers, WINDOW_SECONDS, machine, gateway.url)
                rows.append({
                    "pair": pair, "rejected": where, "goodput": round(result.goodput, 3),
                    "capacity_after": round(after.throughput, 3),
                    "share": round(result.goodput / after.throughput, 3), "rejections": result.rejected,
                    "capacity_in_run": None if in_run is None else round(in_run, 3),
                    "share_of_capacity_in_run": round(served / in_run, 3) if served and in_run else None,
                    "work": work.as_dict(), "work_at_capacity": at_capacity.as_dict(),
                    "tritonserver_cpu_seconds": round(spent, 2),
                    "seconds_with_drain": len(result.timeline),
                })  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": args.cpus, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

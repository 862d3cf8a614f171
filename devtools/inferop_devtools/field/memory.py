"""Drill c, field reports 001 and 003: the memory model against the kernel's measured peak, and the OOM kill it
prevents."""

from __future__ import annotations

import math
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from inferop.memory import LOCAL_RUNTIME, ServingShape, estimate_memory
from inferop.quantity import format_bytes
from inferop.scheduling import DEFAULT_CPU_SCHEDULING
from inferop.serving.tritonserver import ServerError, TritonServer
from inferop.tritonconfig import ServingConfig
from inferop_devtools.field.pods import (
    NAIVE_SCHEDULING,
    NETWORKS,
    Machine,
    MiB,
    open_loop,
    planned,
    pod,
    pod_spec,
    wait_out,
)
from inferop_operator.plan import Refusal, model_costs, plan_service
from inferop_operator.spec import InferenceServiceSpec, parse_spec


def saturate(server: TritonServer, serving: ServingConfig, spec: InferenceServiceSpec, machine: Machine) -> None:
    """Fill the queue: open-loop arrivals at three times the capacity (capped at what the generator sends)."""
    per_cpu = spec.model.profile.samples_per_cpu_second
    assert per_cpu is not None, "inferop export measures the capacity into the profile"
    capacity = per_cpu * serving.instances
    open_loop(server, serving, min(3 * capacity, 1500.0), 8.0, spec.timeouts.request_seconds * 1.1, machine)


def drill_memory(machine: Machine) -> dict[str, Any]:
    """Field reports 001 and 003: the memory model against the measured peak, and the OOM it prevents."""
    grid: list[dict[str, Any]] = []
    for network in NETWORKS:
        for instances in (1, 2):
            for batch in (1, 8, 32):
                raw = pod_spec(network, instances, changes={"instances": instances, "batching.maxBatchSize": batch})
                spec = parse_spec(raw)
                serving = planned(raw)
                shape = ServingShape(instances, batch, serving.max_queue_size)
                with pod(serving, machine.limits(cpus=None)) as server:
                    assert server.cgroup is not None
                    time.sleep(1.0)
                    idle = server.cgroup.memory_peak()
                    saturate(server, serving, spec, machine)
                    busy = server.cgroup.memory_peak()
                for state, measured in (("idle", idle), ("saturated", busy)):
                    estimate = estimate_memory(model_costs(spec), shape, LOCAL_RUNTIME, saturated=state == "saturated")
                    row = {
                        "network": network,
                        "instances": instances,
                        "max_batch_size": batch,
                        "queue_bound": serving.max_queue_size,
                        "state": state,
                        "measured_bytes": measured,
                        "estimate_bytes": estimate.total,
                        "error": round(estimate.total / measured - 1, 4),
                        "terms": asdict(estimate),
                    }
                    grid.append(row)
                    print(
                        f"  memory/{network}/x{instances}/b{batch}/{state}: measured {format_bytes(measured)}, "
                        f"estimate {format_bytes(estimate.total)} ({row['error']:+.0%})"
                    )
    worst = max(abs(row["error"]) for row in grid)
    return {
        "grid": grid,
        "worst_error": worst,
        "oom": oom_demonstration(machine),
        "goal": {"text": "estimate within +-25% of the measured peak over the grid", "met": worst <= 0.25},
    }


def oom_demonstration(machine: Machine) -> dict[str, Any]:
    """A limit the old estimate approved is OOM-killed at saturation; the new model refuses it first, and
    the size it recommends survives the same load."""
    network = "inception_v3"
    base = parse_spec(pod_spec(network, cpus=1))
    profile, batch = base.model.profile, base.batching.max_batch_size
    old_estimate = profile.weight_bytes + profile.activation_bytes_per_sample * batch
    old_limit = math.ceil(2 * old_estimate / MiB) * MiB  # twice the old estimate: a generous user's margin
    old_rendering = planned(pod_spec(network, cpus=1, changes={"batching.maxQueueSize": 64})).model_copy(
        update={"memory_pattern": True}
    )
    try:
        plan_service(parse_spec(pod_spec(network, cpus=1, memory=old_limit)), LOCAL_RUNTIME)
        refusal, recommended = "accepted", old_limit
    except Refusal as refused:
        refusal = refused.message
        recommended = plan_service(base, LOCAL_RUNTIME).memory.required_bytes
    outcome = {}
    for label, serving, policy, memory in (
        ("old estimate's limit, old rendering", old_rendering, NAIVE_SCHEDULING, old_limit),
        (
            "recommended limit, inferop rendering",
            planned(pod_spec(network, cpus=1, memory=recommended)),
            DEFAULT_CPU_SCHEDULING,
            recommended,
        ),
    ):
        limits = machine.limits(cpus=1, memory_bytes=memory)
        try:
            with pod(serving, limits, cpu_scheduling=policy) as server:
                saturate(server, serving, base, machine)
                alive = wait_out(server, 1.0)
                assert server.cgroup is not None
                usage = dict(server.cgroup.usage())
            # On cgroup v1 the OOM killer takes the largest process (a model's stub), not the whole pod.
            outcome[label] = {"limit": memory, "survived": alive and usage["oom_kills"] == 0, "usage": usage}
        except ServerError as error:  # killed while loading: the limit is below even the idle footprint
            outcome[label] = {"limit": memory, "survived": False, "error": str(error)[:400]}
        print(f"  memory/oom/{label}: limit {format_bytes(memory)}, survived {outcome[label]['survived']}")
    return {"old_estimate": old_estimate, "old_limit": old_limit, "refusal": refusal, "runs": outcome}


def calibrate(grid: list[dict[str, Any]], machine_note: str) -> dict[str, Any]:
    """Least-squares constants of the memory model from a measured grid: the origin of LOCAL_RUNTIME."""
    specs = {network: parse_spec(pod_spec(network, cpus=1)) for network in NETWORKS}
    idle = [row for row in grid if row["state"] == "idle"]
    rows = []
    for row in idle:
        costs = model_costs(specs[row["network"]])
        n, b = row["instances"], row["max_batch_size"]
        rows.append([1.0, n, n * costs.weight_bytes, n * b * costs.activation_bytes_per_sample])
    solution, *_ = np.linalg.lstsq(np.array(rows), np.array([r["measured_bytes"] for r in idle], float), rcond=None)
    pairs = {(r["network"], r["instances"], r["max_batch_size"]): r["measured_bytes"] for r in idle}
    extra, held = [], []
    for row in grid:
        if row["state"] == "saturated":
            costs = model_costs(specs[row["network"]])
            key = (row["network"], row["instances"], row["max_batch_size"])
            requests = row["queue_bound"] + row["instances"] * row["max_batch_size"]
            extra.append(row["measured_bytes"] - pairs[key])
            held.append([requests * costs.io_bytes_per_sample, requests])
    (buffer_factor, request_bytes), *_ = np.linalg.lstsq(np.array(held, float), np.array(extra, float), rcond=None)
    return {
        "baseline_bytes": int(solution[0]),
        "instance_bytes": int(solution[1]),
        "weight_factor": round(float(solution[2]), 3),
        "activation_factor": round(float(solution[3]), 3),
        "buffer_factor": round(float(buffer_factor), 3),
        "request_bytes": int(request_bytes),
        "measured": machine_note,
    }

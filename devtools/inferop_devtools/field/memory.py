"""Drill c, field reports 001 and 003: the memory model against the kernel's measured peak, on models it was
fitted to and on models it has never seen, and the OOM kill it prevents, one change at a time.

The constants in `inferop_core.memory.LOCAL_RUNTIME` were fitted on the fit set (both built-in networks x instances
1, 2 x maxBatchSize 1, 8, 32). The held-out set is what the fit never saw: a model with two inputs (the example
ranker, FP32 and INT64), a user's ONNX file whose activations dwarf its weights, and batches four and eight times
wider than the widest fitted. Every point is served at the queue bound the operator derives and measured idle and
saturated. The memory limit is the estimate x plan.MEMORY_MARGIN, the margin the fit set needs for its limits to
cover its peaks; the goal is that it covers the held-out peaks too, without being so large as to be useless. The
drill also fits the constants again on this run's fit set and shows what they predict for the held-out set.

Every pod runs on the local cluster's real node: each point is the operator's pod for its InferenceService, its peak
read from the memory cgroup the kubelet made for the Triton container; the OOM demonstration's renderings are
Deployments of the same image with the operator's environment, under the memory limit the kubelet writes.
"""

from __future__ import annotations

import math
import subprocess
import time
from dataclasses import asdict
from typing import Any

import numpy as np

from inferop_core.memory import LOCAL_RUNTIME, ModelCosts, RuntimeCosts, ServingShape, estimate_memory, in_flight
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING
from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.field.node import FieldNode, PodWatch, inference_service, triton_deployment
from inferop_devtools.field.pods import NETWORKS, ROOT, Machine, MiB, planned, pod_spec, rendered
from inferop_operator.plan import MEMORY_MARGIN, Refusal, memory_limit, model_costs, needed_limit_bytes, plan_service
from inferop_operator.spec import InferenceServiceSpec, parse_spec

Point = tuple[str, int, int]  # network, instances, maxBatchSize
FIT_SET: tuple[Point, ...] = tuple((n, i, b) for n in NETWORKS for i in (1, 2) for b in (1, 8, 32))
HELD_OUT: tuple[Point, ...] = (
    ("ranker", 1, 8),
    ("ranker", 2, 32),
    ("wide_activations", 1, 8),
    ("wide_activations", 2, 4),
    ("conv_net", 1, 128),
    ("inception_v3", 1, 64),
)
# The points of the make field run the constants were fitted on (its out/field/memory-points.json), kept: what
# tests/core/test_memory_measured.py holds the constants and the margin to, and docs/reference/memory.md shows.
MEASURED = ROOT / "tests" / "data" / "memory_measured.json"
# Requests per second the saturation offers at most (one asyncio loop of the load generator).
GENERATOR_RATE = 1500.0
# The most a limit may be over the peak it covers: beyond it the margin wastes more than it protects. One margin
# covers the spread of the estimate's errors: the limits on the measured points (docs/reference/memory.md) reach
# 1.57x, on the held-out ranker idle, whose estimate is 23% over its peak, with the margin that the conv net's
# 2 instances at batch 8 need (an estimate 22% under its peak).
LIMIT_OVER_PEAK_BOUND = 1.6
# The memory limit of the pods whose peaks are measured: above any of them, so that nothing is constrained.
UNCONSTRAINED = 8 * 2**30
WHERE = "the local cluster's node: containerd, runc and the kubelet; peaks from the Triton container's memory cgroup"


def saturate(watch: PodWatch, serving: ServingConfig, spec: InferenceServiceSpec, machine: Machine) -> bool:
    """Fill the queue: open-loop arrivals at three times the capacity (capped at what the generator sends).
    Returns whether it filled: a full queue rejects."""
    per_cpu = spec.model.profile.samples_per_cpu_second
    assert per_cpu is not None, "inferop export measures the capacity into the profile"
    capacity = per_cpu * serving.instances
    rate = min(3 * capacity, GENERATOR_RATE)
    result, _ = watch.open_loop(serving, rate, 8.0, spec.timeouts.request_seconds * 1.1, machine)
    return result.rejected > 0


def measure(point: Point, node: FieldNode) -> list[dict[str, Any]]:
    """The peak of the operator's pod for the point, idle (models loaded and warm) and saturated (its queue full),
    in the container's memory cgroup, with the estimate of each."""
    network, instances, batch = point
    changes = {"instances": instances, "batching.maxBatchSize": batch}
    raw = pod_spec(network, instances, memory=UNCONSTRAINED, changes=changes)
    spec = parse_spec(raw)
    serving = planned(raw)
    shape = ServingShape(instances, batch, serving.max_queue_size)
    costs = model_costs(spec)
    name = f"memory-{network}-x{instances}-b{batch}".replace("_", "-")
    with node.serving(inference_service(name, raw)) as watch:
        time.sleep(1.0)
        idle = watch.usage()["memory_peak_bytes"]
        filled = saturate(watch, serving, spec, node.machine)
        busy = watch.usage()["memory_peak_bytes"]
    rows = []
    for state, measured in (("idle", idle), ("saturated", busy)):
        estimate = estimate_memory(costs, shape, LOCAL_RUNTIME, saturated=state == "saturated")
        rows.append(
            {
                "network": network,
                "model": asdict(costs),
                "instances": instances,
                "max_batch_size": batch,
                "queue_bound": serving.max_queue_size,
                "inputs": len(serving.inputs),
                "state": state,
                # A pod faster than the generator's rate never fills its queue: its "saturated" peak is not one.
                "reached": state == "idle" or filled,
                "measured_bytes": measured,
                "estimate_bytes": estimate.total,
                "error": round(estimate.total / measured - 1, 4),
                "terms": asdict(estimate),
            }
        )
        print(
            f"  memory/{network}/x{instances}/b{batch}/{state}: measured {format_bytes(measured)}, "
            f"estimate {format_bytes(estimate.total)} ({rows[-1]['error']:+.0%})"
            + ("" if rows[-1]["reached"] else f"; the queue never filled at {GENERATOR_RATE:g} req/s: not judged")
        )
    return rows


def worst(rows: list[dict[str, Any]], key: str = "error") -> float | None:
    """The largest error in size among the rows that reached their state; None for none."""
    return max((abs(row[key]) for row in rows if row.get("reached", True)), default=None)


def estimated(points: list[dict[str, Any]], costs: RuntimeCosts = LOCAL_RUNTIME) -> list[dict[str, Any]]:
    """Measured points (a drill's rows, tests/data/memory_measured.json) with the estimate of `costs` for each."""
    return [
        {
            **point,
            "estimate_bytes": estimate_memory(
                ModelCosts(**point["model"]), shape_of(point), costs, saturated=point["state"] == "saturated"
            ).total,
        }
        for point in points
    ]


def margin_needed(rows: list[dict[str, Any]]) -> float:
    """The least margin, in hundredths, whose limits cover every measured peak in `rows`: their largest peak over its
    estimate, rounded up. plan.MEMORY_MARGIN is the fit set's."""
    return math.ceil(100 * max(row["measured_bytes"] / row["estimate_bytes"] for row in rows)) / 100


def limit_over_peak(row: dict[str, Any]) -> float:
    """The memory limit the plan writes for the row's estimate (plan.memory_limit: the margin on top, in whole MiB
    rounded up) over the peak measured: under 1, that limit is OOM-killed."""
    return parse_quantity(memory_limit(row["estimate_bytes"])) / row["measured_bytes"]


def drill_memory(machine: Machine) -> dict[str, Any]:
    """Field reports 001 and 003: the memory model against the measured peak, fitted and held out, and the OOM
    it prevents."""
    with FieldNode.up(machine, "memory") as node:
        for network in NETWORKS:  # the image's and the model's files paged in, as on a node that runs them
            with node.serving(inference_service(f"warm-{network}".replace("_", "-"), pod_spec(network, cpus=1))):
                pass
        fitted = [row for point in FIT_SET for row in measure(point, node)]
        held_out = [row for point in HELD_OUT for row in measure(point, node)]
        oom = oom_demonstration(node)
    return {"where": WHERE, **summarise(fitted, held_out), "oom": oom}


def summarise(fitted: list[dict[str, Any]], held_out: list[dict[str, Any]]) -> dict[str, Any]:
    """Errors and limits on each set, the margin the fit set needs, the constants fitted again on the fit set alone
    and what they predict for both, and the goal: held-out points only (a margin taken from the fit's own points
    covers them by construction)."""
    refit = calibrate(fitted, f"make field's fit set, {time.strftime('%Y-%m-%d')}")
    refit_costs = RuntimeCosts(name="refit", **refit)
    for row in (*fitted, *held_out):
        saturated = row["state"] == "saturated"
        again = estimate_memory(ModelCosts(**row["model"]), shape_of(row), refit_costs, saturated=saturated)
        row["refit_estimate_bytes"] = again.total
        row["refit_error"] = round(again.total / row["measured_bytes"] - 1, 4)
        row["limit_over_peak"] = round(limit_over_peak(row), 4)
    judged = [row["limit_over_peak"] for row in held_out if row.get("reached", True)]
    reached = [row for row in fitted if row.get("reached", True)]
    return {
        "fitted": fitted,
        "held_out": held_out,
        "constants": {k: v for k, v in asdict(LOCAL_RUNTIME).items() if k != "name"},
        "refit": refit,
        "worst_error_fitted": worst(fitted),
        "worst_error_held_out": worst(held_out),
        "worst_refit_error_held_out": worst(held_out, "refit_error"),
        "margin": MEMORY_MARGIN,
        "margin_needed_fitted": margin_needed(reached) if reached else None,
        "limit_over_peak_held_out": [min(judged), max(judged)] if judged else None,
        "goal": {
            "text": f"the memory limit (the estimate x {MEMORY_MARGIN}) covers every held-out measured peak, at most "
            f"{LIMIT_OVER_PEAK_BOUND:g}x it (models and batches the constants were not fitted on)",
            "met": bool(judged) and min(judged) >= 1 and max(judged) <= LIMIT_OVER_PEAK_BOUND,
        },
    }


def oom_demonstration(node: FieldNode) -> dict[str, Any]:
    """A limit the old estimate approved is OOM-killed at saturation; the new model refuses it first, and the size
    it recommends survives the same load. Between the two, one thing changes per run (the limit, the queue bound,
    ONNX Runtime's memory pattern), under the same scheduling policy, so each is seen to matter on its own."""
    network = "inception_v3"
    raw = pod_spec(network, cpus=1)
    base = parse_spec(raw)
    profile, batch = base.model.profile, base.batching.max_batch_size
    old_estimate = profile.weight_bytes + profile.activation_bytes_per_sample * batch
    old_limit = math.ceil(2 * old_estimate / MiB) * MiB  # twice the old estimate: a generous user's margin
    try:
        plan_service(parse_spec(pod_spec(network, cpus=1, memory=old_limit)), LOCAL_RUNTIME)
        refusal, recommended = "accepted", old_limit
    except Refusal as refused:
        refusal = refused.message
        recommended = needed_limit_bytes(plan_service(base, LOCAL_RUNTIME).memory.required_bytes)
    ours = planned(raw)
    derived, old_queue = ours.max_queue_size, 64  # 64: the fixed bound before it was derived
    # From the old deployment to inferop's, one change per run; then inferop's with each change undone alone.
    steps = (
        ("old estimate x 2", old_limit, old_queue, True),  # the old limit and the old rendering
        ("old estimate x 2", old_limit, derived, True),  # + the derived queue bound
        ("old estimate x 2", old_limit, derived, False),  # + memory pattern off: inferop's rendering
        ("recommended", recommended, derived, False),  # + the recommended limit: inferop's deployment
        ("recommended", recommended, old_queue, False),  # inferop's, the fixed queue back
        ("recommended", recommended, derived, True),  # inferop's, the memory pattern back
    )
    runs = [
        run_saturated(
            ours.model_copy(update={"max_queue_size": queue, "memory_pattern": pattern}), limit, label, raw, node, step
        )
        for step, (label, limit, queue, pattern) in enumerate(steps)
    ]
    return {"old_estimate": old_estimate, "old_limit": old_limit, "refusal": refusal, "runs": runs}


def run_saturated(
    serving: ServingConfig, limit: int, limit_label: str, raw: dict[str, Any], node: FieldNode, step: int
) -> dict[str, Any]:
    """`serving` as a Deployment of the node's Triton image with the operator's environment and scheduling policy at
    a memory limit of `limit`, saturated: whether the kernel's OOM killer took any of its processes."""
    row: dict[str, Any] = {
        "limit": limit,
        "limit_label": limit_label,
        "queue_bound": serving.max_queue_size,
        "memory_pattern": serving.memory_pattern,
    }
    limits = {"cpu": "1", "memory": f"{math.ceil(limit / MiB)}Mi"}
    name = f"memory-oom-{step}"
    deployment = triton_deployment(
        name, node.triton_image, node.repo(name, serving), limits, DEFAULT_CPU_SCHEDULING, rendered(raw).env
    )
    try:
        with node.serving(deployment, ready_seconds=180) as watch:
            saturate(watch, serving, parse_spec(raw), node.machine)
            time.sleep(1.0)  # an OOM kill may come late
            usage = watch.usage()
            container = watch.stop()
        # On cgroup v1 the OOM killer takes the largest process (a model's stub), not the whole container; a kill of
        # the server itself restarts the container.
        restarted = container["restartCount"] > 0
        last = container.get("lastState", {}).get("terminated", {}).get("reason")
        row |= {"survived": not restarted and usage["oom_kills"] == 0, "usage": usage, "restarted": last}
    except subprocess.CalledProcessError as error:  # never Ready: killed while loading, below the idle footprint
        row |= {"survived": False, "error": "never Ready: " + " ".join(error.__notes__ or [])[-400:]}
    print(
        f"  memory/oom: limit {format_bytes(limit)} ({limit_label}), queue {serving.max_queue_size}, memory pattern "
        f"{'on' if serving.memory_pattern else 'off'}: survived {row['survived']}"
    )
    return row


def shape_of(row: dict[str, Any]) -> ServingShape:
    return ServingShape(row["instances"], row["max_batch_size"], row["queue_bound"])


def calibrate(grid: list[dict[str, Any]], note: str) -> dict[str, Any]:
    """Least-squares constants of the memory model from measured rows (the origin of LOCAL_RUNTIME): the idle
    peaks fit the baseline and the per-instance, weight and activation factors; saturated minus idle, at each
    row's own queue bound, the buffer factor, the bytes of a request and those of a busy instance, over what
    inferop_core.memory.in_flight counts, as the estimate does (a queued request's inputs, an executing one's inputs
    and outputs, the requests, the instances). Only `grid` is used: rows held out of it cannot move the constants."""
    idle = [row for row in grid if row["state"] == "idle"]
    rows = []
    for row in idle:
        costs = ModelCosts(**row["model"])
        n, b = row["instances"], row["max_batch_size"]
        rows.append([1.0, n, n * costs.weight_bytes, n * b * costs.activation_bytes_per_sample])
    solution, *_ = np.linalg.lstsq(np.array(rows), np.array([r["measured_bytes"] for r in idle], float), rcond=None)
    pairs = {(r["network"], r["instances"], r["max_batch_size"]): r["measured_bytes"] for r in idle}
    extra, held = [], []
    for row in grid:
        if row["state"] == "saturated":
            key = (row["network"], row["instances"], row["max_batch_size"])
            counted = in_flight(ModelCosts(**row["model"]), shape_of(row))
            extra.append(row["measured_bytes"] - pairs[key])
            held.append([counted.tensor_bytes, counted.requests, counted.busy_instances])
    (buffer_factor, request_bytes, busy_instance_bytes), *_ = np.linalg.lstsq(
        np.array(held, float), np.array(extra, float), rcond=None
    )
    return {
        "baseline_bytes": int(solution[0]),
        "instance_bytes": int(solution[1]),
        "weight_factor": round(float(solution[2]), 3),
        "activation_factor": round(float(solution[3]), 3),
        "buffer_factor": round(float(buffer_factor), 3),
        "request_bytes": int(request_bytes),
        "busy_instance_bytes": int(busy_instance_bytes),
        "measured": note,
    }


def measured_points(drill: dict[str, Any]) -> list[dict[str, Any]]:
    """Each measured peak with what the estimate needs (the model's costs, the shape, idle or saturated) and the
    set it belongs to, left out where saturation never filled the queue: the data tests/core/test_memory_measured.py
    checks the constants against (tests/data/memory_measured.json)."""
    keys = ("network", "model", "instances", "max_batch_size", "queue_bound", "state", "measured_bytes")
    return [
        {"set": name, **{key: row[key] for key in keys}}
        for name in ("fitted", "held_out")
        for row in drill[name]
        if row.get("reached", True)
    ]

"""Drill b, field report 001: Inception V3 at 2x and 4x its capacity, naive against inferop, at two CPU quotas, on
the local cluster's real node.

The queue bound is derived from the pod's capacity (inferop_core.capacity): the share of export's figure it assumes
was fitted on earlier runs of this drill, and each run checks it again. The drill runs at one CPU and at half a CPU, a
slower machine emulated with the CFS quota the kubelet writes for a limit of 500m. At each quota: the callers the pod
answers within half the timeout are admitted (closed-loop callers, at most 2% of their calls rejected, p99 within
half the timeout), and open-loop overload beyond them meets the drill's goals, with the kubelet running the
operator's liveness probe (a heavy load must not read as a stall).

inferop's pod is the operator's for the InferenceService, its memory limit the least the operator accepts (the
estimate with the margin, the local image's measured baseline in runtime.memoryOverhead), and its callers reach it
through Envoy, with the circuit breaker the operator's BackendTrafficPolicy gives Envoy Gateway
(gateway/standalone.py): what the pod would reject is refused before its body reaches it. Envoy runs on the callers'
CPU, as a gateway runs on other machines than the pods. The same pod called directly, without the gateway, is the
ablation: admission removed, everything else equal, at 1 CPU. The naive deployment is a Deployment of the same image
with Triton's and ONNX Runtime's defaults, called directly.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from inferop.limits import CFS_PERIOD_US
from inferop.openloop import OpenLoopResult
from inferop.openloop import plot as plot_open_loop
from inferop_core.capacity import (
    SERVED_SHARE_OF_CAPACITY,
    WAIT_SHARE_OF_TIMEOUT,
    answerable_callers,
    gateway_admission,
    rate_answering_admitted,
)
from inferop_core.memory import LOCAL_RUNTIME
from inferop_core.quantity import format_bytes
from inferop_core.scheduling import DEFAULT_CPU_SCHEDULING
from inferop_core.tritonconfig import ServingConfig
from inferop_devtools.field.node import FieldNode, PodWatch, inference_service, triton_deployment
from inferop_devtools.field.pods import (
    NAIVE_SCHEDULING,
    OUT,
    Machine,
    at_most,
    closed_loop,
    describe,
    naive,
    planned,
    pod_spec,
)
from inferop_devtools.field.work import Work, work_between
from inferop_devtools.gateway.standalone import StandaloneEnvoy
from inferop_operator.plan import needed_limit_bytes, plan_service
from inferop_operator.spec import parse_spec

NETWORK = "inception_v3"
# CPU quotas of the server's pod.
QUOTAS = (1.0, 0.5)
# Of the calls of the callers the pod answers within half the timeout (at the capacity measured just before).
MAX_REJECTED_SHARE = 0.02
WINDOW_SECONDS = 15.0  # closed-loop measurements of the capacity
# Samples answered in time at 2x and 4x against the pod's capacity in the same run (inferop_devtools.field.work): a
# pod that keeps computing full batches with its whole CPU and answers each in time serves all of it. Two runs on a
# 2 GHz Xeon (2026-12-03) gave 0.95-0.99, the lowest at 2x, where Poisson gaps leave some batches partial.
GOODPUT_SHARE = 0.9
# Points of the pod's CPU its model may lose during the arrivals against a closed-loop window: overload that reaches
# the pod is read and rejected there, by tritonserver's threads, out of the model's quota. On that Xeon the share
# moved by at most 0.1 point in the drill's runs through the gateway, and fell by 1.8 and 2.9 points with the gateway
# removed, where the goodput goal failed one window of two; the drill's ablation runs show it again.
MODEL_CPU_SHARE_LOSS = 0.01
INFEROP, ABLATION, NAIVE = "inferop", "inferop without the gateway", "naive"


def drill_overload(machine: Machine, seconds: float = 60.0) -> dict[str, Any]:
    """Field report 001: Inception V3 at 2x and 4x its measured capacity, naive against inferop, per CPU quota."""
    with FieldNode.up(machine, "overload") as node:
        quotas = [measure_quota(node, cpus, seconds if cpus >= 1 else 40.0) for cpus in QUOTAS]
    goals = [(f"{q['cpus']:g} CPU: {text}", met) for q in quotas for text, met in q["goals"]]
    ablated = [q for q in quotas if q["ablation_goals"]]
    goals += [
        (
            f"{q['cpus']:g} CPU: {ABLATION}, the same pod called directly: at least one of the goals above fails",
            not all(met for _, met in q["ablation_goals"]),
        )
        for q in ablated
    ]
    return {
        "where": "the local cluster's node: containerd, runc and the kubelet",
        "network": NETWORK,
        "quotas": quotas,
        "served_share_of_capacity": SERVED_SHARE_OF_CAPACITY,
        "goals": [{"text": text, "met": met} for text, met in goals],
        "goal": {"text": "all overload goals, at every CPU quota", "met": all(met for _, met in goals)},
    }


@dataclass(frozen=True)
class QuotaPod:
    """inferop's Inception pod at one CPU quota, as the operator sizes it: the InferenceService's spec with its memory
    limit from the estimate (as the manifest sizes it), and the serving config the operator renders for it."""

    cpus: float
    raw: dict[str, Any]
    timeout: float  # requestSeconds
    memory: int
    ours: ServingConfig
    exported: float  # export's capacity at this quota: what the bound was derived from

    @property
    def batch_round(self) -> int:
        """Samples the pod computes at once, a batch per instance executing: its callers wait a round at a time."""
        return self.ours.executing * self.ours.max_batch_size

    @property
    def admitted(self) -> int:
        """What the gateway lets this one pod hold (the operator's BackendTrafficPolicy)."""
        ours = self.ours
        assert ours.max_queue_size is not None, "the operator always bounds the queue"
        return gateway_admission(1, ours.instances, ours.executing, ours.max_batch_size, ours.max_queue_size)

    @property
    def capacity_callers(self) -> int:
        """Enough closed-loop callers that the batcher always forms full batches, as it does under overload: two for
        each instance's batch (those taking turns hold the next batch while one executes)."""
        return 2 * self.ours.instances * self.ours.max_batch_size

    @property
    def limits(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.raw["resources"]["limits"].items()}

    def name(self, deployment: str, what: str) -> str:
        """A name for one pod of `deployment` (`what` it is for), at this quota."""
        prefix = {INFEROP: "inferop", ABLATION: "direct", NAIVE: "naive"}[deployment]
        return f"{prefix}-{round(self.cpus * 1000)}m-{what}".replace(".", "-")

    def manifest(self, node: FieldNode, deployment: str, what: str) -> dict[str, Any]:
        """The operator's InferenceService for inferop's pod (the ablation's too); naive's, a Deployment of the image
        by hand."""
        name = self.name(deployment, what)
        if deployment != NAIVE:
            return inference_service(name, self.raw)
        repo = node.repo(name, naive(self.ours))
        return triton_deployment(name, node.triton_image, repo, self.limits, NAIVE_SCHEDULING)

    @contextlib.contextmanager
    def gateway(self, watch: PodWatch, machine: Machine, used: bool = True) -> Iterator[StandaloneEnvoy | None]:
        """Envoy in front of the pod, on the callers' CPU; None where the callers go straight to the pod."""
        if not used:
            yield None
            return
        with StandaloneEnvoy(watch.url, self.admitted, machine.client_cpus) as envoy:
            yield envoy


def quota_pod(cpus: float) -> QuotaPod:
    # The operator's fit counts the local image's baseline, which the memory drill measures, not NVIDIA's; the
    # memory limit is the least it accepts: the estimate with the margin, as `inferop export` writes it.
    local_baseline = {"runtime": {"memoryOverhead": str(LOCAL_RUNTIME.baseline_bytes)}}
    unlimited = parse_spec(pod_spec(NETWORK, cpus=cpus, changes=local_baseline))
    memory = needed_limit_bytes(plan_service(unlimited).memory.required_bytes)
    raw = pod_spec(NETWORK, cpus=cpus, memory=memory, changes=local_baseline)
    per_cpu = unlimited.model.profile.samples_per_cpu_second
    assert per_cpu is not None, "inferop export measures the capacity into the profile"
    return QuotaPod(
        cpus=cpus,
        raw=raw,
        timeout=unlimited.timeouts.request_seconds,
        memory=memory,
        ours=planned(raw),
        exported=per_cpu * cpus,
    )


def measure_quota(node: FieldNode, cpus: float, seconds: float) -> dict[str, Any]:
    quota = quota_pod(cpus)
    machine, timeout, ours = node.machine, quota.timeout, quota.ours
    exported, batch_round, callers = quota.exported, quota.batch_round, quota.capacity_callers

    # The capacity of this config sets the offered rates. Each inferop run measures it again on its own pod just
    # before and just after its arrivals: consecutive windows of the same pod here differ by up to 15%.
    with node.serving(quota.manifest(node, INFEROP, "capacity")) as watch, quota.gateway(watch, machine) as gateway:
        assert gateway is not None
        capacity = closed_loop(gateway.url, NETWORK, callers, WINDOW_SECONDS, machine).throughput
        answerable = answerable_callers(capacity, timeout, batch_round)
        admission = closed_loop(gateway.url, NETWORK, answerable, 20.0, machine)
        (triton,) = (c for c in watch.pod["spec"]["containers"] if c["name"] == "triton")
        probe = {key: value for key, value in triton["livenessProbe"].items() if key != "exec"}
        grace = watch.pod["spec"]["terminationGracePeriodSeconds"]
    calls = admission.requests + admission.errors
    admission_row = {
        "callers": answerable,
        "capacity_before": round(capacity, 3),
        "calls": calls,
        "rejected": admission.errors,
        "rejected_share": round(admission.errors / calls, 4) if calls else None,
        "p99_ms": admission.p99_ms,
        "throughput": round(admission.throughput, 3),
        "first_error": admission.first_error,
    }
    print(
        f"  overload/{cpus:g} CPU: capacity {capacity:.2f} img/s (export's {exported:.2f}) under {quota.limits}; "
        f"queue bound {ours.max_queue_size}; {answerable} callers: {admission.errors} of {calls} calls rejected, "
        f"p99 {admission.p99_ms:.0f} ms"
    )

    runs: list[dict[str, Any]] = []
    factors: tuple[float, ...] = (1.0, 2.0, 4.0) if cpus >= 1 else (2.0, 4.0)
    plans: list[tuple[str, tuple[float, ...], float | None]] = [(INFEROP, factors, timeout * 1.1)]
    if cpus >= 1:
        plans += [(ABLATION, (2.0, 4.0), timeout * 1.1), (NAIVE, (2.0, 4.0), None)]
    for label, levels, caller_timeout in plans:
        for factor in levels:
            serving, policy = (naive(ours), NAIVE_SCHEDULING) if label == NAIVE else (ours, DEFAULT_CPU_SCHEDULING)
            run = overloaded(label, quota, serving, capacity * factor, seconds, caller_timeout, node, f"{factor:g}x")
            result, usage, paired = run.result, run.usage, run.capacity_windows
            probe_runs, refused = run.liveness, run.refused_at_gateway
            around = sum(paired) / len(paired) if paired else None
            in_run, served = run.capacity_in_run, answered_rate(result)
            plot = OUT / f"overload-{quota.name(label, f'{factor:g}x')}.png"
            plot_open_loop(result, plot)
            runs.append(
                {
                    "deployment": label,
                    "factor": factor,
                    "config": describe(serving, policy),
                    "capacity_in_run": None if in_run is None else round(in_run, 3),
                    "answered_rate": None if served is None else round(served, 3),
                    "work": None if run.work is None else run.work.as_dict(),
                    "work_at_capacity": None if run.work_at_capacity is None else run.work_at_capacity.as_dict(),
                    "capacity_around": None if around is None else round(around, 3),
                    "capacity_windows": [round(value, 3) for value in paired],
                    "served_share_of_export": round(result.goodput / exported, 3),
                    "result": result.as_dict(),
                    "refused_at_gateway": refused,
                    "usage": usage,
                    "server_alive": run.alive,
                    "liveness": probe_runs,
                    "plot": plot.name,
                }
            )
            failures = "" if probe_runs is None else f", liveness failed {probe_runs['failures']}/{probe_runs['runs']}"
            print(
                f"  overload/{cpus:g} CPU/{label}/{factor:g}x: goodput {result.goodput:.2f}"
                f"{'' if in_run is None else f' ({served or 0:.2f} answered, capacity in the run {in_run:.2f})'}"
                f"{'' if around is None else f' (capacity around it {around:.2f})'}, ok p99 "
                f"{result.latency_ms.get('p99', float('nan')):.0f} ms, rejected {result.rejected}"
                f"{'' if refused is None else f' ({refused} at the gateway)'}, "
                f"peak {format_bytes(float(usage['memory_peak_bytes']))}, OOM kills {usage['oom_kills']}{failures}"
            )
    return {
        "cpus": cpus,
        "limits": ", ".join(f"{key} {value}" for key, value in quota.limits.items()),
        "memory_limit": quota.memory,
        "exported_capacity": round(exported, 3),
        "capacity": round(capacity, 3),
        "capacity_callers": callers,
        "timeout_seconds": timeout,
        "queue_bound": ours.max_queue_size,
        "gateway_admits": quota.admitted,
        "liveness_probe": probe,
        "grace_seconds": grace,
        "seconds": seconds,
        "admission": admission_row,
        "runs": runs,
        "goals": quota_goals(runs, admission_row, timeout, batch_round, quota.admitted, cpus),
        "ablation_goals": quota_goals(runs, None, timeout, batch_round, quota.admitted, cpus, ABLATION),
    }


def overloaded(
    label: str,
    quota: QuotaPod,
    serving: ServingConfig,
    rate: float,
    seconds: float,
    caller_timeout: float | None,
    node: FieldNode,
    what: str,
) -> Overloaded:
    """A fresh pod at `quota` serving `serving`, offered `rate` open-loop; for inferop's pod (behind its gateway, or
    not in the ablation) also what it did with its time in a capacity window just before and during the arrivals,
    the capacity measured just before and just after, the kubelet's runs of its liveness probe and what the gateway
    refused."""
    machine, callers = node.machine, quota.capacity_callers
    if label == NAIVE:
        with node.serving(quota.manifest(node, label, what)) as watch:
            watch.reset_peak()
            result, usage = watch.open_loop(serving, rate, seconds, caller_timeout, machine)
            time.sleep(1.0)  # an OOM kill may come late
            return Overloaded(result, watch.usage(), watch.alive())
    with (
        node.serving(quota.manifest(node, label, what)) as watch,
        quota.gateway(watch, machine, used=label == INFEROP) as gateway,
    ):
        url = watch.url if gateway is None else gateway.url

        def work_of(run: Callable[[], Any]) -> tuple[Any, Work]:
            before = watch.work(serving.name)
            outcome = run()
            return outcome, work_between(before, watch.work(serving.name), serving.max_batch_size, serving.executing)

        window, at_capacity = work_of(lambda: closed_loop(url, NETWORK, callers, WINDOW_SECONDS, machine))
        paired = [window.throughput]
        watch.reset_peak()  # the peak of the arrivals alone
        refused_before = None if gateway is None else gateway.refused()
        probes_before = watch.liveness_runs()
        (result, usage), work = work_of(lambda: watch.open_loop(serving, rate, seconds, caller_timeout, machine, url))
        probes = watch.liveness_runs()
        probes.subtract(probes_before)
        refused = None if gateway is None or refused_before is None else gateway.refused() - refused_before
        time.sleep(1.0)  # an OOM kill may come late
        alive = watch.alive()
        if alive:
            paired.append(closed_loop(url, NETWORK, callers, WINDOW_SECONDS, machine).throughput)
    liveness = {"runs": sum(probes.values()), "failures": sum(probes.values()) - probes["successful"]}
    return Overloaded(result, usage, alive, paired, liveness, refused, work, at_capacity)


def cpu_share_kept(work: dict[str, Any] | None, at_capacity: dict[str, Any] | None) -> bool:
    """Whether the model's share of the pod's CPU during the arrivals stayed within MODEL_CPU_SHARE_LOSS of its
    share in the closed-loop window; not measured is a failure."""
    during = None if work is None else work["model_cpu_share"]
    before = None if at_capacity is None else at_capacity["model_cpu_share"]
    return during is not None and before is not None and during >= before - MODEL_CPU_SHARE_LOSS


def answered_rate(result: OpenLoopResult) -> float | None:
    """Samples answered in time a second, from the first arrival to the last answer (the arrivals' drain included):
    a window that ends at a fixed second would cut off up to a whole batch, 5% of a 40 s run at half a CPU, which is
    the measure's edge and not the pod. None when nothing was answered."""
    answered = [outcome.finished_at for outcome in result.outcomes if outcome.kind == "ok"]
    return len(answered) * result.batch / max(answered) if answered else None


@dataclass(frozen=True)
class Overloaded:
    result: OpenLoopResult
    usage: dict[str, Any]
    alive: bool
    capacity_windows: list[float] = field(default_factory=list)  # closed-loop, just before and just after
    liveness: dict[str, Any] | None = None
    refused_at_gateway: int | None = None
    work: Work | None = None  # what the pod did during the arrivals
    work_at_capacity: Work | None = None  # and in the capacity window before them

    @property
    def capacity_in_run(self) -> float | None:
        """The pod's capacity during the arrivals, from its own figures: the rate of its full batches, raised by the
        CPU share its model lost to the rest of the pod against the capacity window (requests read and refused
        inside the pod take the model's quota, and its full batches slow down with it)."""
        work, reference = self.work, self.work_at_capacity
        if work is None or reference is None or work.full_batch_rate is None:
            return None
        if not work.model_cpu_share or not reference.model_cpu_share:
            return None
        return work.full_batch_rate * max(1.0, reference.model_cpu_share / work.model_cpu_share)


def quota_goals(
    runs: list[dict[str, Any]],
    admission: dict[str, Any] | None,
    timeout: float,
    batch_round: int,
    admitted: int,
    cpus: float,
    deployment: str = INFEROP,
) -> list[tuple[str, bool]]:
    """The goals of `deployment`'s runs at one quota, with the admission's where it is given; none for a deployment
    that did not run there."""
    ours = {run["factor"]: run for run in runs if run["deployment"] == deployment}
    if not ours:
        return []
    # A quota below one CPU holds the pod for the rest of each period once it is spent: an arrival then waits up to
    # (1 - cpus) x the kubelet's 100 ms period before the server can even read it.
    throttle_ms = (1 - min(cpus, 1.0)) * CFS_PERIOD_US / 1e3
    reject_ms = 50.0 + throttle_ms
    throttled = f": 50 + {throttle_ms:g} the CFS quota may hold it" if throttle_ms else ""
    goals = [] if admission is None else [admission_goal(admission, timeout)]
    # what the gateway admits is sized from export's capacity
    holds_admitted = rate_answering_admitted(admitted, timeout, batch_round)
    for factor in (2.0, 4.0):
        run = ours[factor]
        result, usage, capacity, served = run["result"], run["usage"], run["capacity_in_run"], run["answered_rate"]
        latency = result["latency_ms"]
        # The bound's promise: the full queue and the batch ahead are served at the pod's rate, then its own batch.
        two_batches_ms = 2 * batch_round / capacity * 1e3 if capacity else None
        goals += [
            (f"{factor:g}x: no OOM kill", usage["oom_kills"] == 0 and run["server_alive"]),
            (
                f"{factor:g}x: answered in time >= {GOODPUT_SHARE:g} x the pod's capacity in the same run (the rate of "
                "its full batches, with the CPU its model lost to the rest of the pod given back)",
                capacity is not None and served is not None and served >= GOODPUT_SHARE * capacity,
            ),
            (
                f"{factor:g}x: the pod's CPU stays with its model: its share at most {MODEL_CPU_SHARE_LOSS * 100:g} "
                "point below a closed-loop window's (overload that reaches the pod is read there, out of its quota)",
                cpu_share_kept(run["work"], run["work_at_capacity"]),
            ),
            (
                f"{factor:g}x: goodput >= {holds_admitted:.2f} img/s, the rate that answers the {admitted} requests "
                "the gateway admits (from export's capacity, not the run's) within half the timeout + two batches",
                result["goodput"] >= holds_admitted,
            ),
            (
                f"{factor:g}x: every accepted request within requestSeconds + 10%",
                at_most(latency.get("max"), timeout * 1.1e3) and result["client_timeout"] == 0,
            ),
            (
                f"{factor:g}x: accepted p99 <= half the timeout + two batches at the capacity in the run",
                two_batches_ms is not None and at_most(latency.get("p99"), timeout * 0.5e3 + two_batches_ms),
            ),
            (
                f"{factor:g}x: rejected at once (from the send to the rejection, p99 < {reject_ms:g} ms{throttled})",
                result["rejected"] > 0 and at_most(result["reject_ms"].get("p99"), reject_ms),
            ),
            (
                f"{factor:g}x: the liveness probe never failed (no restart under a heavy, healthy load)",
                run["liveness"] is not None and run["liveness"]["runs"] > 0 and run["liveness"]["failures"] == 0,
            ),
        ]
        if 1.0 in ours:
            base_peak = ours[1.0]["usage"]["memory_peak_bytes"]
            goals.append((f"{factor:g}x: peak within 10% of 1x", usage["memory_peak_bytes"] <= 1.1 * base_peak))
    return goals


def admission_goal(admission: dict[str, Any], timeout: float) -> tuple[str, bool]:
    return (
        f"{admission['callers']} closed-loop callers (those the pod answers within half the timeout at the capacity "
        f"measured before): at most {MAX_REJECTED_SHARE:.0%} of their calls rejected, p99 within half the timeout",
        at_most(admission["rejected_share"], MAX_REJECTED_SHARE)
        and at_most(admission["p99_ms"], timeout * WAIT_SHARE_OF_TIMEOUT * 1e3),
    )

"""A pod's capacity and the queue bound derived from it: callers a pod answers in time are admitted, overload
beyond them is rejected at the door.

A fixed queue length suits no model: 64 queued Inception V3 images on one CPU are 8 s of work, 64 boards of
the conv net are 40 ms. Little's law turns a wait into a queue length: requests queued = capacity x wait. The wait
is half the request timeout, at the rate a served pod keeps: the queue holds every caller the pod can answer within
half the timeout, and a full queue rejects the rest at once instead of letting them wait out the timeout.

N closed-loop callers of a model that runs batches of B wait for the requests ahead of them, a batch at a time: at
most ceil(N / B) batches of B / capacity, so the callers answered within half the timeout are capacity x timeout / 2
less one batch round (`answerable_callers`).
The queue must hold all of them at once, not the queue and the batch in execution: Triton answers a batch before
the next leaves its queue, and when its callers send again the queue holds the whole round (27 closed-loop callers
of Inception V3, 1 CPU, maxBatchSize 8, had 19% of their calls rejected at a bound of 24 and none at 32). Under
overload an admitted request waits for the full queue and the batch ahead of it, then runs its own: about half
the timeout plus two batches, where the pod serves the share of export's capacity that the bound assumes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferop_core.threads import ThreadPlan

# Share of the request timeout an admitted request may spend queued, at the rate a served pod keeps.
WAIT_SHARE_OF_TIMEOUT = 0.5
# Share of the measured capacity (ONNX Runtime in-process, one thread) that a served pod delivers, the rate the
# bound is sized at. It must be high enough that the queue holds the callers the pod answers within half the timeout
# at the rate it serves them (share >= served / export less a batch round's part of the bound) and low enough that
# an admitted request under overload waits at most half the timeout plus two batches (share <= overloaded / export
# plus that part). Chosen on `make field`'s overload drill behind the gateway (2026-12-05, a 2-core AMD EPYC,
# Inception V3 at 1 CPU, one instance): closed-loop callers were served about 0.96-0.98 of export's figure, Poisson
# overload about 0.93, which allow 0.90-1.01; a 2 GHz Xeon's callers 1.07 (allowing 0.87 and above). Held out
# (2026-12-06, another EPYC, two instances taking turns): closed loop 0.96-1.00 and 0.91-0.93 at 1 and 0.5 CPU,
# overload 0.92-0.96 and 0.88-0.92, inside the 0.82-1.10 and 0.58-1.23 they allow. The drill checks it on every run
# (its admission and overload goals at both quotas); tests/core/test_capacity.py holds it to the measured rows.
SERVED_SHARE_OF_CAPACITY = 0.95
# Most requests a derived bound queues. Each waiting request holds a connection and Triton's request object
# (about 15 KiB measured, beyond its tensors), and for fast models Little's law allows thousands: the conv
# net's 4,224 held 62 MiB, twelve times its weights, for no throughput. 1,024 are over a second of its work.
MAX_DERIVED_QUEUE = 1024
# Without a measured capacity: this many rounds of batches (instances x maxBatchSize each).
UNKNOWN_CAPACITY_ROUNDS = 2

# The derivation in words, from the constants above: the spec's field description (the CRD, `kubectl explain`) says
# it, so no text restates a number by hand.
QUEUE_BOUND_RULE = (
    f"Little's law, so that the callers a pod answers within {WAIT_SHARE_OF_TIMEOUT:g} x timeouts.requestSeconds are "
    f"admitted: capacity x {SERVED_SHARE_OF_CAPACITY:g} x requestSeconds x {WAIT_SHARE_OF_TIMEOUT:g} "
    f"({SERVED_SHARE_OF_CAPACITY:g}: the share of its measured capacity a served pod delivers), at least one batch "
    f"(maxBatchSize), at most {MAX_DERIVED_QUEUE}"
)
UNKNOWN_CAPACITY_RULE = f"{UNKNOWN_CAPACITY_ROUNDS} x maxBatchSize x instances"


@dataclass(frozen=True)
class QueueBound:
    size: int
    source: str  # "spec", "capacity" or "unknown capacity"
    capacity: float | None  # samples per second of the pod, when known

    def explain(self, timeout_seconds: float) -> str:
        if self.source == "spec":
            return f"queue bound {self.size} (batching.maxQueueSize)"
        if self.capacity is None:
            return (
                f"queue bound {self.size} = 2 rounds of batches: capacity unknown (no "
                "model.profile.samplesPerCpuSecond; re-export to measure it, or set batching.maxQueueSize)"
            )
        return (
            f"queue bound {self.size} = {self.capacity:.3g} samples/s x {SERVED_SHARE_OF_CAPACITY:g} served x "
            f"{timeout_seconds:g}s x {WAIT_SHARE_OF_TIMEOUT:g}, at least one batch, at most {MAX_DERIVED_QUEUE}"
        )


def pod_capacity(samples_per_cpu_second: float | None, threads: ThreadPlan) -> float | None:
    """Samples per second of a pod: the measured rate of one CPU times the CPUs its threads can use (those of the
    instances that execute at once)."""
    if samples_per_cpu_second is None:
        return None
    busy_cpus = min(threads.cpus, threads.executing * threads.intra_op)
    return samples_per_cpu_second * busy_cpus


def derive_queue_bound(
    capacity: float | None, timeout_seconds: float, instances: int, max_batch_size: int, requested: int | None = None
) -> QueueBound:
    """The requested bound if set; else Little's law on what a served pod delivers in half the timeout, at most
    MAX_DERIVED_QUEUE, never below one full batch so batches can still form. Unknown capacity: two rounds of
    batches."""
    if requested is not None:
        return QueueBound(requested, "spec", capacity)
    batch_round = instances * max_batch_size
    if capacity is None:
        return QueueBound(UNKNOWN_CAPACITY_ROUNDS * batch_round, "unknown capacity", None)
    little = math.floor(capacity * SERVED_SHARE_OF_CAPACITY * timeout_seconds * WAIT_SHARE_OF_TIMEOUT)
    return QueueBound(max(max_batch_size, min(MAX_DERIVED_QUEUE, little)), "capacity", capacity)


def answerable_callers(served: float, timeout_seconds: float, batch_round: int) -> int:
    """Closed-loop callers a pod serving `served` samples a second answers within half the timeout: each waits for
    the requests ahead of it a batch round at a time, at most ceil(N / round) rounds, so one round less than Little's
    law allows. What the queue bound must admit (the overload drill's callers, test_capacity's measured rows)."""
    return max(0, math.floor(served * timeout_seconds * WAIT_SHARE_OF_TIMEOUT) - batch_round)


def rate_answering_admitted(admitted: int, timeout_seconds: float, batch_round: int) -> float:
    """The rate (samples a second) at which a pod answers `admitted` requests within half the timeout plus two
    batches, the promise to what a gateway admits under overload: the last of them waits for the others and the
    batch ahead of it, (admitted + round) / rate."""
    return (admitted - batch_round) / (timeout_seconds * WAIT_SHARE_OF_TIMEOUT)


def gateway_admission(pods: int, instances: int, executing: int, max_batch_size: int, queue_bound: int) -> int:
    """Requests a gateway in front of `pods` lets them hold at once: each pod's queue bound, or where that is less,
    what keeps a full batch ready for every instance: a batch for each instance (executing, or holding the next while
    another executes: instances taking turns) and one queued for each that executes at once. Beyond it the gateway
    refuses at once, before the body reaches a pod: receiving and rejecting Inception V3's 1 MB images at 4x its
    capacity took 4.5-5.5% of a one-CPU pod (tritonserver's own threads), which its model then lacked. Not the bound
    plus a batch in execution: Triton answers a batch before the next leaves its queue, and the requests the gateway
    then lets in found the queue full (338 of 1,519 rejections reached the pod on a 2 GHz Xeon; 4x goodput 0.78 of
    capacity, and 1.02 with this count, in single runs). Not a batch queued for each instance taking turns either:
    at half a CPU, two instances taking turns and four batches admitted, Inception V3's accepted requests waited
    7.8 s (p99), and 5.8 / 6.0 s with the three batches that keep them busy. Each pod's own bound still applies
    behind it."""
    return pods * max(queue_bound, (instances + executing) * max(max_batch_size, 1))

"""A pod's capacity and the queue bound derived from it: callers a pod answers in time are admitted, overload
beyond them is rejected at the door.

A fixed queue length suits no model: 64 queued Inception V3 images on one CPU are 8 s of work, 64 boards of
the conv net are 40 ms. Little's law turns a wait into a queue length: requests queued = capacity x wait. The wait
is half the request timeout, at the rate a pod keeps under overload: the queue holds every caller the pod can answer
within half the timeout, and a full queue rejects the rest at once instead of letting them wait out the timeout.

Nothing is subtracted for the batch in execution. Triton's bound counts queued requests only (measured: with a
batch of 8 held in execution, 8 more were queued and the next 4 rejected), but when a batch's callers send again
before the next batch has left the queue, the queue holds all of them at once: 27 closed-loop callers of
Inception V3 (1 CPU, maxBatchSize 8) had 19% of their calls rejected at a bound of 24 and none at 32. The batch in
execution is that margin. The price is under overload: an accepted request waits for the full queue and the batch
ahead of it, then runs its own, about half the timeout plus two batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferop_core.threads import ThreadPlan

# Share of the request timeout an admitted request may spend queued, at the rate a pod keeps under overload.
WAIT_SHARE_OF_TIMEOUT = 0.5
# Share of the measured capacity (ONNX Runtime in-process, one thread) that a served pod delivers under
# overload, where receiving and rejecting the excess shares its CPUs. Fitted with `make field`'s overload drill on
# one CPU at 2x and 4x load (0.83 to 1.04 of export's figure over three runs); the drill reports it again on a
# fraction of a CPU, where it was not fitted.
SERVED_SHARE_OF_CAPACITY = 0.8
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
    f"({SERVED_SHARE_OF_CAPACITY:g}: what a pod keeps of its capacity while it rejects overload), at least one batch "
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
            f"queue bound {self.size} = {self.capacity:.3g} samples/s x {SERVED_SHARE_OF_CAPACITY:g} served under "
            f"overload x {timeout_seconds:g}s x {WAIT_SHARE_OF_TIMEOUT:g}, at least one batch, at most "
            f"{MAX_DERIVED_QUEUE}"
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
    """The requested bound if set; else Little's law on what a served pod delivers under overload in half the
    timeout, at most MAX_DERIVED_QUEUE, never below one full batch so batches can still form. Unknown capacity:
    two rounds of batches."""
    if requested is not None:
        return QueueBound(requested, "spec", capacity)
    batch_round = instances * max_batch_size
    if capacity is None:
        return QueueBound(UNKNOWN_CAPACITY_ROUNDS * batch_round, "unknown capacity", None)
    little = math.floor(capacity * SERVED_SHARE_OF_CAPACITY * timeout_seconds * WAIT_SHARE_OF_TIMEOUT)
    return QueueBound(max(max_batch_size, min(MAX_DERIVED_QUEUE, little)), "capacity", capacity)


def gateway_admission(pods: int, instances: int, max_batch_size: int, queue_bound: int) -> int:
    """Requests a gateway in front of `pods` lets them hold at once: each pod's queue bound (two batch rounds where
    the bound is smaller, so a batch always waits while one runs). Beyond it the gateway refuses at once, before the
    body reaches a pod: receiving and rejecting Inception V3's 1 MB images at 4x its capacity took 4.5-5.5% of a
    one-CPU pod (tritonserver's own threads), which its model then lacked. Not the bound plus a batch in execution:
    Triton answers a batch before the next leaves its queue, and the requests the gateway then lets in found the
    queue full (338 of 1,519 rejections reached the pod on a 2 GHz Xeon; 4x goodput 0.78 of capacity, and 1.02
    with this count, in single runs). Each pod's own bound still applies behind it."""
    return pods * max(queue_bound, 2 * instances * max(max_batch_size, 1))

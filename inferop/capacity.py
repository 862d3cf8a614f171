"""A pod's capacity and the queue bound derived from it, so an accepted request is answered in time.

A fixed queue length suits no model: 64 queued Inception V3 images on one CPU are 8 s of work, 64 boards of
the conv net are 40 ms. Little's law turns the wait a caller accepts into a queue length: requests queued =
capacity x wait. The wait allowed is half the request timeout, so a request that gets in is answered well
before it would time out, and overload is rejected at the door instead of waiting out the timeout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferop.threads import ThreadPlan

# Share of the request timeout an accepted request may spend in the server, queue and execution together.
WAIT_SHARE_OF_TIMEOUT = 0.5
# Share of the measured capacity (ONNX Runtime in-process, one thread) that a served pod delivers under
# overload, where receiving and rejecting the excess shares its CPUs. Measured with `make field`, Inception V3
# on one CPU at 2x and 4x load: 0.83 to 1.04 of export's figure over three runs; with the whole figure, the
# accepted p99 ran 11% past half the timeout at 4x.
SERVED_SHARE_OF_CAPACITY = 0.8
# Batches also ahead of a queued request's answer: the one executing, its own, and one for the spread of
# batch times (measured: with two, Inception V3's accepted p99 ran 9% past half its timeout at 2x load).
ROUNDS_OF_BATCHES = 3
# Most requests a derived bound queues. Each waiting request holds a connection and Triton's request object
# (about 15 KiB measured, beyond its tensors), and for fast models Little's law allows thousands: the conv
# net's 4,224 held 62 MiB, twelve times its weights, for no throughput. 1,024 are over a second of its work.
MAX_DERIVED_QUEUE = 1024


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
            f"overload x {timeout_seconds:g}s x {WAIT_SHARE_OF_TIMEOUT:g} less {ROUNDS_OF_BATCHES} rounds of "
            f"batches, at most {MAX_DERIVED_QUEUE}"
        )


def pod_capacity(samples_per_cpu_second: float | None, threads: ThreadPlan) -> float | None:
    """Samples per second of a pod: the measured rate of one CPU times the CPUs its threads can use."""
    if samples_per_cpu_second is None:
        return None
    busy_cpus = min(threads.cpus, threads.instances * threads.intra_op)
    return samples_per_cpu_second * busy_cpus


def derive_queue_bound(
    capacity: float | None, timeout_seconds: float, instances: int, max_batch_size: int, requested: int | None = None
) -> QueueBound:
    """The requested bound if set; else Little's law on what a served pod delivers under overload, less the
    batches that are part of the wait too, at most MAX_DERIVED_QUEUE, never below one full batch so batches can
    still form. Unknown capacity: two rounds."""
    if requested is not None:
        return QueueBound(requested, "spec", capacity)
    batch_round = instances * max_batch_size
    if capacity is None:
        return QueueBound(2 * batch_round, "unknown capacity", None)
    little = math.floor(capacity * SERVED_SHARE_OF_CAPACITY * timeout_seconds * WAIT_SHARE_OF_TIMEOUT)
    size = min(MAX_DERIVED_QUEUE, little - ROUNDS_OF_BATCHES * batch_round)
    return QueueBound(max(max_batch_size, size), "capacity", capacity)

"""The Linux scheduling policy tritonserver runs under, in a pod and locally.

Triton's dynamic batcher with a queue policy (a bounded queue or a timeout, which every inferop config has)
does not prepare the next batch while one runs; it starts it when told that an instance is free. The
instance says so just before it is ready for work; the batcher checks at once, finds none, and sleeps until
its 500 ms timer, while arrivals that could wake it are rejected by the full queue. Under overload most
batches then wait out that timer: on one CPU, Inception V3 lost a fifth of its throughput and the conv net
nine tenths of it. (Without a queue policy the batcher prepares the next batch ahead, but the queue is
unbounded and nothing times out.)

Under SCHED_BATCH a woken thread does not preempt the running one, so the finishing instance reaches the
rate limiter before the batcher looks, and the next batch starts at once. It costs a woken thread at most a
scheduler tick (a few ms) before it runs; it needs no privilege and no capability, only `chrt` (util-linux,
in every Ubuntu-based Triton image) in a container. Where threads run on different CPUs the race is won
more often but not always: overload there is still rejected fast and bounded, with less goodput.
"""

from __future__ import annotations

import os
from typing import Literal, get_args

CpuScheduling = Literal["batch", "normal"]
CPU_SCHEDULING_POLICIES: tuple[CpuScheduling, ...] = get_args(CpuScheduling)
DEFAULT_CPU_SCHEDULING: CpuScheduling = "batch"


def command_prefix(policy: CpuScheduling) -> list[str]:
    """What a container runs tritonserver behind, so the server and every stub it starts inherit `policy`."""
    return ["chrt", "--batch", "0"] if policy == "batch" else []


def apply(policy: CpuScheduling) -> None:
    """Switch the calling process (before it execs tritonserver) to `policy`; children inherit it."""
    if policy == "batch":
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))

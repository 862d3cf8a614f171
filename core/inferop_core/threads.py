"""The thread budget: how many ONNX Runtime threads the model instances of one server may use.

Every instance of a model owns its own intra-op and inter-op thread pools. Copies that each size their
pools to the whole machine oversubscribe the CPUs and inference slows to a crawl, so thread counts are
derived from the CPU budget and a plan that exceeds it is refused.

The instance count is derived too where it is not set: two, so that Triton's dynamic batcher is never left with one
busy instance and nothing to wake it; where the budget does not hold both instances' threads they take turns
(`derived_instances`).
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable
from dataclasses import dataclass

from inferop_core.errors import InferopError

# The math libraries' thread counts, read once when each library starts: a server's container gets the plan's intra-op
# count in each (never the user's), an image pipeline's stages one (tritonconfig.STAGE_STUB_SCRIPT).
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class OversubscribedError(InferopError, ValueError):
    """The requested threads exceed the CPUs; the message shows the arithmetic and a fix."""


@dataclass(frozen=True)
class ThreadPlan:
    cpus: float
    instances: int
    intra_op: int
    inter_op: int
    requested: tuple[int | None, int | None] = (None, None)  # intra- and inter-op as asked; None: derived
    take_turns: bool = False  # one instance executes at a time (Triton's rate limiter), the other holds the next batch

    @property
    def cpu_slots(self) -> int:
        """Whole CPUs the threads may occupy (a fractional budget still runs one thread)."""
        return max(1, math.floor(self.cpus))

    @property
    def executing(self) -> int:
        """Instances that execute at once."""
        return 1 if self.take_turns else self.instances

    @property
    def threads(self) -> int:
        """Threads that compute at once: the inter-op pool's caller thread is one of the intra-op threads."""
        return self.executing * (self.intra_op + self.inter_op - 1)

    @property
    def oversubscribed(self) -> bool:
        return self.threads > self.cpu_slots

    def explain(self) -> str:
        executing = f"{self.instances} instances taking turns, 1 at a time" if self.take_turns else None
        pools = f"({self.intra_op} intra-op + {self.inter_op} inter-op - 1)"
        return (
            f"{executing or f'{self.instances} instance(s)'} x {pools} "
            f"= {self.threads} threads on {format_cpus(self.cpus)} CPU(s)"
        )


def derived_instances(cpus: float, intra_op: int | None = None, inter_op: int | None = None) -> tuple[int, bool]:
    """Two instances, and whether they must take turns: yes where the whole CPUs do not hold both instances' threads
    (as set, else one each).

    With a bounded queue or a request timeout (every config inferop renders), Triton's dynamic batcher hands a
    batch only to an instance already waiting for one, and an instance that comes back for work wakes nobody
    (`src/dynamic_batch_scheduler.cc`, `src/rate_limiter.cc` in Triton's core): when every caller has sent again
    before the one instance is back, the batch waits for the batcher's 500 ms timer. With two instances the other
    one is waiting, so the next batch is formed while the first executes. Where two would oversubscribe the CPUs,
    Triton's rate limiter lets one execute at a time and the other holds the next batch until the first is done
    (docs/concepts/operator.md has the figures).
    """
    per_instance = (intra_op or 1) + (inter_op or 1) - 1
    return 2, math.floor(cpus) < 2 * per_instance


def plan_threads(
    cpus: float, instances: int | None, intra_op: int | None = None, inter_op: int | None = None
) -> ThreadPlan:
    """Fill unset counts from the budget: instances as `derived_instances`, inter-op = 1, intra-op =
    max(1, floor(CPUs / instances executing at once) less the inter-op pool's extra threads). Instances that are
    set all execute at once."""
    if cpus <= 0:
        raise ValueError(f"cpus must be > 0, got {cpus}")
    take_turns = False
    if instances is None:
        instances, take_turns = derived_instances(cpus, intra_op, inter_op)
    if instances < 1:
        raise ValueError(f"instances must be >= 1, got {instances}")
    inter = inter_op or 1
    # The inter-op pool's extra threads come out of the instance's share, or they would oversubscribe it.
    default_intra = max(1, math.floor(cpus / (1 if take_turns else instances)) - (inter - 1))
    return ThreadPlan(
        cpus=cpus,
        instances=instances,
        intra_op=intra_op or default_intra,
        inter_op=inter,
        requested=(intra_op, inter_op),
        take_turns=take_turns,
    )


def check_budget(
    plan: ThreadPlan, allow_oversubscription: bool = False, model_cpus: Callable[[int], float] | None = None
) -> ThreadPlan:
    """Return `plan` if it fits its CPUs (or oversubscription is explicitly allowed), else raise with fixes.
    `model_cpus` gives the CPUs the threads get at a pod's CPU limit, where some are set aside (an image pipeline's
    stages); by default all of them."""
    if plan.oversubscribed and not allow_oversubscription:
        fitting = plan_threads(plan.cpus, plan.instances)
        fixes = []
        if not fitting.oversubscribed and (fitting.intra_op, fitting.inter_op) != (plan.intra_op, plan.inter_op):
            fixes.append(f"set threads.intraOp={fitting.intra_op} and threads.interOp=1")
        # Re-planned with the threads as asked: derived counts grow as instances fall, so the fix must fit then.
        fewer = (plan_threads(plan.cpus, n, *plan.requested) for n in range(plan.instances - 1, 0, -1))
        most = next((candidate for candidate in fewer if not candidate.oversubscribed), None)
        if most is not None:
            fixes.append(f"lower instances to {most.instances}")
        # The same re-planning for more CPUs: the smallest limit at which the threads as asked fit.
        threads_at = model_cpus or float
        limits = itertools.count(plan.cpu_slots + 1)
        enough = next(
            c for c in limits if not plan_threads(threads_at(c), plan.instances, *plan.requested).oversubscribed
        )
        kept = f" ({format_cpus(enough - threads_at(enough))} of them for the pipeline's stages)" if model_cpus else ""
        fixes += [
            f"raise the CPU limit to {enough}{kept}",
            "set threads.allowOversubscription=true to accept the slowdown",
        ]
        raise OversubscribedError(f"thread budget exceeded: {plan.explain()}. Fix: {', or '.join(fixes)}")
    return plan


def local_cpus() -> int:
    """CPUs this process may run on (its affinity), which is what a local server can use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def format_cpus(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"

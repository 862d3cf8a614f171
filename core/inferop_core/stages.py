"""How a pod's CPUs split between an image pipeline's stages and its model.

Each image costs the stages (decode, preprocess, top-k) 1/imagesPerCpuSecond CPU-seconds and the model
1/samplesPerCpuSecond; at the pod's capacity both run all the time, so the stages' share of the CPUs is their cost
over the sum. Each decoding instance is one thread (Triton's python stub, Pillow and numpy on one core), so enough
instances to supply that share keep the model fed. The model's threads are planned on the CPUs left: the stages'
share rounded to whole CPUs comes out of the model's budget, and the model keeps at least one. One decoding instance
beyond those whole CPUs runs in the model's CPUs (under half a CPU of work: Inception V3's decoding is about 5% of its
model's); more than that would oversubscribe them and are refused, as the model's threads are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from inferop_core.threads import OversubscribedError, format_cpus


@dataclass(frozen=True)
class StagePlan:
    cpus: float  # the pod's CPU budget
    share: float | None  # of those CPUs the stages need at the pod's capacity; None: a rate is unknown
    stage_cpus: int  # whole CPUs taken out of the model's budget for the stages
    pre_instances: int
    requested: int | None = None  # pipeline.preInstances as set

    @property
    def model_cpus(self) -> float:
        """The CPUs the model's threads are planned on."""
        return self.cpus - self.stage_cpus

    @property
    def oversubscribed(self) -> bool:
        return self.pre_instances > self.stage_cpus + 1

    def explain(self) -> str:
        instances = f"{self.pre_instances} decoding instance(s) of one thread"
        if self.share is None:
            return f"{instances}: the stages' cost is unknown (no pipeline.imagesPerCpuSecond), so no CPU is set aside"
        needs = f"the stages need {self.share * self.cpus:.2f} of {format_cpus(self.cpus)} CPUs at capacity"
        kept = f"{self.stage_cpus} CPU(s) set aside, the model's threads on {format_cpus(self.model_cpus)}"
        return f"{instances}; {needs}: {kept}"


def stage_share(model_samples_per_cpu_second: float | None, images_per_cpu_second: float | None) -> float | None:
    """The stages' share of the CPUs when the pod answers as fast as it can; None where a rate is unknown."""
    if not model_samples_per_cpu_second or not images_per_cpu_second:
        return None
    stages, model = 1 / images_per_cpu_second, 1 / model_samples_per_cpu_second
    return stages / (stages + model)


def plan_stages(
    cpus: float,
    model_samples_per_cpu_second: float | None,
    images_per_cpu_second: float | None,
    requested: int | None = None,
) -> StagePlan:
    """The CPUs set aside for the stages and the decoding instances (as `requested`, else enough to supply the stages'
    share at one thread each; 1 where the share is unknown)."""
    share = stage_share(model_samples_per_cpu_second, images_per_cpu_second)
    if share is None:
        return StagePlan(cpus, None, 0, requested or 1, requested)
    stage_cpus = min(math.floor(cpus * share + 0.5), max(0, math.floor(cpus) - 1))
    derived = max(1, math.ceil(cpus * share))
    return StagePlan(cpus, share, stage_cpus, requested or derived, requested)


def check_stages(plan: StagePlan, allow_oversubscription: bool = False) -> StagePlan:
    """Return `plan` unless its decoding instances oversubscribe the CPUs left to them, with the fixes."""
    if plan.oversubscribed and not allow_oversubscription:
        needs = "" if plan.share is None else f": the stages need {plan.share * plan.cpus:.2f} CPUs at capacity"
        raise StagesOversubscribed(
            f"thread budget exceeded: pipeline.preInstances {plan.pre_instances}, one thread each, on the "
            f"{plan.stage_cpus} CPU(s) set aside for the stages and one in the model's{needs}. Fix: lower "
            f"pipeline.preInstances to {plan.stage_cpus + 1} or leave it unset, or set "
            "threads.allowOversubscription=true to accept the slowdown"
        )
    return plan


class StagesOversubscribed(OversubscribedError):
    """The pipeline's decoding instances exceed the CPUs the plan leaves them."""

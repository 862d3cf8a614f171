"""How a pod's CPUs split between an image pipeline's stages and its model."""

from __future__ import annotations

import pytest

from inferop_core.stages import StagesOversubscribed, check_stages, plan_stages, stage_share


def test_the_stages_share_is_their_cost_over_the_whole_image_s() -> None:
    # Inception V3: 14 images/CPU-s in the model, 250 in the stages: the stages take 14/264 of the CPU.
    assert stage_share(14, 250) == pytest.approx(14 / 264)
    assert stage_share(None, 250) is None and stage_share(14, None) is None


@pytest.mark.parametrize(
    ("cpus", "model_rate", "stage_rate", "set_aside", "instances"),
    [
        (2, 14, 250, 0, 1),  # a tenth of a CPU: one decoding thread runs in the model's CPUs
        (16, 14, 250, 1, 1),  # 0.85 CPU: one set aside
        (4, 100, 100, 2, 2),  # half the work: 2 CPUs of 4 and two decoding threads
        (1, 100, 50, 0, 1),  # the model keeps its one CPU
        (2, 100, 50, 1, 2),  # two thirds of 2 CPUs: one set aside, the model keeps one
        (0.5, 14, 250, 0, 1),
    ],
)
def test_the_model_keeps_what_the_stages_do_not_need(
    cpus: float, model_rate: float, stage_rate: float, set_aside: int, instances: int
) -> None:
    plan = check_stages(plan_stages(cpus, model_rate, stage_rate))
    assert (plan.stage_cpus, plan.pre_instances) == (set_aside, instances)
    assert plan.model_cpus == cpus - set_aside and plan.model_cpus >= min(cpus, 1)


def test_without_a_measured_cost_one_instance_and_no_cpu_set_aside() -> None:
    plan = plan_stages(4, 14, None)
    assert (plan.stage_cpus, plan.pre_instances, plan.model_cpus) == (0, 1, 4)
    assert "unknown" in plan.explain()


def test_instances_beyond_the_cpus_set_aside_are_refused_with_a_fix() -> None:
    with pytest.raises(StagesOversubscribed, match=r"preInstances 3.*lower pipeline\.preInstances to 1"):
        check_stages(plan_stages(2, 14, 250, requested=3))
    assert check_stages(plan_stages(2, 14, 250, requested=3), allow_oversubscription=True).pre_instances == 3
    assert check_stages(plan_stages(16, 14, 250, requested=2)).pre_instances == 2

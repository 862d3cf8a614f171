"""The thread budget: defaults divide the CPUs among instances, and a plan that oversubscribes is refused."""

from __future__ import annotations

import pytest

from inferop_core.threads import OversubscribedError, check_budget, derived_instances, plan_threads


class TestPlanThreads:
    @pytest.mark.parametrize(
        ("cpus", "instances", "intra_op"),
        [
            (8, 1, 8),
            (8, 3, 2),  # floor(8 / 3)
            (2, 4, 1),  # never below one thread
            (2.5, 1, 2),  # a fractional CPU limit rounds down
            (0.5, 1, 1),  # half a CPU still runs one thread
            (6.9, 2, 3),
        ],
    )
    def test_default_intra_op_is_floor_of_cpus_per_instance(self, cpus: float, instances: int, intra_op: int) -> None:
        plan = plan_threads(cpus, instances)
        assert (plan.intra_op, plan.inter_op) == (intra_op, 1)

    @pytest.mark.parametrize(
        ("cpus", "intra_op", "inter_op", "take_turns", "threads"),
        [(0.5, None, None, True, 1), (1, None, None, True, 1), (1.9, None, None, True, 1), (2, None, None, False, 2),
         (16, None, None, False, 16), (3, 2, None, True, 2), (4, 2, None, False, 4), (4, None, 3, True, 4),
         (6, 2, 2, False, 6)],
    )  # fmt: skip
    def test_unset_instances_are_two_taking_turns_where_the_whole_cpus_do_not_hold_both(
        self, cpus: float, intra_op: int | None, inter_op: int | None, take_turns: bool, threads: int
    ) -> None:
        assert derived_instances(cpus, intra_op, inter_op) == (2, take_turns)
        plan = plan_threads(cpus, None, intra_op, inter_op)
        assert (plan.instances, plan.take_turns, plan.threads) == (2, take_turns, threads)
        assert not plan.oversubscribed
        assert ("taking turns" in plan.explain()) == take_turns

    def test_instances_that_are_set_all_execute_at_once(self) -> None:
        plan = plan_threads(1, 2)
        assert not plan.take_turns and plan.executing == 2 and plan.oversubscribed

    def test_explicit_counts_are_kept(self) -> None:
        plan = plan_threads(16, 2, intra_op=3, inter_op=2)
        assert (plan.intra_op, plan.inter_op) == (3, 2)
        assert plan.threads == 2 * (3 + 2 - 1)

    @pytest.mark.parametrize(("cpus", "instances", "field"), [(0, 1, "cpus"), (-1.5, 1, "cpus"), (4, 0, "instances")])
    def test_impossible_budget_names_the_value(self, cpus: float, instances: int, field: str) -> None:
        with pytest.raises(ValueError, match=field):
            plan_threads(cpus, instances)


class TestCheckBudget:
    @pytest.mark.parametrize(("cpus", "instances"), [(8, 3), (2, 2), (1, 1), (0.5, 1), (64, 7)])
    def test_default_plans_fit(self, cpus: float, instances: int) -> None:
        plan = plan_threads(cpus, instances)
        assert check_budget(plan) is plan
        assert plan.threads <= max(1, int(cpus))

    def test_oversubscription_is_refused_with_the_arithmetic_and_a_fix(self) -> None:
        with pytest.raises(OversubscribedError) as error:
            check_budget(plan_threads(4, 2, intra_op=4, inter_op=1))
        message = str(error.value)
        assert "2 instance(s) x (4 intra-op + 1 inter-op - 1) = 8 threads on 4 CPU(s)" in message
        assert "threads.intraOp=2" in message  # floor(4 / 2)
        assert "threads.allowOversubscription=true" in message

    def test_inter_op_threads_count_too(self) -> None:
        with pytest.raises(OversubscribedError, match=r"= 6 threads on 4 CPU\(s\)"):
            check_budget(plan_threads(4, 2, intra_op=2, inter_op=2))

    def test_fractional_cpus_are_shown_as_given(self) -> None:
        with pytest.raises(OversubscribedError, match=r"= 2 threads on 1\.5 CPU\(s\)"):
            check_budget(plan_threads(1.5, 1, intra_op=2))

    def test_opt_out_accepts_the_plan(self) -> None:
        plan = plan_threads(4, 2, intra_op=4)
        assert plan.oversubscribed
        assert check_budget(plan, allow_oversubscription=True) is plan

"""The overload drill's capacity in the run: what a pod did with its time, from its own figures."""

from __future__ import annotations

import pytest

from inferop.openloop import OpenLoopResult, Outcome, summarise
from inferop_devtools.field.overload import Overloaded, answered_rate, cpu_share_kept
from inferop_devtools.field.work import Snapshot, Work, work_between

START = Snapshot(batches={8: (10, 10_000_000_000), 3: (1, 500_000_000)}, pod_cpu_seconds=100.0, model_cpu_seconds=90.0)


def later(full: int, full_seconds: float, partial: int, pod_cpu: float, model_cpu: float) -> Snapshot:
    return Snapshot(
        batches={8: (10 + full, 10_000_000_000 + int(full_seconds * 1e9)), 3: (1 + partial, 500_000_000 + partial)},
        pod_cpu_seconds=100.0 + pod_cpu,
        model_cpu_seconds=90.0 + model_cpu,
    )


def test_the_rate_of_full_batches_and_their_share_of_the_samples() -> None:
    work = work_between(START, later(full=20, full_seconds=40.0, partial=2, pod_cpu=20.0, model_cpu=18.0), 8, 1)
    assert work.computed == 20 * 8 + 2 * 3
    assert work.full_batch_rate == 20 * 8 / 40.0
    assert work.full_batch_share == 160 / 166
    assert work.model_cpu_share == 0.9


def test_instances_side_by_side_add_their_rates() -> None:
    work = work_between(START, later(full=20, full_seconds=80.0, partial=0, pod_cpu=20.0, model_cpu=18.0), 8, 2)
    assert work.full_batch_rate == 2 * 20 * 8 / 80.0


def test_no_full_batch_and_no_cpu_give_no_figure_never_zero() -> None:
    work = work_between(START, later(full=0, full_seconds=0.0, partial=5, pod_cpu=0.0, model_cpu=0.0), 8, 1)
    assert (work.full_batch_rate, work.full_batch_share, work.model_cpu_share) == (None, 0.0, None)
    assert work_between(START, START, 8, 1).full_batch_share is None


def run(work: Work | None, at_capacity: Work | None) -> Overloaded:
    result = summarise([], [], {}, model="m", rate=1.0, seconds=1.0, process="p", batch=1, timeout=None)
    return Overloaded(result, {}, True, work=work, work_at_capacity=at_capacity)


def test_cpu_the_model_lost_inside_the_pod_is_given_back_to_the_capacity() -> None:
    """Requests read and refused inside the pod take the model's quota: its full batches slow down, and a capacity
    taken from their rate alone would fall with the goodput and hide the loss."""
    at_capacity = Work(computed=100, full_batch_share=1.0, full_batch_rate=4.0, model_cpu_share=0.9)
    flooded = Work(computed=100, full_batch_share=1.0, full_batch_rate=3.0, model_cpu_share=0.6)
    assert run(flooded, at_capacity).capacity_in_run == pytest.approx(4.5)
    calm = Work(computed=100, full_batch_share=1.0, full_batch_rate=4.0, model_cpu_share=0.95)
    assert run(calm, at_capacity).capacity_in_run == 4.0  # never lowered below the rate its batches ran at
    assert run(None, at_capacity).capacity_in_run is None
    assert run(Work(0, None, None, None), at_capacity).capacity_in_run is None


def result_of(finished: list[float], batch: int = 1) -> OpenLoopResult:
    outcomes = [Outcome(sent_at=0.0, started_late_ms=0.0, latency_s=t, kind="ok") for t in finished]
    outcomes.append(Outcome(sent_at=1.0, started_late_ms=0.0, latency_s=0.001, kind="rejected"))
    return summarise(outcomes, [], {}, model="m", rate=1.0, seconds=40.0, process="p", batch=batch, timeout=None)


def test_answered_rate_runs_to_the_last_answer_not_to_a_fixed_second() -> None:
    # Batches of 8 every 2.1 s from the start: 19 by 39.9 s in the run's 40 s window, the 20th in its drain.
    finished = [2.1 * k for k in range(1, 21) for _ in range(8)]
    assert abs((answered_rate(result_of(finished)) or 0) - 8 / 2.1) < 1e-9
    assert answered_rate(result_of([])) is None


def test_cpu_the_model_loses_to_overload_read_inside_the_pod_fails_the_drill() -> None:
    # Figures of one pod on a 2 GHz Xeon: through the gateway, and with the callers straight at the pod.
    at_capacity = {"model_cpu_share": 0.9828}
    assert cpu_share_kept({"model_cpu_share": 0.9801}, {"model_cpu_share": 0.9809})
    assert not cpu_share_kept({"model_cpu_share": 0.9535}, at_capacity)
    assert not cpu_share_kept({"model_cpu_share": 0.9644}, at_capacity)
    assert not cpu_share_kept(None, at_capacity) and not cpu_share_kept({"model_cpu_share": None}, at_capacity)

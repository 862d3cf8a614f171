"""The rollout's state machine (inferop_operator.rollout): revisions, each phase's way out, the analysis' verdicts
and the traffic they set. Pure: what the handlers observe is given, what the machine decides is checked."""

from __future__ import annotations

import math
from typing import Any

import pytest

from inferop_core.agreement import AgreementResult, OutputVerdict
from inferop_core.sequential import agreement_test
from inferop_operator.diagnosis import Diagnosis
from inferop_operator.rollout import (
    DRAIN_SECONDS,
    AnalysisStatus,
    GatewayFigures,
    Observed,
    RolloutStatus,
    TrackFigures,
    advance,
    analysis_due,
    analysis_window,
    canary_replicas,
    decide,
    gateway_figures,
    histogram_quantile,
    judge,
    replica_split,
    revision_of,
    served_fields,
    stable_share,
    stable_spec,
    time_buckets,
    timestamp,
    track_figures,
)
from inferop_operator.spec import InferenceServiceSpec, Rollout, parse_spec
from tests.specs import MODEL, raw_spec

IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"
T0 = 1_800_000_000.0
ROLLOUT = {"steps": [5, 25, 100], "stepSeconds": 60, "analysis": {"intervalSeconds": 10, "minRequests": 20}}


def spec_of(**sections: Any) -> InferenceServiceSpec:
    return parse_spec(raw_spec(rollout=ROLLOUT, **sections))


def rollout_of(**changes: Any) -> Rollout:
    return Rollout.model_validate({**ROLLOUT, **changes})


def started(split: str = "gateway") -> tuple[InferenceServiceSpec, RolloutStatus]:
    """A candidate (one more instance) just started beside the stable spec."""
    stable = spec_of()
    state = decide(stable, revision_of(stable, IMAGE), None, split, T0)
    candidate = spec_of(instances=2)
    return candidate, decide(candidate, revision_of(candidate, IMAGE), state, split, T0)


def agreement(passed: bool) -> AgreementResult:
    """The check's outcome: every output passed after 591 inputs, or the policy refused after 20 (8 agreeing)."""
    policy = (
        OutputVerdict("policy", "top1", 591, 591, "accept")
        if passed
        else OutputVerdict("policy", "top1", 20, 8, "refuse")
    )
    value = OutputVerdict("value", "tolerance", 591, 591, "accept", largest_difference=0.001, tolerance=0.02)
    return AgreementResult((policy, value), 591 if passed else 24, agreement_test(0.99, 0.01, 2, 5000), seconds=0.4)


def agreed(spec: InferenceServiceSpec, state: RolloutStatus, now: float = T0) -> RolloutStatus:
    """Past the agreement and the first step's pods: that step's traffic is applied."""
    assert spec.rollout is not None
    state = advance(state, spec.rollout, Observed(now, candidate_ready=True, agreement=agreement(True)), {})
    return advance(state, spec.rollout, Observed(now + 2, candidate_ready=True), {})


def at_step(step: int = 0, settled_at: float = T0) -> RolloutStatus:
    """The candidate past its agreement, at `step`, its traffic in effect since `settled_at`."""
    spec, state = started()
    state = agreed(spec, state)
    for index in range(1, step + 1):
        state = state.model_copy(update={"step": index, "weight": ROLLOUT["steps"][index]})
    return state.model_copy(update={"step_started_at": timestamp(settled_at)})


def analysed(verdict: str, at: float, step: int = 0) -> AnalysisStatus:
    figures = TrackFigures(requests=100, failures=0, failure_ratio=0.0, mean_latency_ms=2.0)
    return AnalysisStatus(
        verdict=verdict, message=verdict, step=step, weight=5, at=timestamp(at), window_seconds=10,
        candidate=figures, stable=figures,
    )  # fmt: skip


class TestRevisions:
    def test_what_reaches_the_pods_makes_a_revision(self) -> None:
        base = revision_of(spec_of(), IMAGE)
        assert revision_of(spec_of(instances=2), IMAGE) != base
        assert revision_of(spec_of(batching={"maxBatchSize": 4}), IMAGE) != base
        assert revision_of(spec_of(), "other:image") != base
        model = {**MODEL, "weights": "trained.pt (sha256 1234)"}
        assert revision_of(parse_spec(raw_spec(rollout=ROLLOUT, model=model)), IMAGE) != base

    def test_what_does_not_reach_the_pods_makes_none(self) -> None:
        base = revision_of(spec_of(), IMAGE)
        assert revision_of(spec_of(replicas=3), IMAGE) == base
        assert revision_of(spec_of(autoscaling={"maxReplicas": 4, "target": 50}), IMAGE) == base
        assert revision_of(parse_spec(raw_spec(rollout={"steps": [50, 100]})), IMAGE) == base
        assert revision_of(spec_of(gateway={"name": "public"}), IMAGE) == base

    def test_the_stable_track_serves_the_stable_fields_with_the_specs_replicas(self) -> None:
        stable = spec_of()
        state = decide(stable, revision_of(stable, IMAGE), None, "gateway", T0)
        served = stable_spec(spec_of(instances=3, replicas=4), state)
        assert (served.instances, served.replicas) == (None, 4)  # unset in the stable spec
        assert served_fields(served) == served_fields(stable)


class TestDecide:
    def test_without_a_rollout_a_change_serves_at_once(self) -> None:
        spec = parse_spec(raw_spec(instances=2))
        state = decide(spec, revision_of(spec, IMAGE), None, "gateway", T0)
        assert (state.stable, state.phase, state.stable_spec) == (revision_of(spec, IMAGE), None, None)
        assert stable_spec(spec, state) is spec

    def test_the_first_spec_is_stable_and_kept(self) -> None:
        spec = spec_of()
        state = decide(spec, revision_of(spec, IMAGE), None, "gateway", T0)
        assert state.phase is None and state.stable_spec == served_fields(spec)

    def test_a_changed_spec_starts_a_candidate_without_traffic(self) -> None:
        candidate, state = started()
        assert state.phase == "Agreement"
        assert (state.candidate, state.weight, state.mirror_percent, state.header) == (
            revision_of(candidate, IMAGE), 0, 0, False,
        )  # fmt: skip
        assert stable_spec(candidate, state).instances is None

    def test_the_spec_before_the_change_is_stable_when_the_status_kept_none(self) -> None:
        before, after = parse_spec(raw_spec()), spec_of(instances=2)
        state = decide(after, revision_of(after, IMAGE), None, "gateway", T0, (before, revision_of(before, IMAGE)))
        assert state.phase == "Agreement" and state.stable == revision_of(before, IMAGE)
        assert stable_spec(after, state).instances is None

    def test_the_same_candidate_again_changes_nothing(self) -> None:
        candidate, state = started()
        assert decide(candidate, revision_of(candidate, IMAGE), state, "gateway", T0 + 5) == state

    def test_an_edit_mid_rollout_starts_over_from_the_stable_revision(self) -> None:
        state = at_step(1)
        third = spec_of(instances=3)
        restarted = decide(third, revision_of(third, IMAGE), state, "gateway", T0 + 90)
        assert restarted.phase == "Agreement" and restarted.candidate == revision_of(third, IMAGE)
        assert (restarted.weight, restarted.step, restarted.stable) == (0, None, state.stable)

    def test_back_to_the_stable_revision_mid_rollout_rolls_back(self) -> None:
        state = at_step(1)
        stable = spec_of()
        reverted = decide(stable, revision_of(stable, IMAGE), state, "gateway", T0 + 90)
        assert (reverted.phase, reverted.reason, reverted.weight) == ("RollingBack", "SpecReverted", 0)

    def test_a_rolled_back_candidate_stays_rolled_back(self) -> None:
        candidate, state = started()
        done = state.model_copy(update={"phase": "RolledBack"})
        assert decide(candidate, revision_of(candidate, IMAGE), done, "gateway", T0 + 90) == done

    def test_a_retry_starts_the_rolled_back_candidate_again_once(self) -> None:
        _, state = started()
        done = state.model_copy(update={"phase": "RolledBack", "reason": "AnalysisFailed", "weight": 0})
        token = f"{state.candidate}/1800000100"
        retried = parse_spec(raw_spec(instances=2, rollout={**ROLLOUT, "retry": token}))
        again = decide(retried, revision_of(retried, IMAGE), done, "gateway", T0 + 100)
        assert (again.phase, again.reason, again.candidate, again.weight, again.retried) == (
            "Agreement", "CandidateStarting", state.candidate, 0, token,
        )  # fmt: skip
        assert again.message is not None and again.message.startswith("retried by spec.rollout.retry: revision")
        rolled_back_again = again.model_copy(update={"phase": "RolledBack"})
        assert decide(retried, revision_of(retried, IMAGE), rolled_back_again, "gateway", T0 + 200) == rolled_back_again
        other = parse_spec(raw_spec(instances=2, rollout={**ROLLOUT, "retry": "0123456789/1"}))
        assert decide(other, revision_of(other, IMAGE), done, "gateway", T0 + 100) == done  # not this candidate


class TestAgreementPhase:
    def test_it_waits_for_the_candidates_pods(self) -> None:
        spec, state = started()
        assert advance(state, spec.rollout, Observed(T0 + 1), {}).phase == "Agreement"

    def test_agreement_readies_the_first_steps_pods_then_sends_its_traffic(self) -> None:
        spec, state = started()
        assert spec.rollout is not None
        agreed_ = advance(state, spec.rollout, Observed(T0 + 5, candidate_ready=True, agreement=agreement(True)), {})
        assert (agreed_.phase, agreed_.reason, agreed_.weight, agreed_.scaling_for) == (
            "Agreement", "CandidateScaling", 0, 5,
        )  # fmt: skip
        assert agreed_.message == "step 1 of 3 waits for the candidate's pods for 5% of requests to be Ready"
        assert agreed_.agreement is not None and agreed_.agreement.passed
        # Its pods for the step not all Ready: no traffic, and the check is not asked again.
        assert advance(agreed_, spec.rollout, Observed(T0 + 7), {}) == agreed_
        moved = advance(agreed_, spec.rollout, Observed(T0 + 9, candidate_ready=True), {})
        assert (moved.phase, moved.step, moved.weight, moved.step_started_at, moved.scaling_for) == (
            "Progressing", 0, 5, None, None,
        )  # fmt: skip

    def test_disagreement_never_sends_a_request(self) -> None:
        spec, state = started()
        moved = advance(state, spec.rollout, Observed(T0 + 5, candidate_ready=True, agreement=agreement(False)), {})
        assert (moved.phase, moved.reason, moved.weight, moved.mirror_percent, moved.header) == (
            "RollingBack", "Disagrees", 0, 0, False,
        )  # fmt: skip
        assert "policy top-1 agrees on 8 of 20 (40.00%), 99% upper bound 0.6" in moved.message
        assert "(< 0.99): refused (24 inputs, generated inputs, 0.4 s)" in moved.message
        assert moved.agreement is not None and moved.agreement.outputs[0].decision == "Refused"
        assert moved.agreement.false_acceptance <= 0.01 and moved.agreement.false_refusal <= 0.01

    def test_shadow_and_header_at_a_step_of_zero_through_a_gateway(self) -> None:
        spec = parse_spec(raw_spec(instances=2, rollout={
            **ROLLOUT, "steps": [0, 100], "shadow": {"percent": 20}, "header": {"name": "x-ab", "value": "b"},
        }))  # fmt: skip
        state = decide(spec, revision_of(spec, IMAGE), started()[1], "gateway", T0)
        moved = agreed(spec, state, T0 + 5)
        assert (moved.weight, moved.mirror_percent, moved.header) == (0, 20, True)


class TestSteps:
    def test_the_window_starts_when_the_traffic_is_in_effect(self) -> None:
        state = at_step(0).model_copy(update={"step_started_at": None})
        assert advance(state, rollout_of(), Observed(T0 + 1), {}).step_started_at is None
        settled = advance(state, rollout_of(), Observed(T0 + 2, traffic_settled=True), {})
        assert settled.step_started_at == timestamp(T0 + 2)

    def test_a_failed_analysis_rolls_back_at_once(self) -> None:
        moved = advance(at_step(1), rollout_of(), Observed(T0 + 10, analysis=analysed("Failed", T0 + 10, 1)), {})
        assert (moved.phase, moved.reason, moved.weight) == ("RollingBack", "AnalysisFailed", 0)

    def test_a_pass_before_the_step_ends_holds_the_step(self) -> None:
        moved = advance(at_step(0), rollout_of(), Observed(T0 + 30, analysis=analysed("Passed", T0 + 30)), {})
        assert (moved.phase, moved.step, moved.weight) == ("Progressing", 0, 5)

    def test_a_pass_at_the_steps_end_readies_the_next_steps_pods_then_starts_it(self) -> None:
        waiting = advance(at_step(0), rollout_of(), Observed(T0 + 60, analysis=analysed("Passed", T0 + 60)), {})
        assert (waiting.phase, waiting.reason, waiting.step, waiting.weight, waiting.scaling_for) == (
            "Progressing", "CandidateScaling", 0, 5, 25,
        )  # fmt: skip
        assert "step 2 of 3 waits for the candidate's pods for 25% of requests" in waiting.message
        moved = advance(waiting, rollout_of(), Observed(T0 + 62, candidate_ready=True), {})
        assert (moved.phase, moved.step, moved.weight, moved.step_started_at, moved.scaling_for) == (
            "Progressing", 1, 25, None, None,
        )  # fmt: skip

    def test_a_failure_limit_lets_failures_short_of_it_pass_in_a_row_only(self) -> None:
        rollout = rollout_of(analysis={**ROLLOUT["analysis"], "failureLimit": 2})
        once = advance(at_step(0), rollout, Observed(T0 + 10, analysis=analysed("Failed", T0 + 10)), {})
        assert (once.phase, once.reason, once.weight) == ("Progressing", "AnalysisFailing", 5)
        assert once.message.startswith("1 of 2 failed analyses in a row allowed before a rollback")
        passed = advance(once, rollout, Observed(T0 + 20, analysis=analysed("Passed", T0 + 20)), {})
        again = advance(passed, rollout, Observed(T0 + 30, analysis=analysed("Failed", T0 + 30)), {})
        assert again.phase == "Progressing"  # the pass in between started the count again
        twice = advance(again, rollout, Observed(T0 + 40, analysis=analysed("Failed", T0 + 40)), {})
        assert (twice.phase, twice.reason, twice.weight) == ("RollingBack", "AnalysisFailed", 0)
        assert twice.analysis is not None and twice.analysis.failures_in_a_row == 2

    def test_while_the_next_steps_pods_start_the_step_is_still_judged(self) -> None:
        waiting = advance(at_step(0), rollout_of(), Observed(T0 + 60, analysis=analysed("Passed", T0 + 60)), {})
        failed = advance(waiting, rollout_of(), Observed(T0 + 70, analysis=analysed("Failed", T0 + 70)), {})
        assert (failed.phase, failed.weight, failed.scaling_for) == ("RollingBack", 0, None)

    def test_split_by_replicas_the_pods_come_with_the_step(self) -> None:
        spec, state = started("replicas")
        assert spec.rollout is not None
        moved = advance(state, spec.rollout, Observed(T0 + 5, candidate_ready=True, agreement=agreement(True)), {})
        assert (moved.phase, moved.step, moved.weight, moved.scaling_for) == ("Progressing", 0, 5, None)

    def test_the_last_step_passed_promotes(self) -> None:
        moved = advance(at_step(2), rollout_of(), Observed(T0 + 60, analysis=analysed("Passed", T0 + 60, 2)), {})
        assert (moved.phase, moved.weight) == ("Promoting", 100)

    def test_too_few_requests_wait_then_pause(self) -> None:
        early = advance(at_step(0), rollout_of(), Observed(T0 + 20, analysis=analysed("NoData", T0 + 20)), {})
        assert early.phase == "Progressing"
        late = advance(at_step(0), rollout_of(), Observed(T0 + 60, analysis=analysed("NoData", T0 + 60)), {})
        assert (late.phase, late.reason, late.weight) == ("Paused", "NoData", 5)

    def test_prometheus_unreachable_pauses_at_once_and_data_resumes(self) -> None:
        paused = advance(at_step(0), rollout_of(), Observed(T0 + 10, analysis=analysed("Unreachable", T0 + 10)), {})
        assert (paused.phase, paused.reason, paused.weight) == ("Paused", "PrometheusUnreachable", 5)
        resumed = advance(paused, rollout_of(), Observed(T0 + 20, analysis=analysed("Passed", T0 + 20)), {})
        assert (resumed.phase, resumed.step) == ("Progressing", 0)

    def test_paused_by_the_spec_holds_but_a_failure_still_rolls_back(self) -> None:
        held = advance(at_step(0), rollout_of(paused=True), Observed(T0 + 90, analysis=analysed("Passed", T0 + 90)), {})
        assert (held.phase, held.reason, held.step) == ("Paused", "PausedBySpec", 0)
        failed = advance(held, rollout_of(paused=True), Observed(T0 + 100, analysis=analysed("Failed", T0 + 100)), {})
        assert failed.phase == "RollingBack"

    def test_promote_and_abort_name_the_candidate(self) -> None:
        state = at_step(0)
        other = advance(state, rollout_of(promote="someother"), Observed(T0 + 1), {})
        assert other.phase == "Progressing"
        assert advance(state, rollout_of(promote=state.candidate), Observed(T0 + 1), {}).phase == "Promoting"
        aborted = advance(state, rollout_of(abort=state.candidate), Observed(T0 + 1), {})
        assert (aborted.phase, aborted.reason, aborted.weight) == ("RollingBack", "Aborted", 0)

    def test_end_step_ends_the_named_step_at_once_and_only_that_one(self) -> None:
        state = at_step(0)
        rollout = rollout_of(endStep=f"{state.candidate}/0")
        moved = advance(state, rollout, Observed(T0 + 1), {})  # no analysis due: it does not wait for one
        assert (moved.phase, moved.reason, moved.step, moved.scaling_for) == ("Progressing", "CandidateScaling", 0, 25)
        entered = advance(moved, rollout, Observed(T0 + 3, candidate_ready=True), {})
        settled = advance(entered, rollout, Observed(T0 + 4, traffic_settled=True), {})
        assert (settled.step, settled.weight) == (1, 25)
        assert advance(settled, rollout, Observed(T0 + 5), {}) == settled  # it named step 0, not this one
        last = advance(at_step(2), rollout_of(endStep=f"{state.candidate}/2"), Observed(T0 + 1), {})
        assert (last.phase, last.reason, last.weight) == ("Promoting", "PromotedBySpec", 100)

    def test_end_step_leaves_a_step_whose_analysis_failed(self) -> None:
        state = at_step(0, settled_at=T0)
        rollout = rollout_of(endStep=f"{state.candidate}/0", analysis={**ROLLOUT["analysis"], "failureLimit": 2})
        failing = advance(state, rollout_of(analysis=rollout.analysis.model_dump(by_alias=True)),
                          Observed(T0 + 10, analysis=analysed("Failed", T0 + 10)), {})  # fmt: skip
        assert failing.reason == "AnalysisFailing"
        assert advance(failing, rollout, Observed(T0 + 11), {}).step == 0
        ended_and_failed = rollout_of(endStep=f"{state.candidate}/0")
        failed_now = advance(state, ended_and_failed, Observed(T0 + 10, analysis=analysed("Failed", T0 + 10)), {})
        assert (failed_now.phase, failed_now.weight) == ("RollingBack", 0)  # this tick's failure counts first

    def test_a_timed_pause_holds_after_the_step_then_goes_on(self) -> None:
        rollout = rollout_of(pauses=[{"atWeight": 5, "seconds": 120}])
        held = advance(at_step(0), rollout, Observed(T0 + 60, analysis=analysed("Passed", T0 + 60)), {})
        assert (held.phase, held.reason, held.weight) == ("Paused", "PausedAtStep", 5)
        assert "holds for 120 s more" in held.message
        still = advance(held, rollout, Observed(T0 + 170, analysis=analysed("Passed", T0 + 170)), {})
        assert (still.phase, still.scaling_for) == ("Paused", None)
        failed = advance(held, rollout, Observed(T0 + 100, analysis=analysed("Failed", T0 + 100)), {})
        assert failed.phase == "RollingBack"  # its analyses go on
        done = advance(still, rollout, Observed(T0 + 180, analysis=analysed("Passed", T0 + 180)), {})
        assert (done.reason, done.scaling_for) == ("CandidateScaling", 25)

    def test_a_pause_without_seconds_holds_until_its_step_is_ended(self) -> None:
        rollout = rollout_of(pauses=[{"atWeight": 25}])
        held = advance(at_step(1), rollout, Observed(T0 + 60, analysis=analysed("Passed", T0 + 60, 1)), {})
        assert (held.phase, held.reason) == ("Paused", "PausedAtStep")
        assert "holds until promoted" in held.message
        day = T0 + 86_400
        assert advance(held, rollout, Observed(day, analysis=analysed("Passed", day, 1)), {}).reason == "PausedAtStep"
        ended = advance(held, rollout_of(pauses=[{"atWeight": 25}], endStep=f"{held.candidate}/1"), Observed(day), {})
        assert (ended.phase, ended.reason, ended.scaling_for) == ("Progressing", "CandidateScaling", 100)

    def test_an_analysis_is_due_every_interval_of_a_step_in_effect(self) -> None:
        state = at_step(0)
        assert not analysis_due(state, rollout_of(), T0 + 5)
        assert analysis_due(state, rollout_of(), T0 + 10)
        state = state.model_copy(update={"analysis": analysed("Passed", T0 + 10)})
        assert not analysis_due(state, rollout_of(), T0 + 15)
        assert analysis_due(state, rollout_of(), T0 + 20)
        assert not analysis_due(state.model_copy(update={"step_started_at": None}), rollout_of(), T0 + 99)


SCALE = {"delaySeconds": 30, "headroomPercent": 0}


class TestStablePodsFollowTheWeight:
    @pytest.mark.parametrize(
        ("full", "weight", "headroom", "pods"),
        [
            (4, 25, 0, 3),
            (4, 25, 25, 4),
            (4, 50, 25, 3),
            (10, 50, 0, 5),
            (10, 50, 20, 6),
            (4, 100, 25, 1),
            (1, 50, 0, 1),
        ],
    )
    def test_the_share_plus_headroom_rounded_up_one_at_least(
        self, full: int, weight: int, headroom: int, pods: int
    ) -> None:
        assert stable_share(full, weight, headroom) == pods

    def test_a_steps_weight_scales_them_after_its_delay(self) -> None:
        rollout = rollout_of(scaleDown=SCALE)
        state = at_step(1)  # 25%, in effect since T0
        early = advance(state, rollout, Observed(T0 + 10, stable_full=4), {})
        assert early.stable_replicas is None  # the 5% step's share holds until then: all four
        later = advance(state, rollout, Observed(T0 + 30, stable_full=4), {})
        assert later.stable_replicas == 3
        last = advance(at_step(2), rollout, Observed(T0 + 31, stable_full=4), {})
        assert last.stable_replicas == 1  # at 100% one pod stays for a rollback

    def test_without_a_gateway_or_with_autoscaling_or_disabled_they_stay(self) -> None:
        assert advance(at_step(1), rollout_of(scaleDown=SCALE), Observed(T0 + 30), {}).stable_replicas is None
        disabled = rollout_of(scaleDown={**SCALE, "enabled": False})
        assert advance(at_step(1), disabled, Observed(T0 + 30, stable_full=4), {}).stable_replicas is None

    def test_a_slow_candidate_keeps_its_weight_until_the_stable_pods_are_back(self) -> None:
        rollout = rollout_of(scaleDown=SCALE)
        scaled = at_step(1).model_copy(update={"stable_replicas": 3})
        slow = analysed("Failed", T0 + 40, 1).model_copy(update={"check": "latency"})
        back = advance(scaled, rollout, Observed(T0 + 40, analysis=slow, stable_full=4), {})
        assert (back.phase, back.weight, back.stable_replicas) == ("RollingBack", 25, None)
        assert back.message is not None and back.message.endswith("back at full size")
        assert advance(back, rollout, Observed(T0 + 45, stable_full=4), {}).weight == 25
        moved = advance(back, rollout, Observed(T0 + 50, stable_rolled_out=True, stable_full=4), {})
        assert (moved.phase, moved.weight, moved.changed_at) == ("RollingBack", 0, timestamp(T0 + 50))

    def test_a_failing_candidate_loses_its_weight_at_once(self) -> None:
        scaled = at_step(1).model_copy(update={"stable_replicas": 3})
        failing = analysed("Failed", T0 + 40, 1).model_copy(update={"check": "failureRatio"})
        back = advance(scaled, rollout_of(), Observed(T0 + 40, analysis=failing, stable_full=4), {})
        assert (back.phase, back.weight, back.stable_replicas) == ("RollingBack", 0, None)
        crashed_ = advance(scaled, rollout_of(), Observed(T0 + 40, candidate_failure=crashed("Restarted")), {})
        assert (crashed_.phase, crashed_.weight) == ("RollingBack", 0)


class TestEndings:
    def test_promotion_waits_for_the_stable_deployment_then_sends_traffic_back(self) -> None:
        state = at_step(2).model_copy(update={"phase": "Promoting", "weight": 100})
        assert advance(state, rollout_of(), Observed(T0 + 70), {}).phase == "Promoting"
        served = {"instances": 2}
        moved = advance(state, rollout_of(), Observed(T0 + 80, stable_rolled_out=True), served)
        assert (moved.phase, moved.weight, moved.stable, moved.stable_spec) == (
            "Finishing", 0, state.candidate, served,
        )  # fmt: skip

    @pytest.mark.parametrize(("draining", "final"), [("Finishing", "Succeeded"), ("RollingBack", "RolledBack")])
    def test_the_candidate_goes_after_its_drain(self, draining: str, final: str) -> None:
        state = at_step(0).model_copy(update={"phase": draining, "weight": 0, "changed_at": timestamp(T0)})
        assert (
            advance(state, rollout_of(), Observed(T0 + DRAIN_SECONDS - 1, traffic_settled=True), {}).phase == draining
        )
        assert advance(state, rollout_of(), Observed(T0 + DRAIN_SECONDS, traffic_settled=False), {}).phase == draining
        ended = advance(state, rollout_of(), Observed(T0 + DRAIN_SECONDS, traffic_settled=True), {})
        assert ended.phase == final and not ended.candidate_wanted


class TestJudge:
    def verdict(self, candidate: TrackFigures, stable: TrackFigures | None) -> str:
        return judge(candidate, stable, rollout_of(), 0, 5, 10, T0).verdict

    def test_figures_from_triton_counters(self) -> None:
        figures = track_figures(successes=98, failures=2, duration_us=98 * 3000)
        assert (figures.requests, figures.failure_ratio, figures.mean_latency_ms) == (100, 0.02, 3.0)
        assert track_figures(0, 0, 0).failure_ratio is None

    def test_too_few_requests_are_no_data_never_a_pass(self) -> None:
        assert self.verdict(track_figures(19, 0, 19_000), track_figures(500, 0, 500_000)) == "NoData"

    def test_failures_beyond_the_stables_fail(self) -> None:
        stable = track_figures(985, 15, 985 * 2000)  # 1.5% failed
        assert self.verdict(track_figures(98, 2, 98 * 2000), stable) == "Passed"  # 2%: +0.5 points, allowed
        assert self.verdict(track_figures(97, 3, 97 * 2000), stable) == "Failed"  # 3%: +1.5 points

    def test_latency_beyond_the_ratio_fails(self) -> None:
        stable = track_figures(1000, 0, 1000 * 2000)
        assert self.verdict(track_figures(100, 0, 100 * 2900), stable) == "Passed"
        assert self.verdict(track_figures(100, 0, 100 * 4000), stable) == "Failed"

    def test_at_full_weight_only_failures_are_judged(self) -> None:
        # The stable revision's latency at an earlier step was taken at a lighter load per pod: no fair reference.
        idle_stable = track_figures(0, 0, 0)
        slower = judge(track_figures(100, 0, 100 * 4000), idle_stable, rollout_of(), 3, 100, 10, T0)
        assert slower.verdict == "Passed" and "latency not compared" in slower.message
        assert self.verdict(track_figures(97, 3, 97 * 2000), idle_stable) == "Failed"


ENVOY_BOUNDS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, math.inf)  # ms, Envoy's defaults


def at_gateway(
    requests: float = 200, errors: float = 0, resets: float = 0, times: dict[float, int] | None = None
) -> GatewayFigures:
    """What the gateway saw of a track: `times` the requests timed, by ms (default: every request at 8 ms, a p99
    of 9.95 ms in Envoy's buckets)."""
    timed = {8.0: int(requests)} if times is None else times
    by_le = {("+Inf" if bound == math.inf else f"{bound:g}"): float(sum(n for ms, n in timed.items() if ms <= bound))
             for bound in ENVOY_BOUNDS}  # fmt: skip
    return gateway_figures(requests, errors, resets, time_buckets(by_le))


def serving(gateway: GatewayFigures | None, requests: int = 200, ms: float = 2.0) -> TrackFigures:
    """A track whose Triton answered `requests` in `ms` each, none failed, and what the gateway saw of it."""
    return track_figures(requests, 0, requests * ms * 1000, gateway)


class TestJudgeAtTheGateway:
    """What callers got at the gateway's Envoy: its 5xx answers, resets and failed connections for each track's
    backends, and each track's p99."""

    def judged(self, candidate: TrackFigures, stable: TrackFigures, weight: int = 5, **analysis: Any) -> AnalysisStatus:
        rollout = rollout_of(analysis={**ROLLOUT["analysis"], **analysis})
        return judge(candidate, stable, rollout, 1, weight, 10, T0, through_gateway=True)

    def test_5xx_fail_a_candidate_that_triton_never_saw(self) -> None:
        """A candidate whose pods refuse connections: Envoy answers 503, Triton counts nothing (kserve#5983)."""
        found = self.judged(serving(at_gateway(errors=200), requests=0), serving(at_gateway()))
        assert (found.verdict, found.check) == ("Failed", "gatewayErrors")
        assert found.message.startswith("5xx answers at the gateway +100.00% against the stable revision's (at most")

    def test_without_the_gateway_check_that_candidate_is_only_no_data(self) -> None:
        rollout = rollout_of(analysis=ROLLOUT["analysis"])
        candidate, stable = serving(at_gateway(errors=200), requests=0), serving(at_gateway())
        found = judge(candidate, stable, rollout, 1, 5, 10, T0, True, frozenset({"gateway-failures"}))
        assert (found.verdict, found.check) == ("NoData", "requests")  # held at its weight, callers failing

    def test_failures_triton_counted_are_named_as_triton_counted_them(self) -> None:
        failing = track_figures(180, 20, 180 * 2000, at_gateway(errors=20))  # Triton answered its failures 500
        found = self.judged(failing, serving(at_gateway()))
        assert (found.verdict, found.check) == ("Failed", "failureRatio")

    def test_resets_and_failed_connections_fail(self) -> None:
        found = self.judged(serving(at_gateway(resets=10)), serving(at_gateway()))
        assert (found.verdict, found.check) == ("Failed", "gatewayResets")
        assert found.message.startswith("resets and failed connections at the gateway +5.00% against the stable")

    def test_the_stable_revisions_own_5xx_are_allowed(self) -> None:
        assert self.judged(serving(at_gateway(errors=6)), serving(at_gateway(errors=6))).verdict == "Passed"
        assert self.judged(serving(at_gateway(errors=9)), serving(at_gateway(errors=6))).verdict == "Failed"

    def test_too_few_requests_at_the_gateway_are_not_judged_there(self) -> None:
        found = self.judged(serving(at_gateway(requests=19, errors=19), requests=0), serving(at_gateway()))
        assert (found.verdict, found.check) == ("NoData", "requests")

    def test_a_p99_beyond_the_ratio_fails_with_both_the_ratio_and_the_slow_requests(self) -> None:
        """A slow tail with the same mean: what the mean cannot see. 20 of 200 requests at 40 ms, where the stable
        revision's p99 is 9.95 ms: 1% of requests beyond 1.5 times it would be 2."""
        found = self.judged(serving(at_gateway(times={8.0: 180, 40.0: 20})), serving(at_gateway()))
        assert (found.verdict, found.check) == ("Failed", "p99")
        assert found.message.startswith(
            "p99 at the gateway 47.5 ms against the stable revision's 9.9 ms: 4.77x (at most 1.5x): 20 of its 200 "
            "requests slower than 25 ms, 7.6e-14 likely from a p99 within it: candidate 200 requests, 0.00% failed, "
            "2.0 ms a request (gateway: 200, 0.00% 5xx, 0 resets, p99 47.5 ms)"
        ), found.message

    def test_without_the_p99_gate_that_candidate_passes(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr("inferop_operator.rollout._p99", lambda *_: ("Passed", "p99 not judged", None))
        assert self.judged(serving(at_gateway(times={8.0: 180, 40.0: 20})), serving(at_gateway())).verdict == "Passed"

    def test_a_p99_beyond_the_ratio_from_three_slow_requests_passes_and_says_why(self) -> None:
        """Two revisions of one build: the candidate's three slowest of 200 landed in Envoy's next bucket. Its p99
        reads 3.35x; three requests beyond 1.5 times the stable revision's p99 come by chance from a p99 within it
        one time in three."""
        found = self.judged(serving(at_gateway(times={8.0: 197, 40.0: 3})), serving(at_gateway()))
        assert found.verdict == "Passed"
        assert (
            "p99 at the gateway 33.3 ms against the stable revision's 9.9 ms: 3.35x, but only 3 of its 200 requests "
            "slower than 25 ms (0.32 likely from a p99 within 1.5x; the gate needs under 0.001)"
        ) in found.message, found.message
        many = at_gateway(requests=2000, times={8.0: 1950, 40.0: 50})
        assert self.judged(serving(many, requests=2000), serving(at_gateway())).verdict == "Failed"  # 2.5% of 2,000

    def test_a_p99_within_the_ratio_passes_and_the_ratio_is_the_specs(self) -> None:
        within = at_gateway(requests=2000, times={8.0: 1975, 12.0: 25})
        found = self.judged(serving(within, requests=2000), serving(at_gateway()))
        assert found.verdict == "Passed"
        assert "p99 at the gateway 13.0 ms against the stable revision's 9.9 ms: 1.31x" in found.message
        slow_tail = serving(at_gateway(times={8.0: 180, 40.0: 20}))
        assert self.judged(slow_tail, serving(at_gateway()), maxP99Ratio=5).verdict == "Passed"

    def test_no_request_on_a_side_is_no_data_never_a_pass(self) -> None:
        idle_stable = self.judged(serving(at_gateway()), serving(at_gateway(requests=0), requests=0))
        assert (idle_stable.verdict, idle_stable.check) == ("NoData", "p99")
        assert "no request of the stable revision at the gateway for its p99" in idle_stable.message
        unseen_candidate = self.judged(serving(None), serving(at_gateway()))
        assert (unseen_candidate.verdict, unseen_candidate.check) == ("NoData", "p99")

    def test_a_window_without_a_histogram_update_is_not_judged_and_says_so(self) -> None:
        """Envoy updates its histograms every 5 s: a window between two updates has requests and no quantile."""
        untimed = self.judged(serving(at_gateway(times={})), serving(at_gateway()))
        assert untimed.verdict == "Passed"
        assert "p99 not judged: Envoy updated no histogram in this window (it does every 5 s)" in untimed.message

    def test_a_p99_of_too_few_requests_is_not_judged_and_says_so(self) -> None:
        """60 requests: the p99 is their slowest, and one of them past a bucket's edge (10 ms here) moves it 2.5x."""
        few = at_gateway(requests=60, times={8.0: 59, 20.0: 1})
        found = self.judged(serving(few, requests=60), serving(at_gateway()))
        assert found.verdict == "Passed"
        assert "p99 not judged: 60 and 200 requests timed at the gateway, fewer than the 100 it needs" in found.message
        more = self.judged(serving(at_gateway(requests=120)), serving(at_gateway()), minRequests=150)
        assert "fewer than the 150 it needs" in more.message  # minRequests, where above 100

    def test_at_full_weight_the_idle_stable_revisions_p99_is_not_compared(self) -> None:
        slow_tail = serving(at_gateway(times={8.0: 180, 40.0: 20}))
        found = self.judged(slow_tail, serving(at_gateway(requests=0), requests=0), weight=100)
        assert found.verdict == "Passed"
        assert "p99 not compared: the stable revision served no request at the gateway" in found.message

    def test_without_envoy_series_or_a_gateway_the_message_says_p99_was_not_compared(self) -> None:
        unseen = self.judged(serving(None), serving(None))
        assert unseen.verdict == "Passed"
        assert "p99 not compared: Prometheus has no Envoy series for the route's backends" in unseen.message
        by_replicas = judge(serving(None), serving(None), rollout_of(), 1, 5, 10, T0)
        assert "p99 not compared: no gateway (split by replicas)" in by_replicas.message

    def test_a_gateway_failure_rolls_back_and_no_data_only_pauses(self) -> None:
        failed = self.judged(serving(at_gateway(errors=200), requests=0), serving(at_gateway()))
        moved = advance(at_step(1), rollout_of(), Observed(T0 + 10, analysis=failed), {})
        assert (moved.phase, moved.reason, moved.weight) == ("RollingBack", "AnalysisFailed", 0)
        assert moved.analysis is not None and moved.analysis.check == "gatewayErrors"


def crashed(reason: str) -> Diagnosis:
    return Diagnosis(reason, f"container triton of pod conv-net-canary-1: {reason}")


class TestCandidatePods:
    """A candidate whose pods fail is rolled back whatever its metrics say (they have none to say), with the
    failure as the reason; never held at its weight while its callers fail."""

    @pytest.mark.parametrize("reason", ["OOMKilled", "CrashLoopBackOff", "Restarted", "Unavailable"])
    def test_a_failing_pod_rolls_back_at_once(self, reason: str) -> None:
        moved = advance(at_step(1), rollout_of(), Observed(T0 + 3, candidate_failure=crashed(reason)), {})
        assert (moved.phase, moved.reason, moved.weight, moved.header, moved.mirror_percent) == (
            "RollingBack", f"Candidate{reason}", 0, False, 0,
        )  # fmt: skip
        assert moved.message == f"revision {moved.candidate}: container triton of pod conv-net-canary-1: {reason}"

    def test_before_any_traffic_and_while_paused_too(self) -> None:
        spec, state = started()
        assert spec.rollout is not None
        agreeing = advance(state, spec.rollout, Observed(T0 + 5, candidate_failure=crashed("OOMKilled")), {})
        assert (agreeing.phase, agreeing.reason) == ("RollingBack", "CandidateOOMKilled")
        paused = at_step(0).model_copy(update={"phase": "Paused", "reason": "PausedBySpec"})
        held = advance(paused, rollout_of(paused=True), Observed(T0 + 5, candidate_failure=crashed("Restarted")), {})
        assert (held.phase, held.reason) == ("RollingBack", "CandidateRestarted")

    def test_a_failing_candidate_is_never_promoted(self) -> None:
        state = at_step(0)
        moved = advance(
            state, rollout_of(promote=state.candidate), Observed(T0 + 1, candidate_failure=crashed("OOMKilled")), {}
        )
        assert moved.phase == "RollingBack"

    def test_once_promoting_the_stable_deployment_takes_over(self) -> None:
        state = at_step(2).model_copy(update={"phase": "Promoting", "weight": 100})
        assert advance(state, rollout_of(), Observed(T0 + 1, candidate_failure=crashed("OOMKilled")), {}) == state

    def test_without_the_pod_check_a_crashing_candidate_keeps_its_weight(self) -> None:
        """What the analysis alone made of a crashing candidate: no Triton metrics, so no data, and at the step's end
        a pause with its weight held while callers fail."""
        no_data = analysed("NoData", T0 + 60, 1)
        held = advance(at_step(1), rollout_of(), Observed(T0 + 60, analysis=no_data), {})
        assert (held.phase, held.reason, held.weight) == ("Paused", "NoData", 25)
        moved = advance(
            at_step(1),
            rollout_of(),
            Observed(T0 + 60, analysis=no_data, candidate_failure=crashed("CrashLoopBackOff")),
            {},
        )
        assert (moved.phase, moved.reason, moved.weight) == ("RollingBack", "CandidateCrashLoopBackOff", 0)


class TestReplicas:
    @pytest.mark.parametrize(
        ("total", "weight", "split"),
        [(4, 0, (4, 0)), (4, 5, (3, 1)), (4, 50, (2, 2)), (4, 90, (1, 3)), (4, 100, (0, 4)), (1, 25, (1, 1))],
    )
    def test_the_nearest_share_of_pods_with_one_each_while_both_serve(
        self, total: int, weight: int, split: tuple[int, int]
    ) -> None:
        assert replica_split(total, weight) == split

    def test_a_gateways_candidate_gets_its_share_rounded_up(self) -> None:
        assert canary_replicas(4, 50, 0, False) == 2
        assert canary_replicas(10, 5, 0, False) == 1
        assert canary_replicas(10, 25, 0, False) == 3
        assert canary_replicas(10, 0, 20, True) == 2
        assert canary_replicas(0, 0, 0, False) == 1


class TestEnvoysHistogram:
    def test_the_quantile_is_prometheus_histogram_quantile(self) -> None:
        """Linear within the bucket, from 0 below the first, the highest finite bound in the +Inf bucket."""
        buckets = time_buckets({"5": 50.0, "10": 100.0, "+Inf": 100.0})
        assert histogram_quantile(0.5, buckets) == 5.0
        assert histogram_quantile(0.25, buckets) == 2.5
        assert histogram_quantile(0.99, buckets) == 9.9
        assert histogram_quantile(0.99, time_buckets({"5": 50.0, "10": 90.0, "+Inf": 100.0})) == 10.0
        assert histogram_quantile(0.99, time_buckets({"5": 0.0, "+Inf": 0.0})) is None

    def test_buckets_are_ordered_and_cumulative_whatever_increase_gave(self) -> None:
        assert time_buckets({"+Inf": 10.0, "10": 9.0, "5": 9.2}) == ((5.0, 9.2), (10.0, 9.2), (math.inf, 10.0))

    def test_slow_requests_are_counted_above_the_next_bound_never_more(self) -> None:
        figures = at_gateway(times={8.0: 180, 12.0: 10, 40.0: 10})
        assert figures.slower_than(14.9) == (25.0, 10.0)
        assert figures.slower_than(10.0) == (10.0, 20.0)
        assert figures.slower_than(20_000) == (math.inf, 0.0)


class TestSafeguardsRemoved:
    """INFEROP_ROLLOUT_ABLATE, for the drills' ablations: each safeguard removed, the state machine does what it would
    do without it (and the unit tests above, what it does with it)."""

    def test_without_ready_pods_a_step_takes_its_weight_at_once(self) -> None:
        passed = analysed("Passed", T0 + 60)
        waits = advance(at_step(0), rollout_of(), Observed(T0 + 60, analysis=passed), {})
        assert (waits.step, waits.weight, waits.scaling_for) == (0, 5, 25)
        ablated = Observed(T0 + 60, analysis=passed, ablated=frozenset({"ready-pods"}))
        moved = advance(at_step(0), rollout_of(), ablated, {})
        assert (moved.reason, moved.step, moved.weight, moved.scaling_for) == ("StepStarted", 1, 25, None)

    def test_without_the_sliding_window_an_analysis_reads_the_step_so_far(self) -> None:
        state = at_step(0, settled_at=T0)
        assert analysis_window(state, rollout_of(), T0 + 50) == (T0 + 40, 10)
        assert analysis_window(state, rollout_of(), T0 + 50, frozenset({"sliding-window"})) == (T0, 50)

    def test_without_stable_first_a_slow_candidate_loses_its_weight_before_the_stable_pods_are_back(self) -> None:
        rollout = rollout_of(scaleDown=SCALE)
        scaled = at_step(1).model_copy(update={"stable_replicas": 3})
        slow = analysed("Failed", T0 + 40, 1).model_copy(update={"check": "latency"})
        back = advance(scaled, rollout, Observed(T0 + 40, analysis=slow, stable_full=4), {})
        ablated = Observed(T0 + 41, stable_full=4, ablated=frozenset({"stable-first"}))
        assert advance(back, rollout, ablated, {}).weight == 0

"""`inferop rollout`: what each action writes, when it is refused, and how the status reads (tests/kube/test_rollout.py
runs it against the operator on the real control plane)."""

from __future__ import annotations

import re

import pytest

from inferop_operator.rollout import RolloutStatus
from inferop_operator.rolloutcli import ACTIONS, RolloutCommandError, check_action, describe

SPEC = {"rollout": {"steps": [10, 50, 100]}}


def at(phase: str | None, **fields: object) -> RolloutStatus:
    return RolloutStatus.model_validate({"phase": phase, "stable": "aaa", "candidate": "bbb", **fields})


@pytest.mark.parametrize(
    ("action", "written"),
    [("promote", {"endStep": "bbb/1"}), ("promote --full", {"promote": "bbb"}), ("abort", {"abort": "bbb"}),
     ("pause", {"paused": True}), ("resume", {"paused": False})],
)  # fmt: skip
def test_each_action_writes_the_field_the_operator_acts_on(action: str, written: dict[str, object]) -> None:
    assert ACTIONS[action].spec(at("Progressing", step=1, weight=50)) == written


def test_retry_writes_a_new_value_naming_the_candidate_and_removes_what_would_end_it() -> None:
    written = ACTIONS["retry"].spec(at("RolledBack"))
    assert written["abort"] is written["promote"] is written["endStep"] is None
    assert re.fullmatch(r"bbb/[0-9]+", str(written["retry"]))


@pytest.mark.parametrize(
    ("action", "phase", "said"),
    [
        ("promote", "Agreement", "cannot promote conv-net: its rollout is Agreement (only in Paused, Progressing)"),
        ("promote", "Succeeded", "its rollout is Succeeded"),
        ("abort", "RolledBack", "cannot abort conv-net: its rollout is RolledBack"),
        ("abort", None, "cannot abort conv-net: no rollout has started"),
        ("retry", "Progressing", "cannot retry conv-net: its rollout is Progressing (only in RolledBack)"),
        ("pause", "Promoting", "cannot pause conv-net: its rollout is Promoting"),
    ],
)
def test_an_action_the_phase_does_not_allow_is_refused_naming_the_phase(
    action: str, phase: str | None, said: str
) -> None:
    with pytest.raises(RolloutCommandError, match=re.escape(said)):
        check_action("conv-net", action, SPEC, at(phase))


def test_a_service_without_a_rollout_section_is_refused() -> None:
    with pytest.raises(RolloutCommandError, match=re.escape("conv-net has no spec.rollout")):
        check_action("conv-net", "pause", {}, at("Progressing"))


def test_each_action_is_taken_up_when_the_status_shows_it() -> None:
    def taken(action: str, before: RolloutStatus, now: RolloutStatus) -> bool:
        return ACTIONS[action].taken(before)(now)

    step = at("Progressing", step=0, weight=10)
    assert taken("promote", step, at("Progressing", step=0, weight=10, scalingFor=50))
    assert taken("promote", step, at("Progressing", step=1, weight=50))
    assert not taken("promote", step, step)
    assert taken("promote --full", step, at("Promoting")) and not taken("promote --full", step, step)
    assert taken("abort", step, at("RollingBack")) and not taken("abort", step, at("Paused"))
    assert taken("retry", at("RolledBack"), at("Agreement")) and not taken("retry", at("RolledBack"), at("RolledBack"))
    assert taken("pause", step, at("Paused", reason="PausedBySpec"))
    assert not taken("pause", step, at("Paused", reason="NoData"))  # held for want of data, not by the spec
    assert taken("resume", step, at("Progressing", reason="Resumed"))


def test_the_status_names_the_step_the_weight_and_what_it_waits_for() -> None:
    text = describe(at("Progressing", reason="CandidateScaling", message="step 2 of 3 waits", step=0, weight=10,
                       scalingFor=50), [10, 50, 100])  # fmt: skip
    assert text.splitlines() == [
        "Progressing: CandidateScaling step 2 of 3 waits",
        "stable aaa, candidate bbb",
        "step 1 of 3, 10% of requests to the candidate",
        "waiting for the candidate's pods for 50% of requests to be Ready",
    ]
    assert describe(at(None, candidate=None), []) == "no rollout yet; stable revision aaa"

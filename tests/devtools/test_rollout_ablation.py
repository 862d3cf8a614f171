"""An ablation of the rollout drill passes only on its scenario's outcome: a rollout held for ever is one (its goal
was not met in time), a drill that could not run is not."""

from __future__ import annotations

from typing import Any

import pytest

from inferop_devtools.cluster.controlplane import ClusterError
from inferop_devtools.drills import rollout
from inferop_devtools.drills.rollout import Ablation, Drill, NeverEnded, Settings, goals


def drill() -> Drill:
    return Drill(plane=None, models=None, settings=Settings.of(quick=True))  # type: ignore[arg-type]


@pytest.fixture
def scenario(monkeypatch: pytest.MonkeyPatch) -> Any:
    def install(outcome: Any) -> Ablation:
        def run(ablated: Drill) -> dict[str, Any]:
            assert ablated.settings.removed == {"analysis": {"maxP99Ratio": 100}}  # the gate at its most
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        monkeypatch.setitem(rollout.SCENARIOS, "probe", run)
        return Ablation("probe", "the p99 gate", rollout=rollout.gates_off("maxP99Ratio"), must_fail="back at")

    return install


def test_the_ablation_passes_when_the_named_goal_fails(scenario: Any) -> None:
    ablation = scenario({"final": "Succeeded", "goals": goals(("back at weight 0 within 5 s", False), ("other", True))})
    result = ablation.run(drill())
    assert result["goals"][0]["met"] and result["final"] == "Succeeded"
    assert "back at weight 0" in result["goals"][0]["text"]


def test_the_ablation_fails_when_the_goal_holds_without_the_mechanism(scenario: Any) -> None:
    ablation = scenario({"goals": goals(("back at weight 0 within 5 s", True), ("other", False))})
    result = ablation.run(drill())
    assert not result["goals"][0]["met"] and "none did" in result["goals"][0]["text"]


def test_a_rollout_held_for_ever_fails_its_goal(scenario: Any) -> None:
    ablation = scenario(
        NeverEnded('the rollout of probe to end: not after 180 s\n{"phase": "Paused", "reason": "NoData"}')
    )
    result = ablation.run(drill())
    assert result["goals"][0]["met"]
    assert "phase Paused, reason NoData" in result["goals_with_it_removed"][0]["text"]


def test_a_drill_that_could_not_run_does_not_pass_the_ablation(scenario: Any) -> None:
    ablation = scenario(ClusterError("the pods of probe Ready: not after 120 s"))  # not the rollout's end
    with pytest.raises(ClusterError, match="pods of probe"):
        ablation.run(drill())

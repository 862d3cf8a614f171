"""Rollouts through the real data plane on the local cluster's node: the rollout drill's quick run as its own process,
since it enters the node's network namespace (see inferop_devtools.drills.rollout; `make drills` runs all of its
candidates at full length, and each one's ablation). A quick set that covers each kind of decision: a good candidate
promoted (with the chart's dashboard read mid-rollout), one that fails on some inputs rolled back within its first
step's budget, one whose servers crash, one whose pods refuse the gateway and one that regresses late in a long step,
each back at weight 0 within an interval, one whose p99 regresses rolled back by the p99 gate, one that disagrees
refused before any live request, a slow-starting one whose weights wait for its pods, Prometheus stopped mid-rollout
(held, never promoted blind), a user steering a rollout with `inferop rollout`, a slow candidate rolled back with
the stable pods scaled down to its weight's share, which keeps its traffic until they are back, and Inception V3
behind its image pipeline promoted on its top labels while callers send the candidate bytes that are no image."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from inferop_devtools.drills.rollout import ENVOY_CHURN

pytestmark = pytest.mark.integration
SCENARIOS = (
    "good",
    "failing",
    "crash",
    "gateway_503",
    "late",
    "p99",
    "wrong",
    "starting",
    "blind",
    "steer",
    "capacity_slow",
    "pipeline",
)


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("rollout")
    figures = root / "rollout.json"
    argv = [sys.executable, "-m", "inferop_devtools.drills.rollout", "--quick", f"--scenarios={','.join(SCENARIOS)}"]
    result = subprocess.run(
        [*argv, f"--json={figures}", f"--workdir={root / 'work'}"],
        capture_output=True,
        text=True,
        timeout=2700,
        check=False,
    )
    assert figures.exists(), result.stderr[-4000:]
    found: dict[str, Any] = json.loads(figures.read_text())
    return found


def test_a_good_candidate_is_promoted_and_a_failing_one_rolled_back(drill: dict[str, Any]) -> None:
    good, failing = drill["scenarios"]["good"], drill["scenarios"]["failing"]
    seen = json.dumps({key: good[key] for key in ("callers", "transitions", "envoy")}, indent=1)
    assert (good["final"], good["callers"]["failed"], good["failed_at_weight_changes"]) == ("Succeeded", 0, 0), seen
    # Every step moved the route's endpoints: Envoy added no cluster that a weight change would route to too soon.
    assert good["envoy"] == dict.fromkeys(ENVOY_CHURN, 0), seen
    weights = [t["weight"] for t in good["transitions"] if t["phase"] == "Progressing"]
    assert weights[0] == 50 and 100 in weights  # through each step, not at once
    dashboard = good["dashboard"]  # the Triton and gateway panels at the 50% step
    assert dashboard["every_query_answered"] and dashboard["in_unit"], json.dumps(dashboard["panels"], indent=1)
    assert abs(dashboard["canary_share"] - 0.5) <= dashboard["share_tolerance"] < 0.5  # binomial: 4 sigma
    assert (failing["final"], failing["reason"]) == ("RolledBack", "AnalysisFailed")
    assert 0 < failing["callers"]["failed"] <= failing["failed_bound"]
    assert "failure ratio" in failing["message"]
    assert drill["operator_tracebacks"] == []


@pytest.mark.parametrize("scenario", ["crash", "gateway_503", "late"])
def test_a_candidate_that_breaks_mid_step_is_back_at_weight_0_within_an_interval(
    drill: dict[str, Any], scenario: str
) -> None:
    broken = drill["scenarios"][scenario]
    interval = drill["settings"]["interval_seconds"]
    seen = json.dumps({key: broken.get(key) for key in ("message", "transitions", "analyses", "fault")}, indent=1)
    assert broken["final"] == "RolledBack", seen
    assert broken["seconds_from_fault_to_weight_0"] <= interval + 2, seen
    assert broken["failed_after_fault"] <= broken["failed_bound"], seen
    if scenario == "crash":  # no metrics from a server that is gone: the API's restart rolls it back
        assert broken["reason"] in ("CandidateRestarted", "CandidateUnavailable"), seen
    if scenario == "gateway_503":  # pods Ready, Triton unaware: what the gateway saw rolls it back
        failed = [a for a in broken["analyses"] if a["verdict"] == "Failed"]
        assert failed and failed[0]["check"] in ("gatewayErrors", "gatewayResets"), seen


def test_a_tail_that_the_mean_hides_is_rolled_back_by_the_p99_gate(drill: dict[str, Any]) -> None:
    p99 = drill["scenarios"]["p99"]
    seen = json.dumps({key: p99.get(key) for key in ("message", "transitions", "analyses")}, indent=1)
    assert (p99["final"], p99["reason"]) == ("RolledBack", "AnalysisFailed"), seen
    assert "p99 at the gateway" in p99["message"], seen


def test_a_candidate_that_disagrees_never_gets_a_live_request(drill: dict[str, Any]) -> None:
    wrong = drill["scenarios"]["wrong"]
    assert (wrong["final"], wrong["reason"]) == ("RolledBack", "Disagrees"), wrong["message"]
    assert wrong["candidate_live_requests"] == 0 and wrong["callers"]["failed"] == 0


def test_weights_wait_for_a_slow_starting_candidates_pods(drill: dict[str, Any]) -> None:
    starting = drill["scenarios"]["starting"]
    assert starting["final"] == "Succeeded", json.dumps(starting["transitions"], indent=1)
    assert starting["steps_that_waited_for_pods"] > 0 and starting["callers"]["failed"] == 0


def test_blind_the_rollout_holds_its_weight_and_goes_on_once_prometheus_is_back(drill: dict[str, Any]) -> None:
    blind = drill["scenarios"]["blind"]
    seen = json.dumps(blind["transitions"], indent=1)
    assert (blind["paused"], blind["weight_while_blind"]) == ("Paused", drill["settings"]["steps"][0]), seen
    assert blind["final"] == "Succeeded", seen


def test_inferop_rollout_steers_within_one_reconcile(drill: dict[str, Any]) -> None:
    steer = drill["scenarios"]["steer"]
    assert steer["final"] == "Succeeded", json.dumps(steer["transitions"], indent=1)
    for action, taken in steer["steered"].items():
        assert taken["exit"] == 0 and taken["seconds"] is not None and taken["seconds"] < 5, (action, taken)
    assert steer["callers"]["failed"] == 0


def test_a_slow_candidate_keeps_its_traffic_until_the_scaled_down_stable_pods_are_back(drill: dict[str, Any]) -> None:
    slow = drill["scenarios"]["capacity_slow"]
    seen = json.dumps(slow["stable_pods"], indent=1)
    assert (slow["final"], slow["reason"]) == ("RolledBack", "AnalysisFailed"), seen
    assert any(s["weight"] == 67 and s["wanted"] == 1 for s in slow["stable_pods"]), seen  # scaled to its share
    off = next(s for s in slow["stable_pods"] if s["phase"] == "RollingBack" and s["weight"] == 0)
    assert off["ready"] == 3, seen
    assert slow["callers"]["failed"] == 0


def test_an_image_pipeline_is_promoted_on_its_answers_though_callers_send_it_bytes_that_are_no_image(
    drill: dict[str, Any],
) -> None:
    pipeline = drill["scenarios"]["pipeline"]
    seen = json.dumps({key: pipeline.get(key) for key in ("message", "agreement", "transitions", "analyses")}, indent=1)
    assert pipeline["final"] == "Succeeded" and pipeline["agreement"]["passed"], seen
    assert pipeline["photographs"]["sent"] > 0 and pipeline["photographs"]["failed"] == 0, pipeline["photographs"]
    refused = pipeline["not_an_image"]
    assert refused["sent"] > 0 and refused["answered_400_naming_it"] == refused["sent"], refused


def test_every_goal_is_met(drill: dict[str, Any]) -> None:
    assert drill["met"], json.dumps([s["goals"] for s in drill["scenarios"].values()], indent=1)

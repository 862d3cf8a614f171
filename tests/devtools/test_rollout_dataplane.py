"""One promotion and one rollback through the real data plane on the local cluster's node: the rollout drill's quick
run (a good candidate, with the chart's dashboard read mid-rollout, then one that fails on some inputs) as its own
process, since it enters the node's network namespace (see inferop_devtools.drills.rollout; `make drills` runs all
of its candidates at full length)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from inferop_devtools.drills.rollout import ENVOY_CHURN

pytestmark = pytest.mark.integration


def test_a_good_candidate_is_promoted_and_a_failing_one_rolled_back(tmp_path: Path) -> None:
    figures = tmp_path / "rollout.json"
    argv = [sys.executable, "-m", "inferop_devtools.drills.rollout", "--quick", "--scenarios=good,failing"]
    result = subprocess.run(
        [*argv, f"--json={figures}", f"--workdir={tmp_path / 'work'}"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert figures.exists(), result.stderr[-4000:]
    found = json.loads(figures.read_text())
    good, failing = found["scenarios"]["good"], found["scenarios"]["failing"]
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
    assert found["operator_tracebacks"] == []
    assert found["met"], json.dumps([s["goals"] for s in found["scenarios"].values()], indent=1)

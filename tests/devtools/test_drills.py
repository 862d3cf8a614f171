"""Small versions of `make drills`' control-plane drills: each asserts the behaviour, never a speed.

Each starts its own control plane (the restart drill stops it), with the operator as its own process."""

from __future__ import annotations

from pathlib import Path

import pytest

from inferop_devtools.drills.badspecs import BadSpec, generate
from inferop_operator.plan import Refusal, plan_service
from inferop_operator.spec import SpecError, parse_spec


class TestGenerator:
    def test_at_least_300_cases_the_same_for_the_same_seed(self) -> None:
        cases = generate(320, seed=4)
        assert len(cases) >= 300
        assert [(c.name, c.field, c.spec) for c in cases] == [(c.name, c.field, c.spec) for c in generate(320, seed=4)]

    def test_every_category_the_issue_lists_is_covered(self) -> None:
        categories = {case.category for case in generate()}
        for expected in [
            "wrong type", "out of range", "bad quantity", "bad storage URI", "tensor: no dims", "tensor: dim of 0",
            "tensor: duplicate names", "autoscaling min above max", "long name", "unicode", "empty or null section",
            "field deleted",
        ]:  # fmt: skip
            assert expected in categories

    def test_each_spec_is_refused_by_the_spec_model_naming_its_field(self) -> None:
        """The operator's own validation refuses every case too: nothing relies on the apiserver's schema alone."""
        for case in generate():
            if case.field == "metadata.name":
                continue  # a name the apiserver refuses; the spec itself is valid
            with pytest.raises((SpecError, Refusal)) as refused:
                plan_service(parse_spec(case.spec))
            assert case.leaf in str(refused.value) or case.field == "model", (case.category, case.field)


def one_of_each_category() -> list[BadSpec]:
    seen: dict[str, BadSpec] = {}
    for case in generate():
        seen.setdefault(case.category, case)
    return list(seen.values())


@pytest.mark.integration
class TestDrillsOnAControlPlane:
    def test_bad_specs_are_refused_where_they_are_first_seen(self, tmp_path: Path) -> None:
        from inferop_devtools.drills.badspecs import run_bad_specs

        result = run_bad_specs(tmp_path, valid=2, cases=one_of_each_category())
        assert result["refused"] == result["cases"], result["accepted"]
        assert result["refused_by_operator"] > 0 and result["refused_by_apiserver"] > 0  # both edges are exercised
        assert result["named_field"] == result["refused"], result["unnamed"]
        assert result["operator_alive"] and not result["tracebacks"]

    def test_a_killed_operator_converges_every_service_to_its_latest_spec(self, tmp_path: Path) -> None:
        from inferop_devtools.drills.kills import run_operator_kills

        result = run_operator_kills(tmp_path, services=5, kills=2, changes=10, seed=3)
        assert result["operator_starts"] == 3
        for problem in ("stale_status", "wrong_config", "duplicate_children", "missing_children", "orphaned_owners"):
            assert result[problem] == [], problem
        assert result["events_over_bound"] == {}
        assert not result["tracebacks"]

    def test_the_operator_outlives_a_control_plane_restart(self, tmp_path: Path) -> None:
        from inferop_devtools.drills.restart import run_apiserver_restart

        result = run_apiserver_restart(tmp_path, rounds=1, services=3, pause=1.0)
        assert result["operator_alive"] and result["operator_starts"] == 1 and not result["operator_exits"]
        assert result["deployments_missing"] == []


@pytest.mark.integration
def test_a_drill_cluster_that_fails_to_start_leaves_no_control_plane(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed `with DrillCluster(...)` gets no __exit__: its own __enter__ must stop what it started."""
    import subprocess

    from inferop_devtools.cluster.controlplane import ClusterError, kube_binaries
    from inferop_devtools.drills.harness import DrillCluster

    try:
        kube_binaries(build=False)
    except ClusterError as missing:  # make tools builds it before make test: missing is a failure
        pytest.fail(str(missing))

    def refused(*args: str, **kwargs: object) -> None:
        raise subprocess.CalledProcessError(1, ["kubectl", *args], stderr="the CRD was refused")

    cluster = DrillCluster(tmp_path)
    monkeypatch.setattr(cluster, "kubectl", refused)
    with pytest.raises(subprocess.CalledProcessError), cluster:
        pass
    assert cluster.plane.state() is None and not cluster.plane.healthy()

"""`make bench`'s image pipeline section: how its goals are judged from the figures, the plan's ablation included."""

from __future__ import annotations

from typing import Any

from inferop_devtools.bench.pipeline import pipeline_lines, pipeline_targets


def served(median: float, request_bytes: int, callers_cpus: float = 0.01, errors: int = 0) -> dict[str, Any]:
    return {"median": median, "rounds": [median] * 3, "p99_ms": 2500.0, "request_bytes": request_bytes,
            "callers_cpu_ms": 0.2, "callers_cpus": callers_cpus, "errors": errors}  # fmt: skip


def figures(ensemble: float, model: float, decoding: float, naive: float, errors: int = 0) -> dict[str, Any]:
    return {
        "total_cpus": 1.0, "callers": 16, "stages": "1 decoding instance(s) of one thread", "proved": "40 photographs",
        "ensemble": served(ensemble, 57_000, errors=errors), "model": served(model, 1_072_988),
        "decoding": served(decoding, 1_072_988, 0.1), "decoding_splits": {"0.1": served(decoding, 1_072_988, 0.1)},
        "naive_ensemble": served(naive, 57_000),
    }  # fmt: skip


def outcome(measured: dict[str, Any]) -> dict[str, bool]:
    return {target.name: target.missed for target in pipeline_targets(measured)}


def test_an_ensemble_at_the_models_pace_with_fewer_bytes_meets_every_goal() -> None:
    assert not any(outcome(figures(ensemble=8.7, model=9.2, decoding=8.4, naive=7.5)).values())
    lines = pipeline_lines(figures(8.7, 9.2, 8.4, 7.5))
    assert any("the planned ensemble" in line and "57,000 bytes" in line for line in lines)


def test_each_goal_is_missed_on_its_own() -> None:
    assert outcome(figures(ensemble=8.0, model=9.2, decoding=7.9, naive=7.5))["ensemble / bare model, same CPU"]
    assert outcome(figures(8.7, 9.2, decoding=8.8, naive=7.5))["ensemble / callers decoding, same total CPU"]
    assert outcome(figures(8.7, 9.2, 8.4, naive=8.8))["planned / naive ensemble"]
    assert outcome(figures(8.7, 9.2, 8.4, 7.5, errors=1))["ensemble errors and rejections"]
    bytes_missed = figures(8.7, 9.2, 8.4, 7.5)
    bytes_missed["ensemble"]["request_bytes"] = 200_000
    assert outcome(bytes_missed)["bytes a request: tensors / image"]

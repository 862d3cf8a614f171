"""The memory drill's mechanisms (inferop_devtools.field.memory), without a server: the fit recovers the constants
that made its points, and the drill's goal, the memory limit covering the peak, is judged on the points it held out of
the fit, never on the fit's own."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest

from inferop_core.memory import MiB, ModelCosts, RuntimeCosts, ServingShape, estimate_memory
from inferop_devtools.field.memory import LIMIT_OVER_PEAK_BOUND, calibrate, summarise
from inferop_operator.plan import MEMORY_MARGIN

TRUE = RuntimeCosts(
    name="made up",
    baseline_bytes=20 * MiB,
    instance_bytes=30 * MiB,
    weight_factor=1.7,
    activation_factor=1.4,
    buffer_factor=1.3,
    request_bytes=15_000,
    busy_instance_bytes=12 * MiB,
    measured="made up for the tests",
)
MODELS = {
    # Outputs as large as its inputs: a fit that counted a queued request's outputs, which the estimate does not,
    # would find other constants than those that made the points.
    "big_weights": ModelCosts(
        weight_bytes=90 * MiB,
        activation_bytes_per_sample=10 * MiB,
        io_bytes_per_sample=1 << 20,
        input_bytes_per_sample=1 << 19,
    ),
    "small": ModelCosts(weight_bytes=5 * MiB, activation_bytes_per_sample=1 << 16, io_bytes_per_sample=1 << 10),
}


def rows(network: str, instances: int, batch: int, queue: int, off: float = 0.0) -> list[dict[str, Any]]:
    """The idle and saturated rows a drill would measure if the peaks were TRUE's estimates x (1 + off)."""
    model = MODELS[network]
    out = []
    for state in ("idle", "saturated"):
        peak = estimate_memory(model, ServingShape(instances, batch, queue), TRUE, saturated=state == "saturated")
        out.append(
            {
                "network": network,
                "model": asdict(model),
                "instances": instances,
                "max_batch_size": batch,
                "queue_bound": queue,
                "inputs": 1,
                "state": state,
                "measured_bytes": round(peak.total * (1 + off)),
                "estimate_bytes": peak.total,
                "error": round(1 / (1 + off) - 1, 4),
            }
        )
    return out


FIT = [r for n in MODELS for i in (1, 2) for b in (1, 8, 32) for r in rows(n, i, b, queue=40 * i)]


def test_the_fit_recovers_the_constants_that_made_its_points() -> None:
    fitted = calibrate(FIT, "test")
    assert fitted["baseline_bytes"] == pytest.approx(TRUE.baseline_bytes, rel=1e-3)
    assert fitted["instance_bytes"] == pytest.approx(TRUE.instance_bytes, rel=1e-3)
    for name in ("weight_factor", "activation_factor", "buffer_factor"):
        assert fitted[name] == pytest.approx(getattr(TRUE, name), abs=1e-3)
    assert fitted["request_bytes"] == pytest.approx(TRUE.request_bytes, rel=1e-2)
    assert fitted["busy_instance_bytes"] == pytest.approx(TRUE.busy_instance_bytes, rel=1e-2)


def test_the_goal_is_the_held_out_limit() -> None:
    """A perfect fit says nothing: points the fit never saw, measured half again above the estimate, are above the
    limit (the estimate x MEMORY_MARGIN) and fail the goal, and so do points so far under it that the limit is more
    than LIMIT_OVER_PEAK_BOUND x their peak; points 10% above it pass."""
    held_out = rows("big_weights", 1, 64, 40, off=0.5)
    summary = summarise([dict(r) for r in FIT], held_out)
    assert summary["worst_error_fitted"] == pytest.approx(0, abs=1e-3)
    assert summary["worst_error_held_out"] == pytest.approx(1 - 1 / 1.5, abs=1e-3)
    assert summary["margin_needed_fitted"] == 1.0
    assert summary["limit_over_peak_held_out"][0] == pytest.approx(MEMORY_MARGIN / 1.5, abs=1e-3)
    assert not summary["goal"]["met"]
    close = rows("big_weights", 1, 64, 40, off=0.1)
    assert summarise([dict(r) for r in FIT], close)["goal"]["met"]
    assert MEMORY_MARGIN / 1.5 < 1 < MEMORY_MARGIN / 1.1
    wasted = rows("big_weights", 1, 64, 40, off=-0.3)
    assert not summarise([dict(r) for r in FIT], wasted)["goal"]["met"]
    assert MEMORY_MARGIN / 0.7 > LIMIT_OVER_PEAK_BOUND


def test_held_out_points_cannot_move_the_constants() -> None:
    """The constants refitted by the drill come from the fit set alone."""
    first = summarise([dict(r) for r in FIT], rows("small", 2, 64, 80, off=0.5))["refit"]
    second = summarise([dict(r) for r in FIT], rows("small", 2, 64, 80, off=-0.5))["refit"]
    assert {k: v for k, v in first.items() if k != "measured"} == {k: v for k, v in second.items() if k != "measured"}


def test_no_held_out_point_fails_the_goal() -> None:
    """The worst error of nothing is no figure: a drill that measured no held-out point has not met its goal."""
    assert not summarise([dict(r) for r in FIT], [])["goal"]["met"]

"""The local runtime's memory constants (inferop_core.memory.LOCAL_RUNTIME) and the memory limit's margin
(plan.MEMORY_MARGIN) against peaks the kernel measured.

tests/data/memory_measured.json holds the points of one `make field` memory drill (out/field/memory-points.json):
each pod's peak in a memory cgroup, idle and saturated at its derived queue bound, with the model's costs as
export profiled them. The fit set is what the constants were fitted on, and the margin taken from; the held-out set
(other models, other shapes, wider batches) is what they predict. The limit a manifest gets (the estimate with the
margin) must cover every measured peak, or the plan promises away an OOM kill that happens; and it must stay within
LIMIT_OVER_PEAK_BOUND of it, or the margin is too large to be of use. Constants or a margin that are not what these
points give fail here too.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

import pytest

from inferop_core.memory import LOCAL_RUNTIME
from inferop_devtools.field.memory import LIMIT_OVER_PEAK_BOUND, MEASURED, estimated, limit_over_peak, margin_needed
from inferop_operator.plan import MEMORY_MARGIN

DATA = json.loads(MEASURED.read_text())
POINTS = estimated(DATA["points"])


def points(which: str) -> list[Any]:
    return [
        pytest.param(point, id=f"{point['network']}-x{point['instances']}-b{point['max_batch_size']}-{point['state']}")
        for point in POINTS
        if point["set"] == which
    ]


def test_the_data_holds_both_sets() -> None:
    sets = {point["set"] for point in DATA["points"]}
    assert sets == {"fitted", "held_out"}, DATA["source"]
    held_out = {point["network"] for point in DATA["points"] if point["set"] == "held_out"}
    assert {"ranker", "wide_activations"} <= held_out  # models the fit never saw


@pytest.mark.parametrize("point", points("fitted") + points("held_out"))
def test_the_limit_covers_the_measured_peak(point: dict[str, Any]) -> None:
    """The limit plan.memory_limit writes for the point's estimate, against the peak measured: at least it (a held-out
    point under by more than the fit set's worst fails here), and at most LIMIT_OVER_PEAK_BOUND x it."""
    ratio = limit_over_peak(point)
    said = f"limit {ratio:.3f}x the peak, the estimate {point['estimate_bytes'] / point['measured_bytes'] - 1:+.1%}"
    assert ratio >= 1, f"{said}: OOM-killed at its own limit ({DATA['source']})"
    assert ratio <= LIMIT_OVER_PEAK_BOUND, f"{said}: the margin is more than it protects ({DATA['source']})"


def test_the_margin_is_the_fit_sets_worst_underestimate() -> None:
    """MEMORY_MARGIN is the least margin, in hundredths, that covers every peak of the fit set: a margin typed by hand,
    or kept when the constants or the points change, fails here."""
    assert margin_needed([point for point in POINTS if point["set"] == "fitted"]) == MEMORY_MARGIN


def test_the_constants_are_the_fit_of_the_fit_set() -> None:
    """LOCAL_RUNTIME is what the drill's least squares makes of the fit set's points: constants edited by hand, or
    fitted on other points, fail here, and so does a constant the fit does not give. (The fit's own residual says
    nothing of other models: the held-out points above are the check; on the fit set it is 22%, the conv net's
    saturated peaks varying by half between runs.)"""
    from inferop_devtools.field.memory import calibrate

    fitted = calibrate([point for point in DATA["points"] if point["set"] == "fitted"], "test")
    constants = {k: v for k, v in asdict(LOCAL_RUNTIME).items() if k not in ("name", "measured", "assumed")}
    assert {k: v for k, v in fitted.items() if k != "measured"} == constants

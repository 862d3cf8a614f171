"""The agreement check's stated power, measured with its own code (inferop_devtools.agreement_power): 200 candidates
at each true agreement below the threshold refused, 200 at 1e-6 weight noise accepted, on the tiny conv net."""

from __future__ import annotations

from pathlib import Path

from inferop_devtools.agreement_power import measure
from tests.helpers import TINY


def test_candidates_below_the_threshold_are_refused_and_equivalent_ones_pass(tmp_path: Path) -> None:
    figures = measure(200, tmp_path, network=TINY)
    cases = figures["cases"]
    for share in ("0.95", "0.97", "0.98"):
        assert cases[f"agreement {share}"]["share"] >= 0.99, (share, cases)
    noise = cases["weight noise 1e-06"]
    assert noise["share"] >= 0.99, cases
    # An equivalent candidate costs the test's fewest inputs (591 decisive ones), rounded up to a batch of 64.
    assert noise["inputsMax"] <= 640 + 64, cases

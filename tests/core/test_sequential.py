"""The sequential test (inferop_core.sequential) and the rollout check built on it (inferop_core.agreement): error
rates as stated, exact by the operating characteristic; near ties apart; the check stops at the input that decides."""

from __future__ import annotations

import numpy as np
import pytest

from inferop_core.agreement import SequentialComparison, run_check
from inferop_core.gate import Gate, near_tie_epsilon
from inferop_core.sequential import (
    SequentialTest,
    agreement_test,
    binomial_tail,
    clopper_pearson,
    operating_characteristic,
)


class TestSequentialTest:
    def test_the_stated_rates_hold_exactly_at_the_defaults(self) -> None:
        design = agreement_test(0.99, 0.01, outputs=2, max_samples=5000)
        assert design.test.fewest_samples == 591
        assert design.false_refusal <= 0.01 and design.false_acceptance <= 0.01

    def test_further_from_the_threshold_errs_less_and_stops_sooner(self) -> None:
        test = agreement_test(0.99, 0.01, outputs=1, max_samples=5000).test
        accepted = {share: operating_characteristic(test, share) for share in (1.0, 0.995, 0.99, 0.98, 0.97, 0.95)}
        assert accepted[1.0] == (pytest.approx(1.0), pytest.approx(591))
        chances = [accepted[share][0] for share in sorted(accepted, reverse=True)]
        assert chances == sorted(chances, reverse=True)
        assert accepted[0.97][0] < 1e-4 and accepted[0.95][1] < accepted[0.97][1] < accepted[0.98][1]

    def test_boundaries_at_the_stated_rates_err_more_once_truncated(self) -> None:
        # Why the check's boundaries sit at a quarter of the stated rates: at the stated rates a test truncated at
        # 5,000 inputs passes a candidate at 0.98 more than 1% of the time.
        plain = SequentialTest(0.99, 0.01, 0.01, 0.01, 5000)
        assert plain.error_rates[1] > 0.01 and plain.fewest_samples == 454

    def test_decisions_follow_the_likelihood_ratio(self) -> None:
        test = SequentialTest(0.99, 0.01, max_samples=100)
        assert test.decide(10, 0) is None and test.decide(10, 8) == "refuse" and test.decide(454, 0) == "accept"
        assert test.decide(100, 1) == "accept" and test.decide(100, 2) == "refuse"  # truncated: the likelier side

    @pytest.mark.parametrize(("threshold", "tolerance"), [(1.0, 0.01), (0.99, 0.0), (0.5, 0.5)])
    def test_a_threshold_and_tolerance_that_cannot_be_tested(self, threshold: float, tolerance: float) -> None:
        with pytest.raises(ValueError, match="threshold"):
            SequentialTest(threshold, tolerance)


class TestBounds:
    def test_binomial_tail(self) -> None:
        assert binomial_tail(3, 3, 0.5) == pytest.approx(0.125) and binomial_tail(0, 5, 0.3) == 1.0
        assert binomial_tail(1, 10, 0.1) == pytest.approx(1 - 0.9**10)

    def test_clopper_pearson_with_no_failure_is_the_rule_of_three_kind(self) -> None:
        assert clopper_pearson(591, 591, 0.99, upper=False) == pytest.approx(0.01 ** (1 / 591), abs=1e-9)
        assert clopper_pearson(0, 10, 0.9, upper=True) == pytest.approx(1 - 0.1 ** (1 / 10), abs=1e-9)
        assert clopper_pearson(591, 591, 0.99, upper=True) == 1.0

    def test_an_upper_bound_covers_the_share(self) -> None:
        assert 0.4 < clopper_pearson(8, 20, 0.99, upper=True) < 0.7
        assert clopper_pearson(8, 20, 0.99, upper=False) < 0.4


def policy(rows: list[list[float]]) -> dict[str, np.ndarray]:
    return {"policy": np.array(rows, dtype=np.float32), "value": np.zeros((len(rows), 1), dtype=np.float32)}


class TestSequentialComparison:
    GATE = Gate(top1=("policy",), max_abs_diff={"value": 0.02})
    DESIGN = agreement_test(0.99, 0.01, outputs=2, max_samples=5000)

    def test_an_identical_model_stops_at_the_fewest_inputs(self) -> None:
        answers = policy([[0.7, 0.2, 0.1]] * 100)
        comparison = SequentialComparison(self.GATE, self.DESIGN, {"policy": 1e-3})
        for _ in range(10):
            if not comparison.decided:
                comparison.add(answers, answers, 100)
        result = comparison.result("generated", 0.1, "candidate", "the stable revision")
        assert result.passed and result.samples == 600
        assert [(o.samples, o.decision) for o in result.outputs] == [(591, "accept"), (591, "accept")]
        assert "policy top-1 agrees on 591 of 591 (100.00%), 99% lower bound 0.9922 (>= 0.98): passes" in (
            result.describe()
        )

    def test_near_ties_are_counted_apart_whatever_the_candidate_answers(self) -> None:
        stable = policy([[0.5, 0.49995, 0.00005], [0.7, 0.2, 0.1]])
        candidate = policy([[0.49995, 0.5, 0.00005], [0.7, 0.2, 0.1]])
        comparison = SequentialComparison(self.GATE, self.DESIGN, {"policy": near_tie_epsilon("FP32")})
        comparison.add(stable, candidate, 2)
        (verdict, _) = comparison.result("generated", 0.0, "candidate", "stable").outputs
        assert (verdict.samples, verdict.agreeing, verdict.near_ties, verdict.near_tie_flips) == (1, 1, 1, 1)
        strict = SequentialComparison(self.GATE, self.DESIGN, {"policy": 0.0})
        strict.add(stable, candidate, 2)
        assert strict.result("generated", 0.0, "candidate", "stable").outputs[0].agreeing == 1  # of 2

    def test_values_beyond_tolerance_count_against_their_output(self) -> None:
        stable, candidate = policy([[0.7, 0.2, 0.1]] * 50), policy([[0.7, 0.2, 0.1]] * 50)
        candidate["value"][::2] = 0.5  # half the values 0.5 away
        result = run_check(self.GATE, self.DESIGN, {}, [("generated", 50, stable, candidate)] * 4)
        assert not result.passed and result.samples == 50  # refused inside the first batch
        policy_verdict, value = result.outputs
        assert value.decision == "refuse" and value.largest_difference == pytest.approx(0.5)
        assert policy_verdict.decision is None and "value within 0.02 on" in result.failures[0]

    def test_the_default_near_tie_margin_follows_the_outputs_precision(self) -> None:
        assert near_tie_epsilon("FP32") == pytest.approx(3.45e-4, rel=1e-2)
        assert near_tie_epsilon("FP16") == pytest.approx(0.03125)
        assert near_tie_epsilon("INT64") == 0.0

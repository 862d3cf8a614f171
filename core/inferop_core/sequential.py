"""A sequential test of a share (of inputs on which two models agree) against a threshold, with both error rates
stated: Wald's sequential probability ratio test, truncated, and its exact operating characteristic.

A fixed number of inputs with a point estimate is a coin toss at the margin: 64 inputs at 0.99 means 64 of 64, which
a model agreeing on 97% of inputs passes 14% of the time while one flipped near-tie refuses an equivalent model. The
test here asks for inputs until the likelihood ratio of "agreement at most threshold - tolerance" against "at least
threshold" crosses a boundary: an identical model stops after `fewest_samples`, a clearly worse one after a few dozen.

Boundaries log(1/alpha) and log(beta) bound the error rates without Wald's approximation (the likelihood ratio is a
martingale under either hypothesis: Ville's inequality), and `operating_characteristic` computes the truncated test's
exact rates. Pure Python (math only): the operator validates specs with it before numpy is imported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

Decision = Literal["accept", "refuse"]
# What a rollout's check promises: a candidate at or above its threshold passes, one at or below threshold -
# tolerance is refused, each with at least this probability.
STATED_CONFIDENCE = 0.99
# The test's boundaries sit at this share of the stated error rates: truncation at the most inputs adds to both, and
# the exact rates then stay well within the stated ones (0.28% and 0.37% at 0.99 and 0.01) for 591 inputs from an
# identical model rather than the 454 boundaries at the stated rates need (whose exact rates reach 0.8% and 1.05%).
BOUNDARY_SHARE = 0.25


@dataclass(frozen=True)
class SequentialTest:
    """Refuse a share at or below `threshold - tolerance` with probability >= 1 - `false_acceptance`; accept one at
    or above `threshold` with probability >= 1 - `false_refusal`; between the two, either. Undecided after
    `max_samples`: the hypothesis the likelihood ratio favours, which the exact rates include.

    The boundaries are set at `false_refusal` and `false_acceptance`; callers that state a rate set them lower, so
    that the truncation's share fits within it (`error_rates` says how far)."""

    threshold: float
    tolerance: float
    false_refusal: float = 0.01
    false_acceptance: float = 0.01
    max_samples: int = 5000

    def __post_init__(self) -> None:
        if not 0 < self.threshold < 1 or not 0 < self.tolerance < self.threshold:
            raise ValueError(f"threshold {self.threshold} in (0, 1) and tolerance {self.tolerance} in (0, threshold)")
        if not (0 < self.false_refusal < 1 and 0 < self.false_acceptance < 1 and self.max_samples >= 1):
            raise ValueError("error rates in (0, 1) and max_samples >= 1")

    @property
    def _steps(self) -> tuple[float, float]:
        """(what a failure adds to the log likelihood ratio, what a success takes from it)."""
        good, bad = 1 - self.threshold, 1 - self.threshold + self.tolerance  # failure rates under each hypothesis
        return math.log(bad / good), math.log((1 - good) / (1 - bad))

    def refuse_at(self, samples: int) -> float:
        """Failures among `samples` at which the test refuses (the ratio reaches log(1/false_refusal))."""
        up, down = self._steps
        return (math.log(1 / self.false_refusal) + samples * down) / (up + down)

    def accept_at(self, samples: int) -> float:
        """Failures among `samples` at or below which the test accepts (the ratio reaches log(false_acceptance))."""
        up, down = self._steps
        return (samples * down - math.log(1 / self.false_acceptance)) / (up + down)

    def decide(self, samples: int, failures: int) -> Decision | None:
        """The decision after `failures` among `samples`, or None: more are needed."""
        if failures >= self.refuse_at(samples):
            return "refuse"
        if failures <= self.accept_at(samples):
            return "accept"
        if samples >= self.max_samples:  # truncated: the hypothesis the ratio favours
            up, down = self._steps
            return "refuse" if failures * (up + down) - samples * down > 0 else "accept"
        return None

    @property
    def fewest_samples(self) -> int:
        """Samples an identical model needs: the test accepts after this many without a failure."""
        return math.ceil(math.log(1 / self.false_acceptance) / self._steps[1] - 1e-9)

    @property
    def error_rates(self) -> tuple[float, float]:
        """The exact (false refusal at `threshold`, false acceptance at `threshold - tolerance`) of this test, its
        truncation included; a share further from the threshold errs less."""
        refused_good = 1 - operating_characteristic(self, self.threshold)[0]
        accepted_bad = operating_characteristic(self, self.threshold - self.tolerance)[0]
        return refused_good, accepted_bad


@lru_cache(maxsize=256)
def operating_characteristic(test: SequentialTest, share: float) -> tuple[float, float]:
    """(probability of acceptance, expected samples) for a true `share` of successes, summed exactly over the paths
    that stay between the boundaries (a few dozen failure counts wide at each step)."""
    alive = {0: 1.0}  # failures so far -> probability of being undecided with them
    accepted, expected = 0.0, 0.0
    for samples in range(1, test.max_samples + 1):
        nxt: dict[int, float] = {}
        for failures, mass in alive.items():
            for more, chance in ((0, share), (1, 1 - share)):
                key = failures + more
                nxt[key] = nxt.get(key, 0.0) + mass * chance
        alive = {}
        for failures, mass in nxt.items():
            decision = test.decide(samples, failures)
            if decision is None:
                alive[failures] = mass
            else:
                expected += samples * mass
                accepted += mass if decision == "accept" else 0.0
        if not alive:
            break
    return accepted, expected


def binomial_tail(successes: int, samples: int, share: float) -> float:
    """P(X >= successes) for X ~ Binomial(samples, share), summed in log space."""
    if successes <= 0:
        return 1.0
    if share <= 0:
        return 0.0
    if share >= 1:
        return 1.0
    terms = [
        math.lgamma(samples + 1) - math.lgamma(k + 1) - math.lgamma(samples - k + 1)
        + k * math.log(share) + (samples - k) * math.log1p(-share)
        for k in range(successes, samples + 1)
    ]  # fmt: skip
    top = max(terms)
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


def clopper_pearson(successes: int, samples: int, confidence: float, upper: bool) -> float:
    """The one-sided Clopper-Pearson bound on a share at `confidence`: the least share (lower) or the largest
    (upper) that `successes` of `samples` does not rule out. Found by bisection on the binomial tail."""
    if samples == 0:
        return 1.0 if upper else 0.0
    if upper and successes == samples:
        return 1.0
    if not upper and successes == 0:
        return 0.0
    miss = 1 - confidence
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        if upper:  # the largest p with P(X <= successes | p) >= miss
            plausible = 1 - binomial_tail(successes + 1, samples, middle) >= miss
        else:  # the least p with P(X >= successes | p) >= miss
            plausible = binomial_tail(successes, samples, middle) >= miss
        if plausible == upper:
            low = middle
        else:
            high = middle
    return (low + high) / 2


@dataclass(frozen=True)
class AgreementTest:
    """The sequential test each judged output of a gate runs, and what the whole check then promises: a candidate
    at `threshold` or above on every output passes with probability 1 - `false_refusal` at least (the outputs' tests
    share it), one at `threshold - tolerance` or below on any output is refused with 1 - `false_acceptance`."""

    test: SequentialTest
    outputs: int

    @property
    def false_refusal(self) -> float:
        return min(1.0, self.outputs * self.test.error_rates[0])

    @property
    def false_acceptance(self) -> float:
        return self.test.error_rates[1]

    def describe(self) -> str:
        test = self.test
        return (
            f"refuses a candidate at {test.threshold - test.tolerance:.4g} agreement or below with probability "
            f"{1 - self.false_acceptance:.4f}, passes one at {test.threshold:.4g} or above with probability "
            f"{1 - self.false_refusal:.4f}; {test.fewest_samples} inputs for an identical model, at most "
            f"{test.max_samples}"
        )


def agreement_test(threshold: float, tolerance: float, outputs: int, max_samples: int) -> AgreementTest:
    """The test that keeps STATED_CONFIDENCE for a gate judging `outputs` outputs: boundaries at BOUNDARY_SHARE of the
    stated error rates, the false refusal's split over the outputs."""
    miss = (1 - STATED_CONFIDENCE) * BOUNDARY_SHARE
    test = SequentialTest(threshold, tolerance, miss / max(outputs, 1), miss, max_samples)
    return AgreementTest(test, max(outputs, 1))

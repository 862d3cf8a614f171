"""A benchmark's targets as data: each figure with its goal, so the report shows misses as misses and `make bench`
exits non-zero when one is missed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Target:
    """`value` against `goal`: met when value >= goal (`at_least`) or value <= goal. A target that does not apply
    on this machine (`not_applicable` says why) is shown but decides nothing."""

    name: str
    value: float
    goal: float
    at_least: bool = True
    not_applicable: str | None = None

    @property
    def met(self) -> bool:
        return self.value >= self.goal if self.at_least else self.value <= self.goal

    @property
    def missed(self) -> bool:
        return self.not_applicable is None and not self.met

    def describe(self) -> str:
        if self.not_applicable is not None:
            outcome = f"not applicable: {self.not_applicable}"
        else:
            outcome = "met" if self.met else "MISSED"
        return f"{self.name}: {self.value:.2f} (target {'>=' if self.at_least else '<='} {self.goal:g}: {outcome})"

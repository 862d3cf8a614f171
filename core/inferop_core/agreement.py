"""When two models answer alike: the one definition that export's precision gate and a rollout's agreement check
share, and the held-out inputs a model's processing declares.

A gate names the classifier outputs whose top-1 class must agree (`min_top1_agreement` of the samples) and the
other outputs with the largest difference allowed. Export counts a fixed set of samples (`Comparison`); a rollout
asks for inputs until a sequential test decides each output (`SequentialComparison`, `inferop_core.sequential`), with
the inputs on which the reference itself hardly chose (near ties) counted apart. Pure numpy: the operator image runs
it too.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferop_core.errors import InferopError
from inferop_core.gate import Gate
from inferop_core.gate import default_gate as default_gate  # where export and the operator find it
from inferop_core.processing import Processing
from inferop_core.sequential import STATED_CONFIDENCE, AgreementTest, SequentialTest, clopper_pearson
from inferop_core.tritonconfig import TensorSpec

# Triton's datatypes as numpy's (BF16 has none).
NUMPY_TYPES: dict[str, Any] = {
    "FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
    "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip


@dataclass(frozen=True)
class GateResult:
    precision: str  # what was compared with the reference: int8, or a candidate revision
    samples: int
    agreement: dict[str, float]  # output -> share of samples whose argmax agrees
    max_abs_diff: dict[str, float]  # output -> largest |compared - reference|
    gate: Gate
    reference: str = "fp32"
    cosine: dict[str, float] = field(default_factory=dict)  # output -> the least cosine similarity of any sample
    accuracy: tuple[float, float] | None = None  # (reference, compared) against the labels, where given

    @property
    def failures(self) -> list[str]:
        failed = [
            f"{name}: top-1 agreement {share:.1%} < {self.gate.min_agreement * 100:g}%"
            for name, share in self.agreement.items()
            if share < self.gate.min_agreement
        ]
        failed += [
            f"{name}: max |diff| {diff:.4g} >= {self.gate.max_abs_diff[name]:g}"
            for name, diff in self.max_abs_diff.items()
            if diff >= self.gate.max_abs_diff[name]
        ]
        failed += [
            f"{name}: cosine similarity {least:.4f} on a sample < {self.gate.min_cosine[name]:g}"
            for name, least in self.cosine.items()
            if least < self.gate.min_cosine[name]
        ]
        if self.accuracy is not None and self.accuracy[0] - self.accuracy[1] > self.gate.max_accuracy_drop:
            failed.append(
                f"accuracy {self.accuracy[1]:.2%} against {self.reference}'s {self.accuracy[0]:.2%}: down more than "
                f"{self.gate.max_accuracy_drop:.2%}"
            )
        return failed

    @property
    def passed(self) -> bool:
        return not self.failures

    def describe(self) -> str:
        parts = [f"{name} top-1 agreement {share:.1%}" for name, share in self.agreement.items()]
        parts += [f"{name} max |diff| {diff:.4g}" for name, diff in self.max_abs_diff.items()]
        parts += [f"{name} least cosine similarity {least:.4f}" for name, least in self.cosine.items()]
        if self.accuracy is not None:
            parts.append(f"accuracy {self.reference} {self.accuracy[0]:.2%}, {self.precision} {self.accuracy[1]:.2%}")
        return f"{self.precision} against {self.reference} on {self.samples} held-out inputs: {', '.join(parts)}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "precision": self.precision,
            "samples": self.samples,
            "agreement": self.agreement,
            "maxAbsDiff": self.max_abs_diff,
            "cosine": self.cosine,
            "accuracy": None
            if self.accuracy is None
            else {self.reference: self.accuracy[0], self.precision: self.accuracy[1]},
            "passed": self.passed,
            "failures": self.failures,
            "summary": self.describe(),
        }


class Comparison:
    """Answers of a reference and a compared model, batch by batch, counted against a gate."""

    def __init__(self, gate: Gate):
        self.gate = gate
        self.samples = 0
        self.agree = dict.fromkeys(gate.top1, 0)
        self.worst = dict.fromkeys(gate.max_abs_diff, 0.0)
        self.least_cosine = dict.fromkeys(gate.min_cosine, 1.0)
        self.scalar_sums: dict[str, np.ndarray] = {}  # output of one value a sample -> [dot, |reference|², |compared|²]
        self.correct: list[int] | None = None  # (reference, compared) right against the labels, once labels come

    def add(
        self,
        reference: Mapping[str, np.ndarray],
        compared: Mapping[str, np.ndarray],
        samples: int,
        labels: np.ndarray | None = None,
    ) -> None:
        """One batch of `samples` inputs: both models' outputs, by output name, and the inputs' labels if known."""
        for name in self.gate.top1:
            want, got = np.argmax(reference[name], axis=-1), np.argmax(compared[name], axis=-1)
            self.agree[name] += int(np.sum(want == got))
        for name in self.gate.max_abs_diff:
            self.worst[name] = max(self.worst[name], _largest(reference[name], compared[name]))
        for name in self.gate.min_cosine:
            want, got = (np.asarray(o[name], np.float64).reshape(len(o[name]), -1) for o in (reference, compared))
            if want.shape[1] == 1:
                sums = np.array([np.sum(want * got), np.sum(want * want), np.sum(got * got)])
                self.scalar_sums[name] = self.scalar_sums.get(name, np.zeros(3)) + sums
            else:
                self.least_cosine[name] = min(self.least_cosine[name], _least_cosine(want, got))
        if labels is not None and self.gate.top1:
            name = self.gate.top1[0]
            right = [int(np.sum(np.argmax(outputs[name], axis=-1) == labels)) for outputs in (reference, compared)]
            self.correct = [a + b for a, b in zip(self.correct or [0, 0], right, strict=True)]
        self.samples += samples

    def result(self, precision: str, reference: str = "fp32") -> GateResult:
        shares = {name: count / max(self.samples, 1) for name, count in self.agree.items()}
        accuracy = None
        if self.correct is not None:
            accuracy = (self.correct[0] / max(self.samples, 1), self.correct[1] / max(self.samples, 1))
        cosine = dict(self.least_cosine)
        for name, (dot, want, got) in self.scalar_sums.items():
            cosine[name] = _cosine(dot, want * got, not want and not got)
        return GateResult(precision, self.samples, shares, dict(self.worst), self.gate, reference, cosine, accuracy)


def _largest(reference: np.ndarray, compared: np.ndarray) -> float:
    """The largest |reference - compared|, 0 for an empty tensor."""
    diff = np.abs(reference.astype(np.float64) - compared.astype(np.float64))
    return float(np.max(diff)) if diff.size else 0.0


def _least_cosine(want: np.ndarray, got: np.ndarray) -> float:
    """The least cosine similarity of the rows (a sample each)."""
    squares = np.sum(want * want, axis=1) * np.sum(got * got, axis=1)
    both_zero = ~want.any(axis=1) & ~got.any(axis=1)
    cosines = [_cosine(d, s, z) for d, s, z in zip(np.sum(want * got, axis=1), squares, both_zero, strict=True)]
    return min(cosines, default=1.0)


def _cosine(dot: float, squares: float, both_zero: bool) -> float:
    """dot / sqrt(squares); two zero vectors agree, one alone does not."""
    return float(dot / np.sqrt(squares)) if squares > 0 else float(both_zero)


def held_out_inputs(
    processing: Processing | None, inputs: Sequence[TensorSpec], samples: int, batch: int, seed: int
) -> Iterable[tuple[int, dict[str, np.ndarray]]]:
    """Seeded inputs as the model's processing makes them, `batch` samples at a time (0: a model without a batch
    axis, one sample a request), each with its count of samples: an image classifier's images (uniform pixels,
    normalised as declared, CHW), a policy/value net's boards (cells in -1, 0, 1), else standard normal floats and
    integers in {0, 1}."""
    rng = np.random.default_rng(seed)
    kind = (processing or Processing()).kind
    per_request = max(batch, 1)
    for start in range(0, samples, per_request):
        count = min(per_request, samples - start)
        arrays = {}
        for tensor in inputs:
            shape = [count, *tensor.dims] if batch else list(tensor.dims)
            if tensor.datatype not in NUMPY_TYPES:
                raise InferopError(f"input {tensor.name}: no inputs can be made for datatype {tensor.datatype}")
            dtype = NUMPY_TYPES[tensor.datatype]
            if kind == "imageClassification" and processing is not None and processing.mean and processing.std:
                pixels = rng.uniform(0.0, 1.0, size=shape)
                mean = np.array(processing.mean).reshape(-1, 1, 1)
                std = np.array(processing.std).reshape(-1, 1, 1)
                arrays[tensor.name] = ((pixels - mean) / std).astype(dtype)
            elif kind == "policyValue":
                arrays[tensor.name] = rng.integers(-1, 2, size=shape).astype(dtype)
            elif np.issubdtype(dtype, np.floating):
                arrays[tensor.name] = rng.standard_normal(shape).astype(dtype)
            else:
                arrays[tensor.name] = rng.integers(0, 2, size=shape).astype(dtype)
        yield count, arrays


@dataclass(frozen=True)
class OutputVerdict:
    """One judged output: how many decisive inputs agreed (the same top-1 class, or every value within tolerance),
    the near ties set apart, the test's decision and the Clopper-Pearson bound on the share at the stated
    confidence (the least share for an acceptance, the largest for a refusal)."""

    name: str
    kind: str  # "top1" or "tolerance"
    samples: int  # decisive inputs counted
    agreeing: int
    decision: str | None  # accept, refuse, or None: undecided when the inputs ran out
    near_ties: int = 0  # inputs where the reference's own top-1 margin was below epsilon
    near_tie_flips: int = 0  # of those, the ones whose top-1 class differs
    largest_difference: float = 0.0
    tolerance: float | None = None  # for a tolerance output

    @property
    def share(self) -> float:
        return self.agreeing / self.samples if self.samples else 0.0

    @property
    def bound(self) -> float:
        return clopper_pearson(self.agreeing, self.samples, STATED_CONFIDENCE, upper=self.decision != "accept")

    def describe(self, test: SequentialTest) -> str:
        what = "top-1 agrees" if self.kind == "top1" else f"within {self.tolerance:g}"
        side, compared, limit = (
            ("lower", ">=", test.threshold - test.tolerance)
            if self.decision == "accept"
            else ("upper", "<", test.threshold)
        )
        verdict = {"accept": "passes", "refuse": "refused", None: "undecided"}[self.decision]
        text = (
            f"{self.name} {what} on {self.agreeing} of {self.samples} ({self.share:.2%}), "
            f"{STATED_CONFIDENCE:.0%} {side} bound {self.bound:.4f} ({compared} {limit:.4g}): {verdict}"
        )
        if self.near_ties:
            text += f"; {self.near_ties} near ties apart, {self.near_tie_flips} flipped"
        return text


@dataclass(frozen=True)
class AgreementResult:
    """The sequential check's outcome: each output's verdict, the inputs sent and where they came from, and what
    the test promises."""

    outputs: tuple[OutputVerdict, ...]
    samples: int  # inputs both models answered
    design: AgreementTest
    inputs: str = "generated inputs"  # where the inputs came from
    seconds: float = 0.0
    compared: str = "candidate"
    reference: str = "the stable revision"

    @property
    def passed(self) -> bool:
        return all(output.decision == "accept" for output in self.outputs)

    @property
    def failures(self) -> list[str]:
        """The refused outputs; where none was, the undecided ones (the inputs ran out): never passed blind."""
        refused = [o for o in self.outputs if o.decision == "refuse"] or [o for o in self.outputs if o.decision is None]
        return [output.describe(self.design.test) for output in refused]

    def describe(self) -> str:
        parts = "; ".join(output.describe(self.design.test) for output in self.outputs)
        return (
            f"{self.compared} against {self.reference} on {self.samples} inputs ({self.inputs}) in "
            f"{self.seconds:.1f} s: {parts}. The test {self.design.describe()}"
        )


class SequentialComparison:
    """Answers of a reference and a compared model, batch by batch, each judged output fed sample by sample to its
    sequential test until it decides; near ties (the reference's top-1 margin below `epsilon`, times the top value
    where that exceeds 1) are counted apart, whatever the compared model answers."""

    def __init__(self, gate: Gate, design: AgreementTest, epsilon: Mapping[str, float]):
        self.gate, self.design, self.epsilon = gate, design, dict(epsilon)
        self.samples = 0
        self.judged = {name: _Count("top1") for name in gate.top1}
        self.judged |= {name: _Count("tolerance") for name in gate.max_abs_diff}

    @property
    def decided(self) -> bool:
        decisions = [count.decision for count in self.judged.values()]
        return "refuse" in decisions or all(decision is not None for decision in decisions)

    def add(self, reference: Mapping[str, np.ndarray], compared: Mapping[str, np.ndarray], samples: int) -> None:
        """One batch of `samples` inputs: both models' outputs by name (a model without a batch axis: one sample)."""
        test = self.design.test
        for name, count in self.judged.items():
            want, got = (np.asarray(o[name], np.float64).reshape(samples, -1) for o in (reference, compared))
            if count.kind == "top1":
                width = np.shape(reference[name])[-1]
                want, got = want.reshape(samples, -1, width), got.reshape(samples, -1, width)
                agree = np.all(np.argmax(want, axis=-1) == np.argmax(got, axis=-1), axis=1)
                near = _margins(want) < self.epsilon.get(name, 0.0) * np.maximum(1.0, np.abs(want).max(axis=(1, 2)))
                diffs = np.zeros(samples)
            else:
                diffs = np.abs(want - got).max(axis=1) if want.size else np.zeros(samples)
                agree, near = diffs < self.gate.max_abs_diff[name], np.zeros(samples, dtype=bool)
            for index in range(samples):
                if count.decision is not None:
                    break
                count.largest = max(count.largest, float(diffs[index]))
                if near[index]:
                    count.near_ties += 1
                    count.near_tie_flips += int(not agree[index])
                    continue
                count.samples += 1
                count.agreeing += int(agree[index])
                count.decision = test.decide(count.samples, count.samples - count.agreeing)
        self.samples += samples

    def result(self, inputs: str, seconds: float, compared: str, reference: str) -> AgreementResult:
        verdicts = tuple(
            OutputVerdict(
                name, count.kind, count.samples, count.agreeing, count.decision, count.near_ties,
                count.near_tie_flips, count.largest, self.gate.max_abs_diff.get(name),
            )
            for name, count in self.judged.items()
        )  # fmt: skip
        return AgreementResult(verdicts, self.samples, self.design, inputs, round(seconds, 3), compared, reference)


@dataclass
class _Count:
    kind: str
    samples: int = 0
    agreeing: int = 0
    near_ties: int = 0
    near_tie_flips: int = 0
    largest: float = 0.0
    decision: str | None = None


def _margins(values: np.ndarray) -> np.ndarray:
    """Each sample's least top-1 margin (largest minus second largest) over its positions; infinite for one class."""
    if values.shape[-1] < 2:
        return np.full(values.shape[0], np.inf)
    top = np.sort(values, axis=-1)
    return np.min(top[..., -1] - top[..., -2], axis=1)


def run_check(
    gate: Gate,
    design: AgreementTest,
    epsilon: Mapping[str, float],
    answers: Iterable[tuple[str, int, Mapping[str, np.ndarray], Mapping[str, np.ndarray]]],
    compared: str = "candidate",
    reference: str = "the stable revision",
) -> AgreementResult:
    """The sequential check over (origin, samples, reference outputs, compared outputs) batches, drawn only while
    the test needs more: `answers` may infer lazily, so no input is answered past the decision."""
    comparison = SequentialComparison(gate, design, epsilon)
    origins: dict[str, int] = {}
    started = time.monotonic()
    for origin, samples, want, got in answers:
        comparison.add(want, got, samples)
        origins[origin] = origins.get(origin, 0) + samples
        if comparison.decided:
            break
    used = " and ".join(f"{count} {origin}" for origin, count in origins.items()) or "no inputs"
    return comparison.result(used, time.monotonic() - started, compared, reference)

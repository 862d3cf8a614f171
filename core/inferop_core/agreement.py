"""When two models answer alike: the one definition that export's precision gate and a rollout's agreement check
share, and the held-out inputs a model's processing declares.

A gate names the classifier outputs whose top-1 class must agree (`min_top1_agreement` of the samples) and the
other outputs with the largest difference allowed. Pure numpy: the operator image runs it too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from inferop_core.errors import InferopError
from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec

# Triton's datatypes as numpy's (BF16 has none).
NUMPY_TYPES: dict[str, Any] = {
    "FP32": np.float32, "FP16": np.float16, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32,
    "INT8": np.int8, "UINT8": np.uint8, "BOOL": np.bool_,
}  # fmt: skip
# The largest difference allowed where nothing else says: a policy/value net's value (export's conv-net gate) and
# plain tensors (a serving change should leave them equal but for the order of float sums).
POLICY_VALUE_TOLERANCE = 0.02
TENSOR_TOLERANCE = 1e-3


@dataclass(frozen=True)
class Gate:
    """What a model must keep of a reference's answers on held-out inputs: for each output in `top1`, the same
    argmax (over its last axis) in at least `min_agreement` of the samples; for each output in `max_abs_diff`, every
    value within that of the reference's."""

    top1: tuple[str, ...] = ()
    min_agreement: float = 0.99
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    # output -> the least cosine similarity to the reference allowed on any sample (its output flattened; an output
    # of one value a sample, whose cosine would be its sign, is compared over all samples at once)
    min_cosine: dict[str, float] = field(default_factory=dict)
    # With labelled inputs: how far the first top-1 output's accuracy may fall below the reference's.
    max_accuracy_drop: float = 0.01


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


def default_gate(
    processing: Processing | None,
    outputs: Sequence[TensorSpec],
    min_top1_agreement: float = 0.99,
    max_abs_difference: float | None = None,
) -> Gate:
    """The gate a model's processing implies: an image classifier's logits and a policy/value net's policy agree on
    their top-1 class; every other output agrees to a tolerance (`max_abs_difference`, else by kind)."""
    kind = (processing or Processing()).kind
    names = [t.name for t in outputs]
    if kind == "imageClassification":
        labelled = [t.name for t in outputs if t.label_filename]
        top1 = (labelled or names)[:1]
    elif kind == "policyValue":
        top1 = [name for name in names if name == "policy"]
    else:
        top1 = []
    tolerance = max_abs_difference or (POLICY_VALUE_TOLERANCE if kind == "policyValue" else TENSOR_TOLERANCE)
    return Gate(
        top1=tuple(top1),
        min_agreement=min_top1_agreement,
        max_abs_diff={name: tolerance for name in names if name not in top1},
    )


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

"""What a model must keep of a reference's answers: which outputs are judged by their top-1 class and which by a
largest difference, as a model's processing implies. No numpy: the operator's spec validation reads it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec

# The largest difference allowed where nothing else says: a policy/value net's value (export's conv-net gate) and
# plain tensors (a serving change should leave them equal but for the order of float sums).
POLICY_VALUE_TOLERANCE = 0.02
TENSOR_TOLERANCE = 1e-3
# Each float datatype's machine epsilon (the gap from 1 to the next value), for the near-tie margins.
MACHINE_EPSILON = {"FP64": 2.0**-52, "FP32": 2.0**-23, "FP16": 2.0**-10, "BF16": 2.0**-7}


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


def near_tie_epsilon(datatype: str) -> float:
    """The default near-tie margin of a top-1 output of `datatype`: the square root of its machine epsilon (half its
    significant digits; 3.5e-4 for FP32, 0.031 for FP16), the precision to which two computations of the same
    function in that type can be expected to agree. The conv net's policy moved by up to 5.3e-5 under 1e-6 weight
    noise, and its flips were at margins of 2.1e-6 and 2.4e-5. 0 for an integer output: its ties are exact."""
    return MACHINE_EPSILON[datatype] ** 0.5 if datatype in MACHINE_EPSILON else 0.0

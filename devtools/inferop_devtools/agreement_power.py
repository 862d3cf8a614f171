"""The rollout agreement check's power, measured with the check's own code (the operator's design and inputs, the
core's sequential comparison), seeded so that a run gives the same figures:

    python -m inferop_devtools.agreement_power [--candidates 200] [--json PATH]

- Candidates at a true agreement (0.95, 0.97, 0.98 against minAgreement 0.99, tolerance 0.01): each input's top-1
  class differs from the stable revision's with probability 1 - agreement; the policy's margins are the conv net's.
- Candidates at 1e-6 weight noise: the conv net exported as `inferop export` does, every float initializer with
  Gaussian noise of that standard deviation added, both models run by ONNX Runtime on the check's inputs.

Each reports the share refused or accepted and the inputs used (mean and most).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from inferop_core.agreement import AgreementResult, run_check
from inferop_operator.agreement import Design, agreement_inputs, design
from inferop_operator.spec import InferenceServiceSpec, parse_spec

AGREEMENTS = (0.95, 0.97, 0.98)
WEIGHT_NOISE = 1e-6
SEED = 45
BATCH = 64  # inputs a batch: the check stops inside one at the exact input its test decides


def conv_net_spec(workdir: Path, **network: Any) -> tuple[InferenceServiceSpec, Path]:
    """The conv net exported as `inferop export conv_net` does, its spec with a rollout at the default check."""
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net

    report = export_model(conv_net(**network), workdir, quiet=True)
    raw = report.spec.model_dump(mode="json", by_alias=True, exclude_none=True)
    return parse_spec({**raw, "rollout": {}}), Path(report.model_path)


def session(model: Any) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def at_agreement(planned: Design, reference: list[dict[str, np.ndarray]], share: float, seed: int) -> AgreementResult:
    """A candidate whose top-1 class differs from the reference's with probability 1 - `share` on each input: the
    reference's top two classes swapped there, every other output equal."""
    rng = np.random.default_rng(seed)
    (name,) = planned.gate.top1

    def answers() -> Iterator[tuple[str, int, dict[str, np.ndarray], dict[str, np.ndarray]]]:
        for want in reference:
            got = {key: value.copy() for key, value in want.items()}
            flip = rng.random(len(got[name])) >= share
            order = np.argsort(got[name], axis=1)
            rows = np.nonzero(flip)[0]
            first, second = order[rows, -1], order[rows, -2]
            got[name][rows, first], got[name][rows, second] = want[name][rows, second], want[name][rows, first]
            yield "generated", len(got[name]), want, got

    return run_check(planned.gate, planned.test, planned.epsilon, answers())


def with_noise(path: Path, std: float, rng: np.random.Generator) -> Any:
    """The ONNX model at `path` with Gaussian noise of `std` added to every float initializer."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(path))
    for tensor in model.graph.initializer:
        array = numpy_helper.to_array(tensor)
        if array.dtype == np.float32:
            noisy = (array + rng.normal(0.0, std, array.shape)).astype(np.float32)
            tensor.CopyFrom(numpy_helper.from_array(noisy, tensor.name))
    return model


def measure(candidates: int, workdir: Path, network: dict[str, int] | None = None) -> dict[str, Any]:
    """Both simulations; the figures by case."""
    import onnx

    spec, path = conv_net_spec(workdir, **(network or {}))
    planned = design(spec)
    limit = 2 * planned.test.test.max_samples
    feeds = [f for _, _, f in agreement_inputs(spec, BATCH, limit)]
    stable = session(onnx.load(str(path)))
    reference = [dict(zip(("policy", "value"), stable.run(None, f), strict=True)) for f in feeds]
    figures: dict[str, Any] = {"design": planned.describe(), "cases": {}}
    for share in AGREEMENTS:
        results = [at_agreement(planned, reference, share, SEED + index) for index in range(candidates)]
        figures["cases"][f"agreement {share}"] = summary(results, want_passed=False)
    rng = np.random.default_rng(SEED)
    results = []
    for _ in range(candidates):
        candidate = session(with_noise(path, WEIGHT_NOISE, rng))

        def answers(run: Any = candidate) -> Iterator[tuple[str, int, Any, Any]]:
            for want, f in zip(reference, feeds, strict=True):
                yield "generated", len(f["board"]), want, dict(zip(("policy", "value"), run.run(None, f), strict=True))

        results.append(run_check(planned.gate, planned.test, planned.epsilon, answers()))
    figures["cases"][f"weight noise {WEIGHT_NOISE:g}"] = summary(results, want_passed=True)
    return figures


def summary(results: list[AgreementResult], want_passed: bool) -> dict[str, Any]:
    """The share decided as wanted and the inputs used."""
    used = [result.samples for result in results]
    right = sum(result.passed == want_passed for result in results)
    return {
        "candidates": len(results),
        "accepted" if want_passed else "refused": right,
        "share": right / len(results),
        "inputsMean": round(float(np.mean(used)), 1),
        "inputsMax": int(max(used)),
        "nearTies": sum(o.near_ties for r in results for o in r.outputs),
        "nearTieFlips": sum(o.near_tie_flips for r in results for o in r.outputs),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", type=int, default=200, help="candidates of each case (default 200)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="inferop-agreement-") as work:
        figures = measure(args.candidates, Path(work))
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The agreement check of a rollout: one pod of each revision answers the same held-out inputs, before the
candidate receives a single live request, and the answers are compared as export's precision gate compares them.

Requests go straight to the pods (their IP, Triton's HTTP port), with binary tensors (Triton's binary tensor data
extension), so nothing on the callers' path is involved. numpy is imported here only, when a rollout asks.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from inferop_core.errors import InferopError
from inferop_operator.spec import InferenceServiceSpec

if TYPE_CHECKING:
    import numpy as np

    from inferop_core.agreement import GateResult

REQUEST_TIMEOUT = 30.0  # seconds one batch may take on either pod
HEADER_LENGTH = "Inference-Header-Content-Length"
SEED = 20_251_202  # the held-out inputs: the same for both revisions, and not what export calibrated on


class AgreementError(InferopError, RuntimeError):
    """The check could not be run (a pod that does not answer, models whose inputs differ); the message says why."""


def infer(
    url: str, model: str, inputs: Mapping[str, np.ndarray[Any, Any]], outputs: list[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """One inference over Triton's HTTP/REST protocol with binary tensors; the outputs by name."""
    import numpy as np

    from inferop_core.agreement import NUMPY_TYPES

    datatypes = {np.dtype(t): name for name, t in NUMPY_TYPES.items()}
    blobs = [np.ascontiguousarray(array).tobytes() for array in inputs.values()]
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatypes[array.dtype],
                "parameters": {"binary_data_size": len(blob)},
            }
            for (name, array), blob in zip(inputs.items(), blobs, strict=True)
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    head = json.dumps(header).encode()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/infer",
        data=head + b"".join(blobs),
        headers={HEADER_LENGTH: str(len(head)), "Content-Type": "application/octet-stream"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
            body = response.read()
            length = int(response.headers.get(HEADER_LENGTH) or len(body))
    except urllib.error.HTTPError as error:
        raise AgreementError(f"{url}: {error.code} {error.read()[:300].decode(errors='replace')}") from None
    except (urllib.error.URLError, OSError) as error:
        raise AgreementError(f"{url}: {error}") from None
    answer: dict[str, Any] = json.loads(body[:length])
    found, offset = {}, length
    for output in answer.get("outputs", []):
        dtype = NUMPY_TYPES[output["datatype"]]
        size = int((output.get("parameters") or {}).get("binary_data_size", 0))
        if size:
            data = np.frombuffer(body[offset : offset + size], dtype=dtype)
            offset += size
        else:
            data = np.asarray(output.get("data", []), dtype=dtype)
        found[output["name"]] = data.reshape(output["shape"])
    return found


def compare_revisions(
    stable_url: str, candidate_url: str, stable: InferenceServiceSpec, candidate: InferenceServiceSpec
) -> GateResult:
    """Both pods on the held-out inputs the candidate's processing makes, compared by the gate its processing and
    spec.rollout.agreement imply. Models whose tensors differ cannot agree: that is a failed check, not an error."""
    from inferop_core.agreement import Comparison, default_gate, held_out_inputs

    assert candidate.rollout is not None, "a rollout asks for the agreement check"
    settings = candidate.rollout.agreement
    model = candidate.model
    signature = [(t.name, t.datatype, list(t.dims)) for t in (*model.inputs, *model.outputs)]
    theirs = [(t.name, t.datatype, list(t.dims)) for t in (*stable.model.inputs, *stable.model.outputs)]
    if signature != theirs or model.name != stable.model.name:
        raise AgreementError(
            f"the candidate serves model {model.name!r} with tensors {signature}, the stable revision "
            f"{stable.model.name!r} with {theirs}: callers of one cannot call the other"
        )
    outputs = [t.as_tensor_spec() for t in model.outputs]
    gate = default_gate(model.processing, outputs, settings.min_top1_agreement, settings.max_abs_difference)
    comparison = Comparison(gate)
    batch = min(candidate.batching.max_batch_size, stable.batching.max_batch_size)
    names = [t.name for t in outputs]
    inputs = [t.as_tensor_spec() for t in model.inputs]
    for count, feeds in held_out_inputs(model.processing, inputs, settings.samples, batch, SEED):
        reference, answers = infer(stable_url, model.name, feeds, names), infer(candidate_url, model.name, feeds, names)
        comparison.add(reference, answers, count)
    return comparison.result("candidate", "the stable revision")

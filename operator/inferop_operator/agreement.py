"""The agreement check of a rollout: one pod of each revision answers the same inputs, before the candidate receives
a single live request, as many as the sequential test needs (`inferop_core.sequential`), compared output by output
as export's precision gate compares them. The inputs are the validation set recorded with the model where there is
one, then generated ones.

Requests go straight to the pods (their IP, Triton's HTTP port), with binary tensors (Triton's binary tensor data
extension), so nothing on the callers' path is involved. numpy is imported here only, when a rollout asks.
"""

from __future__ import annotations

import json
import struct
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from inferop_core.errors import InferopError
from inferop_core.gate import Gate, near_tie_epsilon
from inferop_core.objectstore import sha256_file
from inferop_core.processing import Processing
from inferop_core.sequential import AgreementTest
from inferop_core.tritonconfig import IMAGE_INPUT, LABELS_OUTPUT, PROBABILITIES_OUTPUT, VALIDATION_FILENAME
from inferop_operator.spec import Agreement, InferenceServiceSpec, agreement_gate

if TYPE_CHECKING:
    import numpy as np

    from inferop_core.agreement import AgreementResult

REQUEST_TIMEOUT = 30.0  # seconds one batch may take on either pod
HEADER_LENGTH = "Inference-Header-Content-Length"
SEED = 20_251_202  # the held-out inputs: the same for both revisions, and not what export calibrated on


class AgreementError(InferopError, RuntimeError):
    """The check could not be run (a pod that does not answer, models whose inputs differ); the message says why."""


def serialized(array: np.ndarray[Any, Any]) -> tuple[str, bytes]:
    """A tensor's datatype and bytes in Triton's binary tensor data extension: numbers as they lie in memory; an
    array of bytes objects (BYTES) as each element's length (4 bytes, little-endian) and its bytes."""
    import numpy as np

    from inferop_core.agreement import NUMPY_TYPES

    if array.dtype == np.object_:
        return "BYTES", b"".join(struct.pack("<I", len(item)) + bytes(item) for item in array.reshape(-1))
    datatypes = {np.dtype(t): name for name, t in NUMPY_TYPES.items()}
    return datatypes[array.dtype], np.ascontiguousarray(array).tobytes()


def deserialized(datatype: str, data: bytes, shape: list[int]) -> np.ndarray[Any, Any]:
    """`serialized`'s inverse."""
    import numpy as np

    from inferop_core.agreement import NUMPY_TYPES

    if datatype != "BYTES":
        return np.frombuffer(data, dtype=NUMPY_TYPES[datatype]).reshape(shape)
    items, offset = [], 0
    while offset < len(data):
        (length,) = struct.unpack_from("<I", data, offset)
        items.append(data[offset + 4 : offset + 4 + length])
        offset += 4 + length
    return np.array(items, dtype=np.object_).reshape(shape)


def infer(
    url: str, model: str, inputs: Mapping[str, np.ndarray[Any, Any]], outputs: list[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """One inference over Triton's HTTP/REST protocol with binary tensors; the outputs by name."""
    import numpy as np

    from inferop_core.agreement import NUMPY_TYPES

    encoded = {name: serialized(array) for name, array in inputs.items()}
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": encoded[name][0],
                "parameters": {"binary_data_size": len(encoded[name][1])},
            }
            for name, array in inputs.items()
        ],
        "outputs": [{"name": name, "parameters": {"binary_data": True}} for name in outputs],
    }
    head = json.dumps(header).encode()
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v2/models/{model}/infer",
        data=head + b"".join(blob for _, blob in encoded.values()),
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
        size = int((output.get("parameters") or {}).get("binary_data_size", 0))
        if size:
            found[output["name"]] = deserialized(output["datatype"], body[offset : offset + size], output["shape"])
            offset += size
        else:  # asked for binary data, a server may still answer in JSON
            dtype = np.object_ if output["datatype"] == "BYTES" else NUMPY_TYPES[output["datatype"]]
            found[output["name"]] = np.asarray(output.get("data", []), dtype=dtype).reshape(output["shape"])
    return found


@dataclass(frozen=True)
class Design:
    """What a rollout's agreement check will do for a spec, before any pod exists: the outputs it judges and how,
    the sequential test with its exact error rates, the near-tie margins and where its inputs come from. The check,
    the status and `inferop plan` all read this one value."""

    gate: Gate
    test: AgreementTest
    epsilon: dict[str, float]  # top-1 output -> its near-tie margin
    inputs: str  # where the inputs come from, for a person

    def describe(self) -> str:
        judged = [f"{name} top-1 (near ties below {self.epsilon[name]:.2g} apart)" for name in self.gate.top1]
        judged += [f"{name} within {tolerance:g}" for name, tolerance in self.gate.max_abs_diff.items()]
        return f"{', '.join(judged)}: the test {self.test.describe()}; inputs: {self.inputs}"


def design(spec: InferenceServiceSpec) -> Design:
    """The check spec.rollout.agreement asks for (the defaults where the spec has no rollout)."""
    settings = spec.rollout.agreement if spec.rollout is not None else Agreement()
    gate = agreement_gate(spec)
    datatypes = {t.name: t.datatype for t in spec.model.outputs}
    epsilon = {name: settings.near_tie_epsilon or near_tie_epsilon(datatypes[name]) for name in gate.top1}
    test = settings.test(len(gate.top1) + len(gate.max_abs_diff))
    inputs = validation_source(spec)[1]
    if spec.pipeline is not None:
        inputs = f"pictures sent as PNG through the pipeline, made from {inputs}"
    return Design(gate, test, epsilon, inputs)


def validation_source(spec: InferenceServiceSpec) -> tuple[Path | None, str]:
    """The validation set recorded with the model, where the operator can read it, and what the inputs will be: the
    set first, then generated inputs if the test needs more; generated alone, saying why, where there is no set."""
    model = spec.model
    generated = "generated from model.processing"
    if model.validation is None:
        return None, f"{generated} (no validation set recorded with the model)"
    scheme, _, rest = model.storage_uri.partition("://")
    if scheme != "hostpath":
        return None, (
            f"{generated}: the validation set recorded with the model is in {scheme}:// storage, which the operator "
            "does not read (only hostpath://)"
        )
    return Path(rest) / VALIDATION_FILENAME, (
        f"the validation set recorded with the model ({model.validation.samples} samples), then {generated}"
    )


def agreement_inputs(
    spec: InferenceServiceSpec, batch: int, limit: int
) -> Iterator[tuple[str, int, dict[str, np.ndarray[Any, Any]]]]:
    """(origin, count, feeds) batches: the recorded validation set in a seeded order, then generated inputs, `limit`
    in all. A set that is missing or not what the model recorded is an error, not a silent fallback."""
    import numpy as np

    from inferop_core.agreement import held_out_inputs

    path, _ = validation_source(spec)
    model = spec.model
    tensors = [t.as_tensor_spec() for t in model.inputs]
    sent = 0
    if path is not None and model.validation is not None:
        try:
            if sha256_file(path) != model.validation.sha256:
                raise AgreementError(f"{path}: not the validation set recorded with the model (its SHA-256 differs)")
            with np.load(path, allow_pickle=False) as archive:
                arrays = {t.name: archive[t.name] for t in tensors}
        except (OSError, KeyError, ValueError) as error:
            raise AgreementError(
                f"{path}: the validation set recorded with the model cannot be read ({error})"
            ) from None
        order = np.random.default_rng(SEED).permutation(len(next(iter(arrays.values()))))
        per_request = max(batch, 1)
        for start in range(0, min(len(order), limit), per_request):
            chosen = order[start : min(start + per_request, limit)]
            feeds = {name: array[chosen] if batch else array[chosen[0]] for name, array in arrays.items()}
            sent += len(chosen) if batch else 1
            yield "validation", len(chosen) if batch else 1, feeds
    for count, feeds in held_out_inputs(model.processing, tensors, limit - sent, batch, SEED):
        yield "generated", count, feeds


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_chunk(kind: bytes, data: bytes) -> bytes:
    """A PNG chunk: its length, kind, data and CRC."""
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png(pixels: np.ndarray[Any, Any]) -> bytes:
    """An 8-bit RGB PNG of `pixels` (height, width, 3), written with the standard library (the operator's image has
    no image library): unfiltered rows in one compressed chunk."""
    height, width, _ = pixels.shape
    rows = b"".join(b"\0" + row.tobytes() for row in pixels.astype("uint8"))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8 bits, RGB, deflate, no filter, no interlace
    chunks = png_chunk(b"IHDR", header) + png_chunk(b"IDAT", zlib.compress(rows)) + png_chunk(b"IEND", b"")
    return PNG_SIGNATURE + chunks


def pictures(processing: Processing, tensors: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The pictures a batch of an image classifier's inputs (N, 3, S, S, normalised as `processing` declares) show,
    as PNG bytes, one a request (N, 1): what the pipeline's IMAGE takes."""
    import numpy as np

    mean = np.asarray(processing.mean, dtype=np.float64).reshape(-1, 1, 1)
    std = np.asarray(processing.std, dtype=np.float64).reshape(-1, 1, 1)
    rgb = np.clip(np.rint((tensors * std + mean) * 255.0), 0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    return np.array([[png(picture)] for picture in rgb], dtype=np.object_)


class LabelScores:
    """A pipeline's answers (each picture's top labels and their probabilities) as scores over the model's classes,
    each label in the column where it was first seen, every class not in the top ones at 0: the sequential test's
    top-1 comparison and near ties read them as they read a model's scores."""

    def __init__(self, classes: int) -> None:
        self.classes = classes
        self.columns: dict[bytes, int] = {}

    def __call__(self, answer: Mapping[str, np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
        import numpy as np

        labels, probabilities = (np.atleast_2d(answer[name]) for name in (LABELS_OUTPUT, PROBABILITIES_OUTPUT))
        scores = np.zeros((len(labels), self.classes), dtype=np.float32)
        for row, (names, values) in enumerate(zip(labels, probabilities, strict=True)):
            for name, value in zip(names, values, strict=True):
                column = self.columns.setdefault(bytes(name), len(self.columns))
                if column >= self.classes:
                    raise AgreementError(
                        f"the revisions answer more labels than the model's {self.classes} classes: their labels "
                        "files differ, and their answers cannot be compared"
                    )
                scores[row, column] = value
        return scores


def compare_revisions(
    stable_url: str, candidate_url: str, stable: InferenceServiceSpec, candidate: InferenceServiceSpec
) -> AgreementResult:
    """Both pods on the same inputs, batch after batch, until the sequential test has decided every output the
    candidate's gate judges (or a refusal). Models whose tensors differ cannot agree: that is an error. Behind an
    image pipeline both answer pictures, and their top labels are compared."""
    from inferop_core.agreement import run_check

    model = candidate.model
    signature = [(t.name, t.datatype, list(t.dims)) for t in (*model.inputs, *model.outputs)]
    theirs = [(t.name, t.datatype, list(t.dims)) for t in (*stable.model.inputs, *stable.model.outputs)]
    if signature != theirs or model.name != stable.model.name:
        raise AgreementError(
            f"the candidate serves model {model.name!r} with tensors {signature}, the stable revision "
            f"{stable.model.name!r} with {theirs}: callers of one cannot call the other"
        )
    if (candidate.pipeline is None) != (stable.pipeline is None):
        served = "an image pipeline" if candidate.pipeline is not None else "the model's tensors"
        raise AgreementError(f"the candidate serves {served}, the stable revision does not: callers of one cannot "
                             "call the other")  # fmt: skip
    planned = design(candidate)
    batch = min(candidate.batching.max_batch_size, stable.batching.max_batch_size)
    names = [t.name for t in model.outputs]
    # Near ties are not counted by the test: room for them past its most inputs, then undecided is refused.
    limit = 2 * planned.test.test.max_samples

    def ask(url: str, feeds: dict[str, Any]) -> dict[str, Any]:
        if candidate.pipeline is None:
            return infer(url, model.name, feeds, names)
        assert model.processing is not None  # a pipeline wraps an image classifier (InferenceServiceSpec._pipeline)
        tensors = feeds[model.inputs[0].name]
        images = pictures(model.processing, tensors if batch else tensors[None])
        return infer(
            url, model.name, {IMAGE_INPUT: images if batch else images[0]}, [LABELS_OUTPUT, PROBABILITIES_OUTPUT]
        )

    scores = LabelScores(model.outputs[0].dims[0])

    def read(answer: dict[str, Any]) -> dict[str, Any]:
        return answer if candidate.pipeline is None else {names[0]: scores(answer)}

    def answers(pool: ThreadPoolExecutor) -> Iterator[tuple[str, int, Any, Any]]:
        for origin, count, feeds in agreement_inputs(candidate, batch, limit):
            asked = [pool.submit(ask, url, feeds) for url in (stable_url, candidate_url)]
            yield origin, count, read(asked[0].result()), read(asked[1].result())

    with ThreadPoolExecutor(max_workers=2) as pool:  # both pods answer each batch at once
        return run_check(planned.gate, planned.test, planned.epsilon, answers(pool))

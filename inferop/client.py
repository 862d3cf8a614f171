"""`inferop infer`: call a Triton endpoint with `tritonclient.http` and binary tensors.

How inputs are made and outputs read is what the model's config declares (`inferop_core.processing`), never guessed
from its name: image classifiers get their preprocessing and answer with the top labels; board models get a
board (a file or random) and answer with the move distribution and the value; any other model takes each input
from an .npy file or generated, and answers with every output's shape and values. An image pipeline (an ensemble
whose input is the pipeline's IMAGE, inferop_core.tritonconfig.build_pipeline_configs) gets each image file's bytes as
they are, decodes and preprocesses them on the server, and answers with its top labels. Every answer says where the
model's weights came from, read from its config (an ensemble's from its members'): random weights answer too, and
their answers mean nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from inferop.serving.pipeline import ImageRefused, image_tensor, preprocess, softmax
from inferop_core.agreement import NUMPY_TYPES
from inferop_core.errors import InferopError
from inferop_core.processing import PROCESSING_PARAMETER, Processing

# What the answers of random weights still show, per kind of answer.
LABELS_CAVEAT = "the labels show the pipeline working, not accuracy"
BOARD_CAVEAT = "policy and value show the pipeline working, not playing strength"
TENSORS_CAVEAT = "the outputs show the pipeline working, nothing more"
CAVEATS = {"imageClassification": LABELS_CAVEAT, "policyValue": BOARD_CAVEAT, "tensors": TENSORS_CAVEAT}
# Outputs up to this many values per sample are printed whole; larger ones as a summary.
PRINTED_VALUES = 16
SAMPLE_PICTURE = "sample picture (drawn)"


class InferError(InferopError, RuntimeError):
    """A call that failed for a reason the user can act on; the message says which."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    datatype: str
    dims: list[int]  # without the batch axis when the model batches; -1 where the size varies


@dataclass(frozen=True)
class ModelInfo:
    name: str
    inputs: list[TensorInfo]
    outputs: list[str]
    batched: bool  # max_batch_size > 0: every tensor has a leading batch axis
    labelled_output: str | None  # an output with a label file: the classification extension works on it
    classes: int
    weights: str | None  # where the weights came from, as `inferop export` recorded it; None: not recorded
    processing: Processing  # as the config declares it; plain tensors if it does not
    image_pipeline: bool  # an ensemble taking encoded images as IMAGE and answering LABELS and PROBABILITIES

    @property
    def input_name(self) -> str:
        return self.inputs[0].name

    @property
    def input_dims(self) -> list[int]:
        return self.inputs[0].dims

    def shape(self, tensor: TensorInfo, batch: int) -> list[int]:
        dims = [max(d, 1) for d in tensor.dims]
        return [batch, *dims] if self.batched else dims


def connect(url: str, timeout: float) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)


def wait_until_ready(client: Any, url: str, model: str, seconds: float) -> None:
    """Return once the server at `url` has `model` ready: for a server started in the background a moment ago,
    or a port-forward still opening, which would otherwise refuse the first call."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if client.is_model_ready(model):
                return
            why = f"model {model!r} is not ready"
        except Exception as error:  # refused, reset or no answer yet: each a reason to wait, the last one shown
            why = f"{type(error).__name__}: {error}"
        if time.monotonic() >= deadline:
            raise InferError(f"{url}: not ready within --wait {seconds:g} s ({why})")
        time.sleep(0.2)


def describe(client: Any, model: str) -> ModelInfo:
    """Read the model's tensor contract from the server (metadata + config), translating errors."""
    from inferop_core.tritonconfig import ENSEMBLE_PLATFORM, IMAGE_INPUT, LABELS_OUTPUT, PROBABILITIES_OUTPUT

    metadata = call(client.get_model_metadata, model, what=f"model {model!r}")
    config = call(client.get_model_config, model, what=f"model {model!r}")
    batched = bool(config.get("max_batch_size", 0))
    inputs = [
        TensorInfo(t["name"], t["datatype"], [int(d) for d in t["shape"]][1 if batched else 0 :])
        for t in metadata["inputs"]
    ]
    labelled = next((o for o in config.get("output", []) if o.get("label_filename")), None)
    text = config.get("parameters", {}).get(PROCESSING_PARAMETER, {}).get("string_value")
    try:
        processing = Processing.from_parameter(text)
    except ValueError as error:
        raise InferError(f"model {model!r}: its config's {PROCESSING_PARAMETER} is not understood ({error})") from None
    outputs = [o["name"] for o in metadata["outputs"]]
    ensemble = config.get("platform") == ENSEMBLE_PLATFORM
    weights = recorded_weights(config)
    if ensemble and weights is None:  # an ensemble has no weights of its own: its model member records them
        steps = config.get("ensemble_scheduling", {}).get("step", [])
        members = (call(client.get_model_config, s["model_name"], what=f"model {s['model_name']!r}") for s in steps)
        weights = next(filter(None, map(recorded_weights, members)), None)
    return ModelInfo(
        name=model,
        inputs=inputs,
        outputs=outputs,
        batched=batched,
        labelled_output=labelled["name"] if labelled else None,
        classes=int(labelled["dims"][0]) if labelled else 0,
        weights=weights,
        processing=processing,
        image_pipeline=ensemble
        and [(t.name, t.datatype) for t in inputs] == [(IMAGE_INPUT, "BYTES")]
        and {LABELS_OUTPUT, PROBABILITIES_OUTPUT} <= set(outputs),
    )


def recorded_weights(config: dict[str, Any]) -> str | None:
    """The weights' provenance from a model config as Triton's model-config endpoint returns it."""
    from inferop_core.tritonconfig import WEIGHTS_PARAMETER

    value = config.get("parameters", {}).get(WEIGHTS_PARAMETER, {}).get("string_value")
    return str(value) if value else None


def weights_note(weights: str | None, caveat: str) -> str:
    """One line on what the answers are worth: the provenance, and for random weights `caveat` with it."""
    from inferop_core.tritonconfig import WEIGHTS_PARAMETER, weights_are_random

    if weights is None:
        return f"weights: not recorded (the model's config has no {WEIGHTS_PARAMETER!r} parameter)"
    if weights_are_random(weights):
        return f"weights: {weights}; {caveat}"
    return f"weights: {weights}"


def call(function: Any, *args: Any, what: str, **kwargs: Any) -> Any:
    """Call the client, turning transport failures and server refusals into messages that say which."""
    from tritonclient.utils import InferenceServerException

    try:
        return function(*args, **kwargs)
    except InferenceServerException as error:
        status = error.status() or ""
        raise InferError(f"{what}: server said {status + ' ' if status else ''}{error.message()}") from error
    except (ConnectionError, OSError) as error:
        raise InferError(f"{what}: cannot reach Triton ({error})") from error
    except TimeoutError as error:  # gevent's timeout
        raise InferError(f"{what}: no answer within the client timeout") from error


def sample_picture() -> Any:
    """A 400x320 picture drawn here (no downloads): sky, sun, a hill and a house; what an image classifier is
    called with when no image is given."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (400, 320))
    draw = ImageDraw.Draw(image)
    for y in range(320):
        draw.line([(0, y), (400, y)], fill=(90 + y // 4, 150 + y // 6, 235))
    draw.ellipse((300, 30, 360, 90), fill=(255, 215, 60))
    draw.ellipse((-100, 200, 500, 480), fill=(60, 150, 70))
    draw.rectangle((140, 150, 260, 240), fill=(180, 60, 50))
    draw.polygon([(130, 150), (200, 95), (270, 150)], fill=(110, 40, 30))
    draw.rectangle((185, 195, 215, 240), fill=(70, 40, 20))
    return image


def preprocess_image(path: Path | None, size: int, processing: Processing) -> np.ndarray:
    """The declared preprocessing of the image file at `path` (the drawn sample picture when None), as a pipeline's
    server runs it (inferop.serving.pipeline)."""
    assert processing.resize_ratio is not None and processing.mean is not None and processing.std is not None
    declared = (size, processing.resize_ratio, processing.mean, processing.std)
    if path is None:
        return preprocess(sample_picture(), *declared)
    try:
        return image_tensor(path.read_bytes(), *declared)
    except (OSError, ImageRefused) as error:
        raise InferError(f"image {path}: {error}") from error


def load_board(path: Path | None, dims: list[int], seed: int) -> np.ndarray:
    """A board from a .npy or whitespace-separated text file, or a random one; checked against the model."""
    if path is None:
        return np.random.default_rng(seed).integers(-1, 2, size=dims).astype(np.float32)
    try:
        board = np.load(path) if path.suffix == ".npy" else np.loadtxt(path, dtype=np.float32, ndmin=2)
    except (OSError, ValueError) as error:
        raise InferError(f"board {path}: {error}") from error
    board = np.asarray(board, dtype=np.float32)
    if board.size != int(np.prod(dims)):
        raise InferError(f"board {path}: {list(board.shape)} cells do not fit the model's board {dims}")
    return board.reshape(dims)


def classify(
    client: Any, info: ModelInfo, images: list[Path | None], top: int, timeout_us: int | None
) -> list[dict[str, Any]]:
    """Top-`top` labels with probabilities for each image (None: the sample picture), one batched request."""
    import tritonclient.http as httpclient

    if len(info.inputs) != 1 or len(info.input_dims) != 3 or info.input_dims[0] != 3:
        raise InferError(f"model {info.name!r} takes {[(t.name, t.dims) for t in info.inputs]}, not one CHW image")
    size = info.input_dims[-1]
    batch = np.stack([preprocess_image(path, size, info.processing) for path in images])
    request = httpclient.InferInput(info.input_name, list(batch.shape), "FP32")
    request.set_data_from_numpy(batch, binary_data=True)
    output = info.labelled_output or info.outputs[0]
    # All classes through the classification extension: labels from the server, softmax over every logit.
    wanted = httpclient.InferRequestedOutput(output, binary_data=True, class_count=info.classes or 0)
    response = call(client.infer, info.name, [request], outputs=[wanted], timeout=timeout_us, what=f"infer {info.name}")
    results = []
    for path, row in zip(images, response.as_numpy(output), strict=True):
        if info.classes:
            parsed = [entry.decode().split(":", 2) for entry in row]
            logits = np.array([float(value) for value, _, _ in parsed])
            labels = [label or index for _, index, label in parsed]
        else:
            logits, labels = np.asarray(row, dtype=np.float64), [str(i) for i in range(len(row))]
        probabilities = softmax(logits)
        order = np.argsort(-probabilities)[:top]
        top_labels = [{"label": labels[i], "probability": float(probabilities[i])} for i in order]
        results.append({"image": str(path or SAMPLE_PICTURE), "top": top_labels, "weights": info.weights})
    return results


def image_bytes(path: Path | None) -> bytes:
    """The file's bytes as they are, for the image pipeline to decode; the drawn sample picture as a PNG when None."""
    if path is None:
        out = io.BytesIO()
        sample_picture().save(out, "PNG")
        return out.getvalue()
    try:
        return path.read_bytes()
    except OSError as error:
        raise InferError(f"image {path}: {error}") from error


def encoded_images(info: ModelInfo, images: Sequence[bytes]) -> np.ndarray:
    """The image pipeline's input: each image's encoded bytes one BYTES element, along the batch axis if it has one."""
    return np.array(list(images), dtype=np.object_).reshape(info.shape(info.inputs[0], len(images)))


def classify_encoded(
    client: Any, info: ModelInfo, images: list[Path | None], top: int, timeout_us: int | None
) -> list[dict[str, Any]]:
    """The image pipeline's top labels (at most its own topK) for each image, which the server decodes and
    preprocesses: one request an image, so the 400 of a refused one (its message names the problem) names the file."""
    import tritonclient.http as httpclient

    from inferop_core.tritonconfig import LABELS_OUTPUT, PROBABILITIES_OUTPUT

    wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in (LABELS_OUTPUT, PROBABILITIES_OUTPUT)]
    results = []
    for path in images:
        array = encoded_images(info, [image_bytes(path)])
        request = httpclient.InferInput(info.input_name, list(array.shape), "BYTES")
        request.set_data_from_numpy(array, binary_data=True)
        name = str(path or SAMPLE_PICTURE)
        response = call(client.infer, info.name, [request], outputs=wanted, timeout=timeout_us, what=f"image {name}")
        labels = response.as_numpy(LABELS_OUTPUT).ravel()[:top]
        probabilities = response.as_numpy(PROBABILITIES_OUTPUT).ravel()[:top]
        top_labels = [
            {"label": label.decode(), "probability": float(p)} for label, p in zip(labels, probabilities, strict=True)
        ]
        results.append({"image": name, "top": top_labels, "weights": info.weights})
    return results


def play(client: Any, info: ModelInfo, board: np.ndarray, timeout_us: int | None) -> dict[str, Any]:
    import tritonclient.http as httpclient

    request = httpclient.InferInput(info.input_name, [1, *board.shape], "FP32")
    request.set_data_from_numpy(board[None], binary_data=True)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in info.outputs]
    response = call(client.infer, info.name, [request], outputs=outputs, timeout=timeout_us, what=f"infer {info.name}")
    policy = response.as_numpy("policy")[0]
    return {
        "policy": [float(p) for p in policy],
        "bestMove": int(np.argmax(policy)),
        "value": float(response.as_numpy("value").ravel()[0]),
        "weights": info.weights,
    }


def sample_inputs(info: ModelInfo, batch: int, seed: int = 0) -> list[tuple[TensorInfo, np.ndarray]]:
    """Generated inputs for any model, seeded: standard normal floats, integers and booleans in {0, 1} (within
    any vocabulary or embedding table); `batch` samples when the model batches, else its one shape."""
    rng = np.random.default_rng(seed)
    arrays = []
    for tensor in info.inputs:
        if tensor.datatype not in NUMPY_TYPES:
            raise InferError(f"input {tensor.name}: datatype {tensor.datatype} cannot be sent from here")
        dtype, shape = NUMPY_TYPES[tensor.datatype], info.shape(tensor, batch)
        if np.issubdtype(dtype, np.floating):
            arrays.append((tensor, rng.standard_normal(shape).astype(dtype)))
        else:
            arrays.append((tensor, rng.integers(0, 2, size=shape).astype(dtype)))
    return arrays


def tensor_inputs(info: ModelInfo, files: list[str], seed: int) -> list[tuple[TensorInfo, np.ndarray]]:
    """Every input from `--input NAME=FILE.npy` (checked against the model's dtype and shape) or generated;
    one sample when the model batches."""
    given: dict[str, Path] = {}
    for text in files:
        name, sep, path = text.partition("=")
        if not sep or not path:
            raise InferError(f"--input {text!r}: expected NAME=FILE.npy")
        if name not in {t.name for t in info.inputs}:
            raise InferError(f"--input {name}: model {info.name!r} has inputs {[t.name for t in info.inputs]}")
        given[name] = Path(path)
    arrays = []
    for tensor, generated in sample_inputs(info, 1, seed):
        if tensor.name in given:
            shape = list(generated.shape)
            array = load_array(given[tensor.name], tensor, generated.dtype)
            array = array[None] if info.batched and list(array.shape) == shape[1:] else array
            if list(array.shape) != shape and not (info.batched and list(array.shape[1:]) == shape[1:]):
                raise InferError(f"--input {tensor.name}: shape {list(array.shape)}, the model takes {shape}")
            arrays.append((tensor, array))
        else:
            arrays.append((tensor, generated))
    return arrays


def load_array(path: Path, tensor: TensorInfo, dtype: Any) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise InferError(f"--input {tensor.name}={path}: {error}") from error
    if not np.can_cast(array.dtype, dtype, casting="same_kind"):
        raise InferError(f"--input {tensor.name}={path}: {array.dtype} values, the model takes {tensor.datatype}")
    return np.asarray(array, dtype=dtype)


def call_with_tensors(
    client: Any, info: ModelInfo, inputs: list[tuple[TensorInfo, np.ndarray]], timeout_us: int | None
) -> dict[str, Any]:
    """Send the tensors; every output with its shape, dtype, and values (a summary for large ones)."""
    import tritonclient.http as httpclient

    requests = []
    for tensor, array in inputs:
        request = httpclient.InferInput(tensor.name, list(array.shape), tensor.datatype)
        request.set_data_from_numpy(array, binary_data=True)
        requests.append(request)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in info.outputs]
    response = call(client.infer, info.name, requests, outputs=outputs, timeout=timeout_us, what=f"infer {info.name}")
    answer: dict[str, Any] = {"outputs": {}, "weights": info.weights}
    for name in info.outputs:
        value = response.as_numpy(name)
        entry: dict[str, Any] = {"shape": list(value.shape), "datatype": str(value.dtype)}
        if value.size <= PRINTED_VALUES:
            entry["values"] = value.ravel().tolist()
        else:
            numbers = value.astype(np.float64)
            entry["summary"] = {
                "min": float(numbers.min()),
                "max": float(numbers.max()),
                "mean": float(numbers.mean()),
                "argmax": int(numbers.ravel().argmax()),
            }
        answer["outputs"][name] = entry
    return answer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint host:port")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("images", nargs="*", type=Path, help="image files, as --image")
    parser.add_argument(
        "--image",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="a JPEG or PNG file (image classifiers: preprocessed here; image pipelines: sent as it is, decoded by the "
        "server; default: a drawn picture); repeat per file",
    )
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="an input's values (models of plain tensors; default: generated, seeded); repeat per input",
    )
    parser.add_argument("--board", type=Path, help="board as .npy or text rows (board models; default random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random board")
    parser.add_argument(
        "--top",
        type=int,
        default=5,
        help="labels to show per image (default 5; an image pipeline has at most its topK)",
    )
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before the client gives up")
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="wait up to SECONDS for the server to answer with the model ready, as for a server started in the "
        "background just before (default 0: call at once)",
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        if args.wait < 0:
            raise InferError(f"--wait {args.wait:g}: seconds to wait cannot be negative")
        client = connect(args.url, args.timeout)
        if args.wait:
            wait_until_ready(client, args.url, args.model, args.wait)
        info = describe(client, args.model)
        timeout_us = int(args.timeout * 1e6)  # also the server-side queue timeout for this request
        images = [*args.images, *args.image]
        kind = "imageClassification" if info.image_pipeline else info.processing.kind
        misplaced = {"--image": bool(images) and kind != "imageClassification",
                     "--board": args.board is not None and kind != "policyValue",
                     "--input": bool(args.input) and kind != "tensors"}  # fmt: skip
        declared = "is an image pipeline" if info.image_pipeline else f"declares {kind} processing"
        for what, wrong in misplaced.items():
            if wrong:
                raise InferError(f"model {args.model!r} {declared}: {what} does not apply to it")
        if kind == "imageClassification":
            labeller = classify_encoded if info.image_pipeline else classify
            result: Any = labeller(client, info, images or [None], args.top, timeout_us)
        elif kind == "policyValue":
            result = play(client, info, load_board(args.board, info.input_dims, args.seed), timeout_us)
        else:
            result = call_with_tensors(client, info, tensor_inputs(info, args.input, args.seed), timeout_us)
    except InferError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_answer(kind, result))
        print(weights_note(info.weights, CAVEATS[kind]))
    return 0


def format_answer(kind: str, result: Any) -> str:
    if kind == "imageClassification":
        lines = []
        for entry in result:
            lines.append(entry["image"])
            lines += [
                f"  {rank}. {item['label']:<30} {item['probability']:.4f}" for rank, item in enumerate(entry["top"], 1)
            ]
        return "\n".join(lines)
    if kind == "policyValue":
        moves = "  ".join(f"{i}:{p:.3f}" for i, p in enumerate(result["policy"]))
        return f"policy  {moves}\nbest move {result['bestMove']}   value {result['value']:+.4f}"
    lines = []
    for name, entry in result["outputs"].items():
        head = f"{name} {entry['datatype']} {entry['shape']}"
        if "values" in entry:
            lines.append(f"{head}: {entry['values']}")
        else:
            summary = entry["summary"]
            lines.append(
                f"{head}: min {summary['min']:.4g}, max {summary['max']:.4g}, mean {summary['mean']:.4g}, "
                f"argmax {summary['argmax']}"
            )
    return "\n".join(lines)

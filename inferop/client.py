"""`inferop infer`: call a Triton endpoint with `tritonclient.http` and binary tensors.

Image classifiers get the standard Inception preprocessing and answer with the top-5 labels; board models
get a board (a file or random) and answer with the move distribution and the value. Every answer says where the
model's weights came from, read from its config: random weights answer too, and their answers mean nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# torchvision's ImageNet normalisation; Inception resizes the short side to 342 and crops 299.
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
RESIZE_RATIO = 342 / 299
# What the answers of random weights still show, per kind of answer.
LABELS_CAVEAT = "the labels show the pipeline working, not accuracy"
BOARD_CAVEAT = "policy and value show the pipeline working, not playing strength"


class InferError(RuntimeError):
    """A call that failed for a reason the user can act on; the message says which."""


@dataclass(frozen=True)
class ModelInfo:
    name: str
    input_name: str
    input_dims: list[int]  # without the batch axis
    outputs: list[str]
    labelled_output: str | None  # an output with a label file: the classification extension works on it
    classes: int
    weights: str | None  # where the weights came from, as `inferop export` recorded it; None: not recorded


def connect(url: str, timeout: float) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url, connection_timeout=timeout, network_timeout=timeout)


def describe(client: Any, model: str) -> ModelInfo:
    """Read the model's tensor contract from the server (metadata + config), translating errors."""
    metadata = call(client.get_model_metadata, model, what=f"model {model!r}")
    config = call(client.get_model_config, model, what=f"model {model!r}")
    (tensor,) = metadata["inputs"][:1]
    dims = (
        [int(d) for d in tensor["shape"]][1:] if config.get("max_batch_size", 0) else [int(d) for d in tensor["shape"]]
    )
    labelled = next((o for o in config.get("output", []) if o.get("label_filename")), None)
    return ModelInfo(
        name=model,
        input_name=tensor["name"],
        input_dims=dims,
        outputs=[o["name"] for o in metadata["outputs"]],
        labelled_output=labelled["name"] if labelled else None,
        classes=int(labelled["dims"][0]) if labelled else 0,
        weights=recorded_weights(config),
    )


def recorded_weights(config: dict[str, Any]) -> str | None:
    """The weights' provenance from a model config as Triton's model-config endpoint returns it."""
    from inferop.tritonconfig import WEIGHTS_PARAMETER

    value = config.get("parameters", {}).get(WEIGHTS_PARAMETER, {}).get("string_value")
    return str(value) if value else None


def weights_note(weights: str | None, caveat: str) -> str:
    """One line on what the answers are worth: the provenance, and for random weights `caveat` with it."""
    from inferop.tritonconfig import WEIGHTS_PARAMETER, weights_are_random

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


def preprocess_image(path: Path, size: int) -> np.ndarray:
    """Standard Inception preprocessing: resize the short side, centre crop, ImageNet-normalise, CHW."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as image:
            rgb = image.convert("RGB")
    except (FileNotFoundError, UnidentifiedImageError) as error:
        raise InferError(f"image {path}: {error}") from error
    short = round(size * RESIZE_RATIO)
    scale = short / min(rgb.size)
    width, height = max(short, round(rgb.width * scale)), max(short, round(rgb.height * scale))
    resized = rgb.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    crop = np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0
    return ((crop - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)


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


def softmax(values: np.ndarray) -> np.ndarray:
    shifted = np.exp(values - values.max())
    return shifted / shifted.sum()


def classify(
    client: Any, info: ModelInfo, images: list[Path], top: int, timeout_us: int | None
) -> list[dict[str, Any]]:
    """Top-`top` labels with probabilities for each image, one batched request."""
    import tritonclient.http as httpclient

    size = info.input_dims[-1]
    batch = np.stack([preprocess_image(path, size) for path in images])
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
        results.append({"image": str(path), "top": top_labels, "weights": info.weights})
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP endpoint host:port")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("images", nargs="*", type=Path, help="image files (image classifiers)")
    parser.add_argument("--board", type=Path, help="board as .npy or text rows (board models; default random)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random board")
    parser.add_argument("--top", type=int, default=5, help="labels to show per image (default 5)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds before the client gives up")
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        client = connect(args.url, args.timeout)
        info = describe(client, args.model)
        timeout_us = int(args.timeout * 1e6)  # also the server-side queue timeout for this request
        if args.images:
            if len(info.input_dims) != 3 or info.input_dims[0] != 3:
                raise InferError(f"model {args.model!r} takes {info.input_name} {info.input_dims}, not images")
            result: Any = classify(client, info, args.images, args.top, timeout_us)
        elif "policy" in info.outputs:
            result = play(client, info, load_board(args.board, info.input_dims, args.seed), timeout_us)
        else:
            raise InferError(f"model {args.model!r} takes {info.input_name} {info.input_dims}: give image files")
    except InferError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.images:
        for entry in result:
            print(entry["image"])
            for rank, item in enumerate(entry["top"], 1):
                print(f"  {rank}. {item['label']:<30} {item['probability']:.4f}")
        print(weights_note(info.weights, LABELS_CAVEAT))
    else:
        moves = "  ".join(f"{i}:{p:.3f}" for i, p in enumerate(result["policy"]))
        print(f"policy  {moves}\nbest move {result['bestMove']}   value {result['value']:+.4f}")
        print(weights_note(info.weights, BOARD_CAVEAT))
    return 0

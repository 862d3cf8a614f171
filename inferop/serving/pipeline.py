"""An image classifier's pipeline stages, as functions and as a Triton python-backend model.

`decode` turns the bytes a caller sends (JPEG or PNG) into an upright RGB picture or refuses them with a message
that names the problem; `preprocess` makes the tensor the model takes as its export declared it
(inferop_core.processing.Processing, kind imageClassification: the short side resized, a centre crop, normalised,
CHW); `top_k` reads the model's scores back as labels. `inferop infer --image` calls the same functions in the
client that the server runs, so a caller that decodes on its side and the pipeline send the model the same tensor.

Served, this file is the model.py of the python-based backend `inferop_pipeline` (the image's
backends/inferop_pipeline/model.py; locally, each stage's model.py): `TritonPythonModel` runs one stage, as
inferop_core.tritonconfig.build_pipeline_configs renders it. Depends only on numpy, Pillow and, there, Triton's utils.
"""

from __future__ import annotations

import io
import json
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from PIL.Image import Image as Picture

# A caller's file is refused past these unless the service sets its own (spec pipeline.maxImageBytes,
# maxImagePixels): a photograph of 24 megapixels (6000 x 4000) as a JPEG is 4-8 MB at usual qualities.
MAX_IMAGE_BYTES = 8 * 2**20
MAX_IMAGE_PIXELS = 25_000_000
FORMATS = ("JPEG", "PNG")
# The modes of a 16-bit grey PNG, which convert("RGB") clips instead of scaling to 8 bits.
WIDE_GREYS = ("I", "I;16", "I;16B", "I;16L", "I;16N")


class ImageRefused(ValueError):
    """Bytes that are no image this pipeline takes; the message says why, for the caller."""


def decode(
    data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS, short_side: int | None = None
) -> Picture:
    """The picture in `data`, upright as its EXIF orientation says, in RGB (grey, palette, CMYK and alpha
    converted). The size checks come before the pixels are decoded: a file that declares more pixels than
    `max_pixels` costs a header's read. With `short_side` (what the picture is resized to next), a JPEG is decoded at
    the smallest of libjpeg's scales (1/8 to 1) whose short side still covers it."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise ImageRefused("an empty body: no image")
    if len(data) > max_bytes:
        raise ImageRefused(f"{len(data)} bytes, over the {max_bytes} bytes an image may have (maxImageBytes)")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            warnings.simplefilter("ignore", UserWarning)  # corrupt EXIF: the picture is kept as stored
            image = Image.open(io.BytesIO(bytes(data)), formats=FORMATS)
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise ImageRefused(f"{error} (maxImagePixels {max_pixels})") from None
    except UnidentifiedImageError:
        opening = bytes(data[:8])
        raise ImageRefused(f"not a {' or '.join(FORMATS)} image ({len(data)} bytes beginning {opening!r})") from None
    except Exception as error:  # a parser's failure on bytes from anyone is the bytes' fault, whatever it raises
        raise ImageRefused(f"a corrupt image: {error}") from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRefused(f"{width}x{height} pixels, over the {max_pixels} an image may have (maxImagePixels)")
    try:
        if short_side is not None and image.format == "JPEG" and min(width, height) > short_side:
            scale = short_side / min(width, height)
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # corrupt EXIF: the picture is kept as stored
            image.load()
            ImageOps.exif_transpose(image, in_place=True)  # upright without a copy of the pixels
    except Exception as error:  # as above: Pillow raises OSError, SyntaxError, ValueError, struct.error...
        raise ImageRefused(f"a corrupt {image.format}: {error}") from None
    picture: Picture = image
    del image  # each copy of the pixels below is dropped as soon as the next exists: memory is the stage's cost
    if picture.mode in WIDE_GREYS:
        grey = np.asarray(picture, dtype=np.uint32)
        del picture
        grey += 128  # 65,535 to 255, rounded: (v + 128) // 257 is round(v / 257) for every integer v
        grey //= 257
        picture = Image.fromarray(grey.astype(np.uint8), "L")
        del grey
    if picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P" and "transparency" in picture.info):
        rgba = picture if picture.mode == "RGBA" else picture.convert("RGBA")
        del picture
        upright = Image.new("RGB", rgba.size, (255, 255, 255))
        upright.paste(rgba, mask=rgba)  # on white, as a viewer shows it
        return upright
    return picture if picture.mode == "RGB" else picture.convert("RGB")


def preprocess(rgb: Picture, size: int, resize_ratio: float, mean: Sequence[float], std: Sequence[float]) -> np.ndarray:
    """The tensor (3, size, size) the model takes: the short side resized to `resize_ratio` x `size` (bilinear), the
    centre `size` x `size` cropped, scaled to [0, 1] and normalised per channel."""
    from PIL import Image

    short = round(size * resize_ratio)
    scale = short / min(rgb.size)
    width, height = max(short, round(rgb.width * scale)), max(short, round(rgb.height * scale))
    resized = rgb.resize((width, height), Image.Resampling.BILINEAR)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    crop = np.asarray(resized.crop((left, top, left + size, top + size)), dtype=np.float32) / 255.0
    centre, spread = np.asarray(mean, dtype=np.float32), np.asarray(std, dtype=np.float32)
    return ((crop - centre) / spread).transpose(2, 0, 1)


def image_tensor(
    data: bytes,
    size: int,
    resize_ratio: float,
    mean: Sequence[float],
    std: Sequence[float],
    max_bytes: int = MAX_IMAGE_BYTES,
    max_pixels: int = MAX_IMAGE_PIXELS,
) -> np.ndarray:
    """What a caller's bytes become, decoded at the least scale the resize needs and preprocessed."""
    picture = decode(data, max_bytes, max_pixels, short_side=round(size * resize_ratio))
    return preprocess(picture, size, resize_ratio, mean, std)


def softmax(scores: np.ndarray) -> np.ndarray:
    shifted = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The `k` best classes of each row of `scores` (logits), best first, with their softmax probabilities; ties in
    the order of the classes."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    return order, np.take_along_axis(softmax(scores), order, axis=-1)


class TritonPythonModel:
    """A stage of the pipeline served by Triton: the config's parameter `inferop_stage` says which (`pre`: image
    bytes in, the model's input out; `post`: scores in, the top labels and their probabilities out), `inferop_pipeline`
    its settings, and its inputs and outputs their names. A request that `decode` refuses gets its own error (HTTP
    400 with the message), and the others of its batch are answered."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.stage = parameters["inferop_stage"]
        self.settings = json.loads(parameters["inferop_pipeline"])
        self.inputs = [tensor["name"] for tensor in config["input"]]
        self.outputs = [tensor["name"] for tensor in config["output"]]
        if self.stage == "post":
            labels = Path(args["model_repository"]) / self.settings["labelsFile"]
            self.labels = np.array(labels.read_text().splitlines(), dtype=object)
        elif self.stage != "pre":
            raise ValueError(f"inferop_stage {self.stage!r}: expected pre or post")

    def execute(self, requests: list[Any]) -> list[Any]:
        import triton_python_backend_utils as pb_utils

        responses = []
        for request in requests:
            inputs = pb_utils.get_input_tensor_by_name(request, self.inputs[0]).as_numpy()
            try:
                outputs = self._pre(inputs) if self.stage == "pre" else self._post(inputs)
            except ImageRefused as refused:
                error = pb_utils.TritonError(str(refused), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            tensors = [pb_utils.Tensor(name, array) for name, array in zip(self.outputs, outputs, strict=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses

    def _pre(self, images: np.ndarray) -> list[np.ndarray]:
        s = self.settings
        declared = (s["size"], s["resizeRatio"], s["mean"], s["std"], s["maxImageBytes"], s["maxImagePixels"])
        return [np.stack([image_tensor(data, *declared) for data in images.reshape(-1)])]

    def _post(self, scores: np.ndarray) -> list[np.ndarray]:
        order, probabilities = top_k(scores, self.settings["topK"])
        return [self.labels[order], probabilities.astype(np.float32)]

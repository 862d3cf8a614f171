"""`inferop export … --pipeline image`: an image classifier served behind its pipeline, measured and proved.

Callers send the ensemble `<name>` a JPEG or PNG and read the top labels; the model is served beside it as
`<name>_model`, with the stages `<name>_pre` and `<name>_post` (inferop/serving/pipeline.py) around it. The stages'
cost is measured here on photographs, as the model's capacity is, so that the plan sizes them; and the pipeline is
served by the real tritonserver and sent photographs at several sizes and qualities, whose top labels must equal
decoding, the model in ONNX Runtime and the top-k in this process.
"""

from __future__ import annotations

import importlib.util
import io
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from inferop.serving.pipeline import image_tensor, top_k
from inferop_core.errors import InferopError
from inferop_core.tritonconfig import (
    IMAGE_INPUT,
    LABELS_OUTPUT,
    MODEL_FILENAME,
    PROBABILITIES_OUTPUT,
    PipelineConfig,
)

if TYPE_CHECKING:
    from PIL.Image import Image as Picture

PIPELINES = ("image",)
# scikit-image's bundled photographs (an export dependency): a cat, a cup of coffee, a portrait, a rocket.
PHOTOGRAPHS = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg")
STAGE_WINDOWS = 3  # the stages' rate is their median, as the model's capacity is
PROBABILITY_TOLERANCE = 1e-3  # relative: the served probabilities against those in process


class PipelineError(InferopError, RuntimeError):
    """The served pipeline does not answer as decoding, the model and the top-k do in process."""


def photographs() -> dict[str, Picture]:
    """scikit-image's bundled photographs by name, in RGB (read as files: the package itself is not imported)."""
    from PIL import Image

    found = importlib.util.find_spec("skimage")
    if found is None or not found.submodule_search_locations:
        raise InferopError(
            "--pipeline image checks the pipeline on scikit-image's photographs: pip install scikit-image"
        )
    data = Path(next(iter(found.submodule_search_locations))) / "data"
    return {name.split(".")[0]: Image.open(data / name).convert("RGB") for name in PHOTOGRAPHS}


def encodings(photo: Picture) -> dict[str, bytes]:
    """The photograph as callers send it: JPEG at three qualities, at twice its size (which the stage decodes at
    half scale), at its size and at half; and a PNG."""
    from PIL import Image

    found = {}
    for scale in (2.0, 1.0, 0.5):
        sized = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.Resampling.LANCZOS)
        for quality in (95, 75, 40):
            out = io.BytesIO()
            sized.save(out, "JPEG", quality=quality)
            found[f"jpeg{quality}x{scale:g}"] = out.getvalue()
    out = io.BytesIO()
    photo.save(out, "PNG")
    found["png"] = out.getvalue()
    return found


def typical_images() -> list[bytes]:
    """What the stages' rate is measured on: each photograph as a JPEG of quality 90 at its own size."""
    images = []
    for photo in photographs().values():
        out = io.BytesIO()
        photo.save(out, "JPEG", quality=90)
        images.append(out.getvalue())
    return images


def pixels(pipeline: PipelineConfig, data: bytes) -> np.ndarray:
    """The model's input for one image, as the `pre` stage makes it."""
    settings = pipeline.stage_settings("pre")
    keys = ("size", "resizeRatio", "mean", "std", "maxImageBytes", "maxImagePixels")
    return image_tensor(data, *(settings[key] for key in keys))  # type: ignore[arg-type]


def measure_stage_rate(
    pipeline: PipelineConfig, images: list[bytes], seconds: float = 1.5, clock: Callable[[], float] = time.thread_time
) -> float:
    """Images per CPU-second that one thread decodes, preprocesses and ranks (`pre` and `post` of one image), timed
    by the thread's CPU time as the model's capacity is (`exporter.measure_capacity`): the median of STAGE_WINDOWS
    windows after one pass over `images`."""
    classes = pipeline.model.outputs[0].dims[0]
    scores = np.random.default_rng(0).standard_normal((1, classes)).astype(np.float32)

    def one(data: bytes) -> None:
        pixels(pipeline, data)
        top_k(scores, pipeline.top_k)

    for data in images:
        one(data)
    rates = []
    for _ in range(STAGE_WINDOWS):
        done, start = 0, clock()
        while done < len(images) or clock() - start < seconds / STAGE_WINDOWS:
            one(images[done % len(images)])
            done += 1
        rates.append(done / (clock() - start))
    return round(statistics.median(rates), 3)


@dataclass(frozen=True)
class PipelineCheck:
    images: int  # photographs x encodings sent
    worst_relative_difference: float  # of the top-k probabilities, served against in process

    def describe(self, pipeline: PipelineConfig) -> str:
        return (
            f"{self.images} photographs (scikit-image's, JPEG at 3 qualities and 3 sizes, PNG) through the ensemble "
            f"{pipeline.name} on tritonserver: top-{pipeline.top_k} labels equal to decoding + ONNX Runtime + top-k "
            f"in process, probabilities within {self.worst_relative_difference:.1e} (relative)"
        )


def check_pipeline(pipeline: PipelineConfig, repo: Path, model_dir: Path, labels: list[str]) -> PipelineCheck:
    """Serve `repo` (the pipeline's four directories) on the local tritonserver and send every photograph in every
    encoding; raise PipelineError naming the first whose top labels or probabilities differ from in process."""
    import onnxruntime as ort

    from inferop.serving.tritonserver import ServerError, TritonServer, free_port

    session = ort.InferenceSession(str(model_dir / "1" / MODEL_FILENAME), providers=["CPUExecutionProvider"])
    worst, sent = 0.0, 0
    try:
        with TritonServer(repo, http_port=free_port()) as server:
            for name, photo in photographs().items():
                for encoding, data in encodings(photo).items():
                    served_labels, served = ask(server.url, pipeline.name, data)
                    (logits,) = session.run(None, {pipeline.model.inputs[0].name: pixels(pipeline, data)[None]})
                    order, expected = top_k(logits, pipeline.top_k)
                    wanted = [labels[i] for i in order[0]]
                    if served_labels != wanted or not np.allclose(served, expected[0], rtol=PROBABILITY_TOLERANCE):
                        raise PipelineError(
                            f"{pipeline.name}: photograph {name} ({encoding}) is answered {served_labels} "
                            f"{np.round(served, 4).tolist()} by the pipeline and {wanted} "
                            f"{np.round(expected[0], 4).tolist()} in process"
                        )
                    worst = max(worst, float(np.max(np.abs(served - expected[0]) / np.maximum(expected[0], 1e-12))))
                    sent += 1
    except ServerError as error:
        raise PipelineError(f"{pipeline.name}: tritonserver does not serve the pipeline: {error}") from None
    return PipelineCheck(sent, worst)


def ask(url: str, ensemble: str, data: bytes) -> tuple[list[str], np.ndarray]:
    """One image to the ensemble: its top labels and their probabilities."""
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, network_timeout=120)
    try:
        request = httpclient.InferInput(IMAGE_INPUT, [1, 1], "BYTES")
        request.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
        response: Any = client.infer(ensemble, [request])
    finally:
        client.close()
    return [label.decode() for label in response.as_numpy(LABELS_OUTPUT)[0]], response.as_numpy(PROBABILITIES_OUTPUT)[0]

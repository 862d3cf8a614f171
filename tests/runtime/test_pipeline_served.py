"""Inception V3 behind its image pipeline on the real tritonserver: photographs in as JPEG or PNG bytes, the top
labels out, the same as decoding, running the model and taking the top labels in process; bytes that are no image
refused with a 400 that names the problem, the other callers answered."""

from __future__ import annotations

import importlib.util
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from inferop.serving.pipeline import image_tensor, top_k
from inferop_core.tritonconfig import (
    IMAGE_INPUT,
    LABELS_OUTPUT,
    PROBABILITIES_OUTPUT,
    PipelineConfig,
    member_name,
    parse_model_config,
    read_serving_config,
)
from tests.helpers import ExportedRepo, png_declaring, serving

pytestmark = pytest.mark.integration

PHOTOS = ("chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg")  # scikit-image's own photographs
MAX_IMAGE_BYTES = 2 * 2**20


def photographs() -> dict[str, Image.Image]:
    """scikit-image's bundled photographs (read as files: the package is not imported)."""
    found = importlib.util.find_spec("skimage")
    if found is None or not found.submodule_search_locations:
        pytest.skip("install the dev extra for scikit-image's photographs: .venv/bin/pip install -e '.[dev]'")
    data = Path(next(iter(found.submodule_search_locations))) / "data"
    return {name.split(".")[0]: Image.open(data / name).convert("RGB") for name in PHOTOS}


def encodings(photo: Image.Image) -> dict[str, bytes]:
    """The photograph as callers send it: JPEG at three qualities, at twice its size (which the server decodes at
    half scale), at its size and at half, and a PNG."""
    found = {}
    for scale in (2.0, 1.0, 0.5):
        sized = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.Resampling.LANCZOS)
        for quality in (95, 75, 40):
            out = io.BytesIO()
            sized.save(out, "JPEG", quality=quality)
            found[f"jpeg{quality}x{scale}"] = out.getvalue()
    out = io.BytesIO()
    photo.save(out, "PNG")
    found["png"] = out.getvalue()
    return found


@pytest.fixture(scope="module")
def pipeline(model_repo: ExportedRepo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from inferop.serving.localrepo import write_pipeline_repo

    exported = model_repo.path / "inception_v3"
    model = read_serving_config(parse_model_config((exported / "config.pbtxt").read_text()))
    config = PipelineConfig(
        name="inception_v3",
        model=model.model_copy(update={"name": member_name("inception_v3", "model")}),
        top_k=5,
        max_image_bytes=MAX_IMAGE_BYTES,
        max_image_pixels=4_000_000,
    )
    repo = write_pipeline_repo(config, exported, tmp_path_factory.mktemp("pipeline") / "repo")
    import onnxruntime as ort

    session = ort.InferenceSession(str(exported / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = (exported / "labels.txt").read_text().splitlines()
    with serving(repo) as url:
        yield {"url": url, "config": config, "session": session, "labels": labels}


def send(url: str, data: bytes) -> tuple[list[str], np.ndarray]:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(url, network_timeout=60)
    try:
        request = httpclient.InferInput(IMAGE_INPUT, [1, 1], "BYTES")
        request.set_data_from_numpy(np.array([[data]], dtype=np.object_), binary_data=True)
        response = client.infer("inception_v3", [request])
    finally:
        client.close()
    labels = [label.decode() for label in response.as_numpy(LABELS_OUTPUT)[0]]
    return labels, response.as_numpy(PROBABILITIES_OUTPUT)[0]


def in_process(pipeline: dict[str, Any], data: bytes) -> tuple[list[str], np.ndarray]:
    """Decode, the model in ONNX Runtime, top-k: what a caller that decodes on its side gets."""
    config: PipelineConfig = pipeline["config"]
    settings = config.stage_settings("pre")
    tensor = image_tensor(
        data, *(settings[key] for key in ("size", "resizeRatio", "mean", "std", "maxImageBytes", "maxImagePixels"))
    )
    (logits,) = pipeline["session"].run(None, {config.model.inputs[0].name: tensor[None]})
    order, probabilities = top_k(logits, config.top_k)
    return [pipeline["labels"][i] for i in order[0]], probabilities[0]


def test_photographs_get_the_top_labels_of_decoding_and_the_model_in_process(pipeline: dict[str, Any]) -> None:
    compared = 0
    for name, photo in photographs().items():
        for encoding, data in encodings(photo).items():
            served, expected = send(pipeline["url"], data), in_process(pipeline, data)
            assert served[0] == expected[0], (name, encoding)
            np.testing.assert_allclose(served[1], expected[1], rtol=1e-3, atol=1e-6, err_msg=f"{name} {encoding}")
            compared += 1
    assert compared == len(PHOTOS) * 10


def test_bytes_that_are_no_image_get_a_400_that_names_the_problem(pipeline: dict[str, Any]) -> None:
    from tritonclient.utils import InferenceServerException

    photo = encodings(photographs()["chelsea"])["jpeg75x1.0"]
    refused = {
        "an empty body": b"",
        "not a JPEG or PNG image": b"%PDF-1.7 a document",
        "a corrupt JPEG": photo[: len(photo) // 3],
        "maxImageBytes": b"\xff\xd8\xff" + b"\0" * MAX_IMAGE_BYTES,
        "maxImagePixels": png_declaring(20_000, 20_000),
    }
    for words, data in refused.items():
        with pytest.raises(InferenceServerException) as raised:
            send(pipeline["url"], data)
        assert raised.value.status() == "400" and words in raised.value.message(), (words, str(raised.value))
    assert send(pipeline["url"], photo)[0] == in_process(pipeline, photo)[0]  # and the next caller is answered

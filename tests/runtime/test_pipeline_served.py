"""Inception V3 behind its image pipeline on the real tritonserver: photographs in as JPEG or PNG bytes, the top
labels out, the same as decoding, running the model and taking the top labels in process; bytes that are no image
refused with a 400 that names the problem, the other callers answered."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from inferop_export.pipeline import PHOTOGRAPHS, ask, encodings, photographs
from tests.helpers import PIPELINE_MAX_IMAGE_BYTES, pipeline_in_process, png_declaring

pytestmark = pytest.mark.integration


def test_photographs_get_the_top_labels_of_decoding_and_the_model_in_process(served_pipeline: dict[str, Any]) -> None:
    compared = 0
    for name, photo in photographs().items():
        for encoding, data in encodings(photo).items():
            served, expected = (
                ask(served_pipeline["url"], "inception_v3", data),
                pipeline_in_process(served_pipeline, data),
            )
            assert served[0] == expected[0], (name, encoding)
            np.testing.assert_allclose(served[1], expected[1], rtol=1e-3, atol=1e-6, err_msg=f"{name} {encoding}")
            compared += 1
    assert compared == len(PHOTOGRAPHS) * 10


def test_bytes_that_are_no_image_get_a_400_that_names_the_problem(served_pipeline: dict[str, Any]) -> None:
    from tritonclient.utils import InferenceServerException

    photo = encodings(photographs()["chelsea"])["jpeg75x1"]
    refused = {
        "an empty body": b"",
        "not a JPEG or PNG image": b"%PDF-1.7 a document",
        "a corrupt JPEG": photo[: len(photo) // 3],
        "maxImageBytes": b"\xff\xd8\xff" + b"\0" * PIPELINE_MAX_IMAGE_BYTES,
        "maxImagePixels": png_declaring(20_000, 20_000),
    }
    for words, data in refused.items():
        with pytest.raises(InferenceServerException) as raised:
            ask(served_pipeline["url"], "inception_v3", data)
        assert raised.value.status() == "400" and words in raised.value.message(), (words, str(raised.value))
    # and the next caller is answered
    assert ask(served_pipeline["url"], "inception_v3", photo)[0] == pipeline_in_process(served_pipeline, photo)[0]

"""Fixtures of the local runtime's tests that several modules share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import PIPELINE_MAX_IMAGE_BYTES, ExportedRepo, serving


@pytest.fixture(scope="module")
def served_pipeline(model_repo: ExportedRepo, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Inception V3 behind its image pipeline (the ensemble `inception_v3`) on a real tritonserver, with what
    `tests.helpers.pipeline_in_process` needs to answer the same in process."""
    import onnxruntime as ort

    from inferop.serving.localrepo import write_pipeline_repo
    from inferop_core.tritonconfig import PipelineConfig, member_name, parse_model_config, read_serving_config

    exported = model_repo.path / "inception_v3"
    model = read_serving_config(parse_model_config((exported / "config.pbtxt").read_text()))
    config = PipelineConfig(
        name="inception_v3",
        model=model.model_copy(update={"name": member_name("inception_v3", "model")}),
        top_k=5,
        max_image_bytes=PIPELINE_MAX_IMAGE_BYTES,
        max_image_pixels=4_000_000,
    )
    repo = write_pipeline_repo(config, exported, tmp_path_factory.mktemp("pipeline") / "repo")
    session = ort.InferenceSession(str(exported / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = (exported / "labels.txt").read_text().splitlines()
    with serving(repo) as url:
        yield {"url": url, "config": config, "session": session, "labels": labels}

"""Fixtures of the local runtime's tests that several modules share."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import ExportedRepo, PipelineRepo, serving


@pytest.fixture(scope="module")
def served_pipeline(model_repo: ExportedRepo, pipeline_repo: PipelineRepo) -> Iterator[dict[str, Any]]:
    """The image pipeline (`pipeline_repo`) on a real tritonserver, with what `tests.helpers.pipeline_in_process`
    needs to answer the same in process."""
    import onnxruntime as ort

    exported = model_repo.path / "inception_v3"
    session = ort.InferenceSession(str(exported / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    labels = (exported / "labels.txt").read_text().splitlines()
    with serving(pipeline_repo.path) as url:
        yield {"url": url, "config": pipeline_repo.config, "session": session, "labels": labels}

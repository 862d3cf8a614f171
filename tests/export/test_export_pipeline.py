"""`inferop export inception_v3 --pipeline image`: the model, its stages and the ensemble written together, the
stages' cost measured, and photographs through the served pipeline answered as in process; a pipeline that answers
otherwise is refused, naming the photograph."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from inferop_core.tritonconfig import PIPELINE_PARAMETER, parse_model_config, to_text

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory, inception_network: Any) -> tuple[Any, Path]:
    from inferop_export.exporter import export_model
    from inferop_operator.spec import Pipeline

    repo = tmp_path_factory.mktemp("pipeline") / "repo"
    return export_model(inception_network, repo, quiet=True, pipeline=Pipeline(top_k=3)), repo


def test_the_ensemble_and_its_members_are_written_and_proved(exported: tuple[Any, Path]) -> None:
    report, repo = exported
    assert sorted(p.name for p in repo.iterdir()) == [
        "inception_v3", "inception_v3_model", "inception_v3_post", "inception_v3_pre"
    ]  # fmt: skip
    assert report.spec.model.name == "inception_v3"
    assert report.spec.model.storage_uri == f"hostpath://{(repo / 'inception_v3_model').resolve()}"
    assert parse_model_config((repo / "inception_v3_model" / "config.pbtxt").read_text()).name == "inception_v3_model"
    assert "40 photographs" in report.pipeline and "top-3 labels equal" in report.pipeline
    assert (repo / "inception_v3_post" / "labels.txt").read_text() == (
        repo / "inception_v3_model" / "labels.txt"
    ).read_text()
    # The stages' cost, measured here, is what the plan sizes them from.
    assert report.spec.pipeline.images_per_cpu_second > report.profile.samples_per_cpu_second


def test_a_pipeline_that_preprocesses_otherwise_is_refused(exported: tuple[Any, Path], tmp_path: Path) -> None:
    from inferop_export.pipeline import PipelineError, check_pipeline
    from inferop_operator.plan import plan_service

    report, repo = exported
    tampered = tmp_path / "repo"
    shutil.copytree(repo, tampered)
    pre = tampered / "inception_v3_pre" / "config.pbtxt"
    config = parse_model_config(pre.read_text())
    settings = json.loads(config.parameters[PIPELINE_PARAMETER].string_value)
    config.parameters[PIPELINE_PARAMETER].string_value = json.dumps({**settings, "resizeRatio": 1.0})
    pre.write_text(to_text(config))
    pipeline = plan_service(report.spec).pipeline
    labels = (repo / "inception_v3_model" / "labels.txt").read_text().splitlines()
    with pytest.raises(PipelineError, match=r"photograph chelsea \(jpeg95x2\) is answered .* by the pipeline and"):
        check_pipeline(pipeline, tampered, tampered / "inception_v3_model", labels)

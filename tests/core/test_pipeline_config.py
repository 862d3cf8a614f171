"""The configs of an image pipeline as the one renderer writes them: the stages around the model, the ensemble that
chains them, and the models it refuses to wrap, naming why."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from inferop_core.tritonconfig import (
    ENSEMBLE_PLATFORM,
    PIPELINE_BACKEND,
    PipelineConfig,
    ServingConfig,
    TensorSpec,
    build_pipeline_configs,
    parse_model_config,
    to_text,
)
from tests.helpers import IMAGENET, image_classifier


def classifier(**changes: Any) -> ServingConfig:
    return image_classifier(**{"max_queue_size": 40, "request_timeout_microseconds": 5_000_000, **changes})


def pipeline(**changes: Any) -> PipelineConfig:
    settings = {"name": "inception_v3", "model": classifier(), "max_image_bytes": 2**21, "max_image_pixels": 10**7}
    return PipelineConfig(**{**settings, **changes})


def test_the_ensemble_chains_the_stages_around_the_model() -> None:
    configs = build_pipeline_configs(pipeline(pre_instances=3))
    assert list(configs) == ["inception_v3_model", "inception_v3_pre", "inception_v3_post", "inception_v3"]
    ensemble = configs["inception_v3"]
    assert ensemble.platform == ENSEMBLE_PLATFORM and ensemble.max_batch_size == 8
    steps = [(s.model_name, dict(s.input_map), dict(s.output_map)) for s in ensemble.ensemble_scheduling.step]
    assert steps == [
        ("inception_v3_pre", {"IMAGE": "IMAGE"}, {"PIXELS": "pixels"}),
        ("inception_v3_model", {"images": "pixels"}, {"logits": "scores"}),
        ("inception_v3_post", {"SCORES": "scores"}, {"LABELS": "LABELS", "PROBABILITIES": "PROBABILITIES"}),
    ]
    assert [(t.name, list(t.dims)) for t in ensemble.output] == [("LABELS", [5]), ("PROBABILITIES", [5])]
    for config in configs.values():  # each parses back as Triton's schema
        assert parse_model_config(to_text(config)) == config


def test_the_stages_run_the_declared_preprocessing_under_the_models_queue_bound() -> None:
    configs = build_pipeline_configs(pipeline(pre_instances=3, top_k=3))
    pre, post = configs["inception_v3_pre"], configs["inception_v3_post"]
    assert (pre.backend, pre.instance_group[0].count, post.instance_group[0].count) == (PIPELINE_BACKEND, 3, 1)
    assert [(t.name, list(t.dims)) for t in pre.output] == [("PIXELS", [3, 299, 299])]
    settings = json.loads(pre.parameters["inferop_pipeline"].string_value)
    assert settings == {
        "size": 299,
        "resizeRatio": 342 / 299,
        "mean": IMAGENET.mean,
        "std": IMAGENET.std,
        "maxImageBytes": 2**21,
        "maxImagePixels": 10**7,
    }
    assert json.loads(post.parameters["inferop_pipeline"].string_value) == {"topK": 3, "labelsFile": "labels.txt"}
    for stage in (pre, post):
        policy = stage.dynamic_batching.default_queue_policy
        assert (policy.max_queue_size, policy.default_timeout_microseconds) == (40, 5_000_000)


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"model": classifier(processing=None)}, "needs processing kind imageClassification (none)"),
        (
            {"model": classifier(inputs=(TensorSpec(name="images", dims=(299, 299, 3)),))},
            "one input of 3 x N x N, not [('images', [299, 299, 3])]",
        ),
        (
            {"model": classifier(outputs=(TensorSpec(name="logits", dims=(1000,)),))},
            "one score a class, with labels (logits [1000], labels None)",
        ),
        ({"top_k": 1001}, "topK 1001: the model has 1000 classes"),
        ({"model": classifier(name="inception_v3")}, "is named 'inception_v3_model'"),
    ],
    ids=["no processing", "channels last", "no labels", "top k", "model name"],
)
def test_a_model_the_pipeline_cannot_wrap_is_refused_by_name(changes: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        pipeline(**changes)

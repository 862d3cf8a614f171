"""Translate an ONNX Runtime model repository into one the python backend serves, setting for setting.

This is the only place local serving differs from a Triton container: the platform becomes our python
model (model.py with ONNX Runtime), and a pipeline's stages, which the image's python-based backend
inferop_pipeline runs, get its model.py (pipeline.py) in their version directory; every other field of
config.pbtxt is carried over untouched, so what is tested locally is the config the operator deploys.
An ensemble is served as it is.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from inferop.serving.gpu import local_gpu
from inferop_core.errors import InferopError
from inferop_core.tritonconfig import (
    ENSEMBLE_PLATFORM,
    MODEL_FILENAME,
    ONNX_PLATFORM,
    PIPELINE_BACKEND,
    STAGE_STUB,
    STAGE_STUB_SCRIPT,
    PipelineConfig,
    ServingConfig,
    build_pipeline_configs,
    mc,
    parse_model_config,
    render_model_config,
    to_text,
)

PYTHON_MODEL = Path(__file__).with_name("model.py")
PIPELINE_MODEL = Path(__file__).with_name("pipeline.py")


class RepositoryError(InferopError, ValueError):
    """The model repository is missing or malformed; the message names the path."""


def to_python_backend(config: mc.ModelConfig, gpu: bool = False) -> mc.ModelConfig:
    """The same config served by our model.py: only the platform changes, and without a local `gpu` the instance
    kind (a GPU instance group becomes a CPU one of the same count). With one, GPU groups stay on it and model.py
    runs them with ONNX Runtime's CUDA provider under the config's gpu_mem_limit and arena_extend_strategy. A
    pipeline's stage changes its backend only; an ensemble nothing."""
    local = mc.ModelConfig()
    local.CopyFrom(config)
    if served_as(config) == "ensemble":
        return local
    if served_as(config) == "stage":
        local.backend = "python"
        return local
    local.ClearField("platform")
    local.backend = "python"
    for group in local.instance_group:
        if group.kind == mc.ModelInstanceGroup.KIND_GPU and not gpu:
            group.kind = mc.ModelInstanceGroup.KIND_CPU
            group.ClearField("gpus")
    return local


def served_as(config: mc.ModelConfig) -> str:
    """What serves a config here: "onnx" (our model.py), "stage" (pipeline.py) or "ensemble" (Triton itself)."""
    if config.platform == ENSEMBLE_PLATFORM:
        return "ensemble"
    if config.backend == PIPELINE_BACKEND:
        return "stage"
    if config.platform not in ("", ONNX_PLATFORM) or config.backend not in ("", "onnxruntime"):
        raise RepositoryError(
            f"model {config.name!r}: only ONNX models, ensembles and inferop's pipelines can be served locally "
            f"(platform {config.platform!r}, backend {config.backend!r})"
        )
    return "onnx"


def model_dirs(repo: Path) -> list[Path]:
    """Model directories of `repo`, each checked to hold a parseable config and a version directory (an ONNX model:
    with its model.onnx)."""
    if not repo.is_dir():
        raise RepositoryError(f"model repository {repo} does not exist (run `inferop export` first)")
    models = sorted(p for p in repo.iterdir() if (p / "config.pbtxt").is_file())
    if not models:
        raise RepositoryError(f"model repository {repo} holds no model (no <model>/config.pbtxt)")
    for model in models:
        try:
            config = parse_model_config((model / "config.pbtxt").read_text())
        except Exception as error:  # text_format.ParseError names line and field
            raise RepositoryError(f"{model / 'config.pbtxt'}: {error}") from error
        versions = [version for version in model.iterdir() if version.name.isdigit() and version.is_dir()]
        if served_as(config) != "onnx" and not versions:
            raise RepositoryError(f"model {model.name}: no version directory (e.g. 1/) under {model}")
        if served_as(config) == "onnx" and not any((version / MODEL_FILENAME).is_file() for version in versions):
            raise RepositoryError(f"model {model.name}: no <version>/{MODEL_FILENAME} under {model}")
    return models


def prepare_local_repo(repo: Path, target: Path, gpu: bool | None = None) -> Path:
    """Lay out `target` as a python-backend twin of `repo`: translated configs, our model.py beside a
    link to each model.onnx, and the other files (labels) linked unchanged. The source is never written.
    `gpu`: whether GPU instance groups stay on the GPU (default: `local_gpu()`)."""
    models = model_dirs(repo)
    if gpu is None:
        gpu = local_gpu()
    if target.exists():
        shutil.rmtree(target)
    for model in models:
        out = target / model.name
        out.mkdir(parents=True)
        original = parse_model_config((model / "config.pbtxt").read_text())
        kind, config = served_as(original), to_python_backend(original, gpu)
        config.name = model.name
        (out / "config.pbtxt").write_text(to_text(config))
        for entry in model.iterdir():
            if entry.name == "config.pbtxt":
                continue
            if entry.is_dir() and entry.name.isdigit():
                version = out / entry.name
                version.mkdir()
                if kind == "onnx":
                    (version / MODEL_FILENAME).symlink_to((entry / MODEL_FILENAME).resolve())
                if kind != "ensemble":
                    shutil.copy(PYTHON_MODEL if kind == "onnx" else PIPELINE_MODEL, version / "model.py")
            else:
                (out / entry.name).symlink_to(entry.resolve())
    return target


def write_model_repo(serving: ServingConfig, source: Path, target: Path) -> Path:
    """A repository at `target` serving the exported model in `source` (`<model>/` with `1/model.onnx` and
    its label files, all linked, never copied) under another config: how drills and tests try settings."""
    model_dir = target / serving.name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(render_model_config(serving))
    (model_dir / "1" / MODEL_FILENAME).symlink_to((source / "1" / MODEL_FILENAME).resolve())
    for extra in source.iterdir():
        if extra.is_file() and extra.name != "config.pbtxt":
            (model_dir / extra.name).symlink_to(extra.resolve())
    return target


def write_pipeline_repo(pipeline: PipelineConfig, source: Path, target: Path) -> Path:
    """A repository at `target` serving the exported image classifier in `source` behind its pipeline: callers send
    image bytes to the ensemble `pipeline.name`, which runs the stages around the model (its files linked, as
    `write_model_repo` does). Every config is the renderer's (build_pipeline_configs)."""
    write_model_repo(pipeline.model, source, target)
    write_pipeline_members(pipeline, target, source / str(pipeline.stage_settings("post")["labelsFile"]), link=True)
    return target


def write_pipeline_members(pipeline: PipelineConfig, target: Path, labels: Path, link: bool) -> dict[str, Path]:
    """The stages' and the ensemble's directories under `target`, by model name: each its config and an empty
    version directory (the image's python-based backend holds the stages' code), each stage its stub (STAGE_STUB:
    one thread in every math library), `post` the model's `labels` (linked, or copied where the repository must
    stand on its own)."""
    written = {}
    for name, config in build_pipeline_configs(pipeline).items():
        if name == pipeline.model.name:
            continue
        member = target / name
        (member / "1").mkdir(parents=True)
        (member / "config.pbtxt").write_text(to_text(config))
        if config.backend == PIPELINE_BACKEND:
            (member / STAGE_STUB).write_text(STAGE_STUB_SCRIPT)
            (member / STAGE_STUB).chmod(0o755)
        if name == pipeline.members["post"]:
            if link:
                (member / labels.name).symlink_to(labels.resolve())
            else:
                shutil.copyfile(labels, member / labels.name)
        written[name] = member
    return written

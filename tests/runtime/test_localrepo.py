"""Local serving's repository translation: only the platform and the instance kind change, the source is
never written, and a broken repository is reported with its path."""

from __future__ import annotations

import difflib
import re
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2 as mc

from inferop.serving.localrepo import (
    PYTHON_MODEL,
    RepositoryError,
    model_dirs,
    prepare_local_repo,
    to_python_backend,
)
from inferop_core.tritonconfig import (
    ServingConfig,
    TensorSpec,
    build_model_config,
    parse_model_config,
    render_model_config,
    to_text,
)

IMAGES = TensorSpec(name="images", dims=(3, 299, 299))
LOGITS = TensorSpec(name="logits", dims=(1000,), label_filename="labels.txt")
BOARD = TensorSpec(name="board", dims=(1, 6, 5))
VALUE = TensorSpec(name="value", dims=(1,))


def serving(device: str = "cpu", instances: int = 1, name: str = "inception_v3") -> ServingConfig:
    return ServingConfig(
        name=name,
        inputs=(IMAGES,),
        outputs=(LOGITS,),
        device=device,
        instances=instances,
        max_batch_size=16,
        max_queue_delay_microseconds=500,
        intra_op_threads=3,
    )


def changed_lines(before: str, after: str) -> tuple[list[str], list[str]]:
    """Lines only in `before`, lines only in `after`."""
    diff = list(difflib.ndiff(before.splitlines(), after.splitlines()))
    return [d[2:] for d in diff if d.startswith("- ")], [d[2:] for d in diff if d.startswith("+ ")]


class TestToPythonBackend:
    @pytest.mark.parametrize("instances", [1, 3])
    def test_cpu_model_changes_only_its_platform(self, instances: int) -> None:
        config = build_model_config(serving("cpu", instances))
        removed, added = changed_lines(to_text(config), to_text(to_python_backend(config)))
        assert removed == ['platform: "onnxruntime_onnx"']
        assert added == ['backend: "python"']

    @pytest.mark.parametrize("instances", [1, 4])
    def test_gpu_instances_become_as_many_cpu_instances(self, instances: int) -> None:
        config = build_model_config(serving("gpu", instances))
        local = to_python_backend(config)
        removed, added = changed_lines(to_text(config), to_text(local))
        assert sorted(removed) == ["  kind: KIND_GPU", 'platform: "onnxruntime_onnx"']
        assert sorted(added) == ["  kind: KIND_CPU", 'backend: "python"']
        assert [g.count for g in local.instance_group] == [instances]

    def test_with_a_local_gpu_gpu_instances_stay_on_it(self) -> None:
        config = build_model_config(serving("gpu", 2))
        local = to_python_backend(config, gpu=True)
        removed, added = changed_lines(to_text(config), to_text(local))
        assert removed == ['platform: "onnxruntime_onnx"'] and added == ['backend: "python"']

    def test_the_input_config_is_not_modified(self) -> None:
        config = build_model_config(serving("gpu"))
        text = to_text(config)
        to_python_backend(config)
        assert to_text(config) == text

    @pytest.mark.parametrize(
        ("field", "value"),
        [("platform", "tensorrt_plan"), ("platform", "pytorch_libtorch"), ("backend", "python")],
    )
    def test_refuses_models_that_are_not_onnx(self, field: str, value: str) -> None:
        config = build_model_config(serving())
        config.ClearField("platform")
        setattr(config, field, value)
        with pytest.raises(RepositoryError, match=rf"model 'inception_v3': only ONNX models.*{value}"):
            to_python_backend(config)


def write_model(repo: Path, cfg: ServingConfig, labels: bool = True) -> Path:
    """A model directory as `inferop export` lays it out (the ONNX bytes do not matter here)."""
    model = repo / cfg.name
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.onnx").write_bytes(b"onnx bytes of " + cfg.name.encode())
    (model / "config.pbtxt").write_text(render_model_config(cfg))
    if labels:
        (model / "labels.txt").write_text("tench\ngoldfish\n")
    return model


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.fixture
def source_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "model_repo"
    write_model(repo, serving("gpu", instances=2))
    write_model(repo, ServingConfig(name="conv_net", inputs=(BOARD,), outputs=(VALUE,)), labels=False)
    (repo / "README").write_text("not a model\n")  # ignored: no config.pbtxt
    return repo


class TestPrepareLocalRepo:
    def test_lays_out_python_backend_models(self, source_repo: Path, tmp_path: Path) -> None:
        target = prepare_local_repo(source_repo, tmp_path / "local")
        assert sorted(p.name for p in target.iterdir()) == ["conv_net", "inception_v3"]
        for name in ("conv_net", "inception_v3"):
            version = target / name / "1"
            assert (version / "model.py").read_text() == PYTHON_MODEL.read_text()
            assert (version / "model.onnx").is_symlink()
            assert (version / "model.onnx").resolve() == (source_repo / name / "1" / "model.onnx").resolve()
        labels = target / "inception_v3" / "labels.txt"
        assert labels.is_symlink() and labels.read_text() == "tench\ngoldfish\n"
        assert not (target / "conv_net" / "labels.txt").exists()

    def test_configs_are_the_translated_source_configs(self, source_repo: Path, tmp_path: Path) -> None:
        target = prepare_local_repo(source_repo, tmp_path / "local")
        for name in ("conv_net", "inception_v3"):
            source = parse_model_config((source_repo / name / "config.pbtxt").read_text())
            local = parse_model_config((target / name / "config.pbtxt").read_text())
            assert local == to_python_backend(source)
            assert local.backend == "python"
            assert all(g.kind == mc.ModelInstanceGroup.KIND_CPU for g in local.instance_group)

    def test_never_writes_the_source(self, source_repo: Path, tmp_path: Path) -> None:
        before = snapshot(source_repo)
        prepare_local_repo(source_repo, tmp_path / "local")
        prepare_local_repo(source_repo, tmp_path / "local")
        assert snapshot(source_repo) == before

    def test_replaces_a_stale_target(self, source_repo: Path, tmp_path: Path) -> None:
        stale = tmp_path / "local" / "removed_model"
        stale.mkdir(parents=True)
        (stale / "config.pbtxt").write_text('name: "removed_model"\n')
        target = prepare_local_repo(source_repo, tmp_path / "local")
        assert sorted(p.name for p in target.iterdir()) == ["conv_net", "inception_v3"]

    def test_the_directory_name_is_the_model_name(self, tmp_path: Path) -> None:
        repo = tmp_path / "repo"
        model = write_model(repo, serving(name="inception_v3"))
        model.rename(repo / "renamed")
        target = prepare_local_repo(repo, tmp_path / "local")
        assert 'name: "renamed"' in (target / "renamed" / "config.pbtxt").read_text()


class TestModelDirs:
    def test_lists_only_model_directories(self, source_repo: Path) -> None:
        assert [p.name for p in model_dirs(source_repo)] == ["conv_net", "inception_v3"]

    def test_missing_repository_names_the_path(self, tmp_path: Path) -> None:
        missing = tmp_path / "nowhere"
        with pytest.raises(RepositoryError, match=re.escape(f"{missing} does not exist")):
            model_dirs(missing)

    def test_empty_repository_names_the_path(self, tmp_path: Path) -> None:
        (tmp_path / "empty" / "not_a_model").mkdir(parents=True)
        with pytest.raises(RepositoryError, match=re.escape(f"{tmp_path / 'empty'} holds no model")):
            model_dirs(tmp_path / "empty")

    def test_unparseable_config_names_the_file_and_the_field(self, source_repo: Path) -> None:
        config = source_repo / "conv_net" / "config.pbtxt"
        config.write_text(config.read_text().replace("max_batch_size", "max_batch_sise"))
        with pytest.raises(RepositoryError) as error:
            model_dirs(source_repo)
        assert str(config) in str(error.value)
        assert "max_batch_sise" in str(error.value)

    def test_model_without_onnx_file_names_the_model(self, source_repo: Path) -> None:
        (source_repo / "conv_net" / "1" / "model.onnx").unlink()
        with pytest.raises(
            RepositoryError, match=re.escape(f"model conv_net: no <version>/model.onnx under {source_repo}")
        ):
            model_dirs(source_repo)

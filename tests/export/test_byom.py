"""Bring your own model: a user's ONNX file or PyTorch module goes from the command line to a served, called
model, with the same verification as the built-in networks; what cannot be served is refused, naming why."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from inferop_core.cli import main as inferop
from inferop_core.tritonconfig import parse_model_config
from inferop_operator.plan import plan_service
from inferop_operator.spec import parse_spec
from tests import user_models
from tests.helpers import serving

pytest.importorskip("torch", reason="install the export distribution: make install")

RANKER = ["torch", "ranker:build", "--app-dir", str(user_models.EXAMPLES)]
RANKER_INPUTS = ["--input", "features=16", "--input", "category=1:INT64", "--output", "score"]


@dataclass(frozen=True)
class Exported:
    code: int
    report: dict[str, Any]
    stderr: str
    repo: Path

    def config(self, name: str) -> Any:
        return parse_model_config((self.repo / name / "config.pbtxt").read_text())


def type_name(tensor: Any) -> str:
    from tritonclient.grpc import model_config_pb2 as mc

    return str(mc.DataType.Name(tensor.data_type))


def export(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> Exported:
    """`inferop export … --json` as a user runs it, in this process."""
    code = inferop(["export", *args, "--repo", str(repo), "--json"])
    out, err = capsys.readouterr()
    return Exported(code, json.loads(out) if code == 0 else {}, err, repo)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("user-models")
    user_models.two_inputs_with_int64(folder / "two_inputs.onnx")
    user_models.fixed_batch_of_one(folder / "fixed.onnx")
    user_models.dynamic_output_dim(folder / "dynamic_output.onnx")
    user_models.dynamic_input_dim(folder / "dynamic_input.onnx")
    user_models.opset_from_the_future(folder / "future.onnx")
    return folder


class TestExportOnnx:
    def test_two_inputs_one_of_them_int64(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path
    ) -> None:
        result = export(capsys, tmp_path, "onnx", str(sources / "two_inputs.onnx"))
        assert result.code == 0, result.stderr
        config = result.config("two_inputs")
        assert [(i.name, list(i.dims)) for i in config.input] == [("features", [4]), ("ids", [2])]
        assert [type_name(i) for i in config.input] == ["TYPE_FP32", "TYPE_INT64"]  # read from the file
        assert config.max_batch_size == 8
        # ONNX Runtime checked against ONNX's reference implementation at both batch sizes.
        assert result.report["parityAgainst"] == "ONNX reference"
        assert sorted({p["batch"] for p in result.report["parity"]}) == [1, 8]
        assert result.report["serving"]["weights"].startswith("two_inputs.onnx, sha256 ")

    def test_a_file_too_large_for_the_reference_is_exported_unchecked(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Above the reference implementation's budget nothing is compared, and the export says so (it failed with
        "zip() argument 2 is shorter than argument 1" until that path skipped the comparison)."""
        from inferop_export import exporter

        monkeypatch.setattr(exporter, "REFERENCE_MAX_MACS", 1)  # the small file counts as too large
        result = export(capsys, tmp_path, "onnx", str(sources / "two_inputs.onnx"))
        assert result.code == 0, result.stderr
        assert result.report["parityAgainst"].startswith("no source to compare with: a user's ONNX file, too large")
        assert result.report["parity"] == []

    def test_a_fixed_batch_of_one_is_served_without_a_batch_axis(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path
    ) -> None:
        result = export(capsys, tmp_path, "onnx", str(sources / "fixed.onnx"))
        assert result.code == 0, result.stderr
        config = result.config("fixed")
        assert config.max_batch_size == 0
        assert list(config.input[0].dims) == [1, 2, 4, 4]  # the full shape
        assert any("no batch axis" in note and "max_batch_size 0" in note for note in result.report["notes"])

    def test_an_output_whose_width_varies(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path
    ) -> None:
        result = export(capsys, tmp_path, "onnx", str(sources / "dynamic_output.onnx"))
        assert result.code == 0, result.stderr
        assert list(result.config("dynamic_output").output[0].dims) == [-1]
        # The memory estimate takes the bytes measured at export, since the dims cannot tell them.
        assert result.report["profile"]["io_bytes_per_sample"] > 0

    def test_a_dynamic_input_dim_needs_an_override(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path
    ) -> None:
        refused = export(capsys, tmp_path, "onnx", str(sources / "dynamic_input.onnx"))
        assert refused.code == 2
        assert "input 'tokens' has dynamic dims [1]" in refused.stderr
        assert "--input tokens=<dims>" in refused.stderr
        fixed = export(capsys, tmp_path, "onnx", str(sources / "dynamic_input.onnx"), "--input", "tokens=12")
        assert fixed.code == 0, fixed.stderr
        assert list(fixed.config("dynamic_input").input[0].dims) == [12]

    @pytest.mark.parametrize(
        ("flag", "message"),
        [
            ("tokens=12,3", "--input tokens: 2 dims given, the model's input has 1"),
            ("words=12", "--input ['words']: no such input; the model's inputs are ['tokens']"),
            ("tokens=twelve", "--input 'tokens=twelve': expected name=dims[:dtype]"),
        ],
    )
    def test_a_wrong_override_names_the_flag(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path, flag: str, message: str
    ) -> None:
        result = export(capsys, tmp_path, "onnx", str(sources / "dynamic_input.onnx"), "--input", flag)
        assert result.code == 2
        assert message in result.stderr

    def test_an_opset_onnx_runtime_cannot_load_is_refused(
        self, capsys: pytest.CaptureFixture[str], sources: Path, tmp_path: Path
    ) -> None:
        result = export(capsys, tmp_path, "onnx", str(sources / "future.onnx"))
        assert result.code == 1
        assert "cannot load opset 40" in result.stderr
        assert "Traceback" not in result.stderr

    def test_a_file_that_is_not_onnx_names_the_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        bogus = tmp_path / "notes.onnx"
        bogus.write_text("not a model")
        result = export(capsys, tmp_path / "repo", "onnx", str(bogus))
        assert result.code == 2
        assert f"{bogus}: not a readable ONNX model" in result.stderr


class TestExportTorch:
    def test_a_factory_with_two_inputs(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        result = export(capsys, tmp_path, *RANKER, *RANKER_INPUTS)
        assert result.code == 0, result.stderr
        config = result.config("ranker")
        assert [(i.name, list(i.dims), type_name(i)) for i in config.input] == [
            ("features", [16], "TYPE_FP32"),
            ("category", [1], "TYPE_INT64"),
        ]
        assert [(o.name, list(o.dims)) for o in config.output] == [("score", [1])]  # read from the exported file
        assert result.report["parityAgainst"] == "PyTorch"
        assert max(p["maxAbsDiff"] for p in result.report["parity"]) <= result.report["tolerance"]
        assert result.report["serving"]["weights"] == "module ranker:build"

    @pytest.mark.parametrize(
        ("args", "message"),
        [
            (["torch", "ranker", "--input", "x=1"], "'ranker': expected package.module:factory"),
            (["torch", "no_such_module:build", "--input", "x=1"], "no_such_module:build: cannot import no_such_module"),
            (["torch", "ranker:nothing", *RANKER[2:], "--input", "x=1"], "ranker has no attribute 'nothing'"),
            ([*RANKER, "--input", "features=16"], "forward takes ['features', 'category'], but 1 --input flag(s)"),
            ([*RANKER, "--input", "features=16", "--input", "category=1:COMPLEX"], "dtype COMPLEX is not one of"),
        ],
        ids=["no factory", "no module", "no attribute", "too few inputs", "unknown dtype"],
    )
    def test_errors_name_the_target_or_flag(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, args: list[str], message: str
    ) -> None:
        result = export(capsys, tmp_path, *args)
        assert result.code == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def served_repo(tmp_path_factory: pytest.TempPathFactory, sources: Path) -> Path:
    """Every kind of user model in one repository, with a manifest each."""
    repo = tmp_path_factory.mktemp("byom-repo")
    exports = [
        ["onnx", str(sources / "two_inputs.onnx")],
        ["onnx", str(sources / "fixed.onnx")],
        ["onnx", str(sources / "dynamic_output.onnx")],
        [*RANKER, *RANKER_INPUTS],
    ]
    for args in exports:
        manifest = repo.parent / f"{Path(args[1]).stem.split(':')[0]}.yaml"
        assert inferop(["export", *args, "--repo", str(repo), "--manifest", str(manifest), "--json"]) == 0
    return repo


@pytest.fixture(scope="module")
def server(served_repo: Path) -> Iterator[str]:
    with serving(served_repo) as url:
        yield url


def onnxruntime_outputs(repo: Path, model: str, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(repo / model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return list(session.run(None, feeds))


@pytest.mark.integration
class TestServedAndCalled:
    def test_every_manifest_is_accepted_by_the_operator(self, served_repo: Path) -> None:
        for path in sorted(served_repo.parent.glob("*.yaml")):
            manifest = yaml.safe_load(path.read_text())
            plan = plan_service(parse_spec(manifest["spec"]))
            assert plan.memory.fits, path.name
            assert plan.warnings == [], path.name

    def test_two_inputs_from_files_answer_what_onnx_runtime_computes(
        self, capsys: pytest.CaptureFixture[str], served_repo: Path, server: str, tmp_path: Path
    ) -> None:
        features = np.arange(4, dtype=np.float32)[None]
        ids = np.array([[1, 4]], dtype=np.int64)
        np.save(tmp_path / "features.npy", features)
        np.save(tmp_path / "ids.npy", ids[0])  # one sample without its batch axis works too
        files = ["--input", f"features={tmp_path / 'features.npy'}", "--input", f"ids={tmp_path / 'ids.npy'}"]
        code = inferop(["infer", "--url", server, "--model", "two_inputs", "--json", *files])
        out, err = capsys.readouterr()
        assert code == 0, err
        answer = json.loads(out)
        (expected,) = onnxruntime_outputs(served_repo, "two_inputs", {"features": features, "ids": ids})
        np.testing.assert_allclose(answer["outputs"]["score"]["values"], expected.ravel(), rtol=1e-5)
        assert answer["outputs"]["score"]["shape"] == [1, 3]

    @pytest.mark.parametrize(
        ("model", "shape"), [("fixed", [1, 3, 4, 4]), ("dynamic_output", [1, 1]), ("ranker", [1, 1])]
    )
    def test_generated_inputs_get_an_answer(
        self, capsys: pytest.CaptureFixture[str], server: str, model: str, shape: list[int]
    ) -> None:
        code = inferop(["infer", "--url", server, "--model", model, "--json"])
        out, err = capsys.readouterr()
        assert code == 0, err
        (output,) = json.loads(out)["outputs"].values()
        assert output["shape"][0] == 1 and len(output["shape"]) == len(shape)

    def test_a_wrong_input_file_names_the_input(
        self, capsys: pytest.CaptureFixture[str], server: str, tmp_path: Path
    ) -> None:
        np.save(tmp_path / "ids.npy", np.zeros((1, 2), dtype=np.float32))
        code = inferop(["infer", "--url", server, "--model", "two_inputs", "--input", f"ids={tmp_path / 'ids.npy'}"])
        assert code == 1
        assert "--input ids=" in capsys.readouterr().err

"""int8 for a model a user brings: calibrated and gated on the user's own samples, shown on a classifier trained
here on a task with real margins (as an ONNX file and as a torch module), refused with numbers where the samples
do not fit or the gate cannot be met, and served."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import yaml

from inferop_core.cli import main as inferop
from tests.helpers import serving

pytest.importorskip("torch", reason="install the export distribution: make install")

from inferop_devtools.trained import INPUT, Task, damaged, samples, write_task
from inferop_export.precision import compute_nodes


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    return write_task(tmp_path_factory.mktemp("classifier"))


def export(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """`inferop export … --json` as a user runs it: its exit code, report and stderr."""
    code = inferop(["export", *args, "--repo", str(repo), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


@pytest.fixture(scope="module")
def fp32_file(task: Task, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The trained module as an ONNX file, as a user who exported it themselves brings it."""
    repo = tmp_path_factory.mktemp("fp32")
    args = task.export_args
    fp32_args = args[: args.index("--precision")]
    assert inferop(["export", *fp32_args, "--repo", str(repo), "--json"]) == 0
    return repo / "classifier" / "1" / "model.onnx"


def with_sets(task: Task, calibration: Path | None = None, validation: Path | None = None) -> list[str]:
    return [
        "--precision", "int8",
        "--calibration", str(calibration or task.calibration), "--validation", str(validation or task.validation),
    ]  # fmt: skip


class TestATrainedClassifier:
    def test_as_a_torch_module_it_passes_on_its_own_data_with_its_accuracy_stated(
        self, capsys: pytest.CaptureFixture[str], task: Task, tmp_path: Path
    ) -> None:
        code, report, err = export(capsys, tmp_path, *task.export_args, "--manifest", str(tmp_path / "isvc.yaml"))
        assert code == 0, err
        # Its manifest says it is int8, so the operator places it where int8 pays (model.int8Nodes).
        model = yaml.safe_load((tmp_path / "isvc.yaml").read_text())["spec"]["model"]
        assert model["precision"] == "int8"
        # Its validation set goes with it, for a rollout's agreement check to send first.
        recorded = Path(report["modelPath"]).parents[1] / "validation.npz"
        assert model["validation"]["samples"] == 1000 and model["validation"]["sizeBytes"] == recorded.stat().st_size
        gate = report["gate"]
        assert gate["passed"] and gate["samples"] == 1000
        accuracy = gate["accuracy"]
        # Trained: well above the 10% of chance, below 100% (the noise makes some images ambiguous).
        assert 0.9 <= accuracy["fp32"] < 1.0
        assert accuracy["fp32"] - accuracy["int8"] <= 0.01
        assert gate["agreement"]["logits"] >= 0.99
        assert "accuracy fp32" in gate["summary"]
        assert report["precision"] == "int8" and report["speedVerdict"]

    def test_as_an_onnx_file_it_passes_too(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path
    ) -> None:
        code, report, err = export(capsys, tmp_path, "onnx", str(fp32_file), "--name", "mine", *with_sets(task))
        assert code == 0, err
        assert report["gate"]["passed"] and report["gate"]["accuracy"]["int8"] >= 0.9

    def test_without_labels_each_sample_s_logits_keep_their_direction(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path
    ) -> None:
        unlabelled = tmp_path / "unlabelled.npz"
        np.savez(unlabelled, **{INPUT: samples(400, 5)[0]})
        args = ["onnx", str(fp32_file), *with_sets(task, validation=unlabelled)]
        code, report, err = export(capsys, tmp_path / "passes", *args)
        assert code == 0, err
        assert report["gate"]["cosine"]["logits"] >= 0.98 and report["gate"]["accuracy"] is None

        # A gate tighter than every node in int8 can meet: refused with the numbers, nothing written.
        tight = ["--gate", "min-cosine=0.9999"]
        code, _, err = export(capsys, tmp_path / "refused", *args, *tight, "--no-fallback")
        assert code == 1
        assert "int8 fails its accuracy gate (logits: cosine similarity 0.9" in err and "< 0.9999" in err
        assert not (tmp_path / "refused" / "classifier").exists()
        # With the fallback, nodes left in fp32 meet it, and the report names them.
        code, report, err = export(capsys, tmp_path / "fallback", *args, *tight)
        assert code == 0, err
        assert report["fp32Nodes"] and report["gate"]["cosine"]["logits"] >= 0.9999
        assert not report["attempts"][0]["passed"]

    def test_a_gate_on_accuracy_is_refused_with_both_accuracies(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path
    ) -> None:
        # Agreement this high needs 3 / (1 - 0.999) samples: the 1,000 given are refused before any work.
        code, _, err = export(capsys, tmp_path, "onnx", str(fp32_file), *with_sets(task), "--gate", "agreement=0.999")
        assert code == 2
        assert f"--validation {task.validation}: 1000 samples; a gate on 99.9% agreement needs at least 3000" in err


class TestTheUsersSamplesAreChecked:
    @pytest.mark.parametrize(
        ("arrays", "message"),
        [
            ({"pixels": np.zeros((300, 1, 8, 8), np.float32)}, "holds ['pixels'], which the model does not take"),
            ({INPUT: np.zeros((300, 1, 8, 8), np.float64)}, "input 'images' is float64 [300, 1, 8, 8]; the model "
             "takes float32 ['n', 1, 8, 8]"),
            ({INPUT: np.zeros((300, 8, 8), np.float32)}, "input 'images' is float32 [300, 8, 8]"),
            ({INPUT: np.zeros((300, 1, 8, 8), np.float32), "labels": np.full(300, 10)},
             "label 10 is not a class of output 'logits', which has 10 (0..9)"),
            ({INPUT: np.zeros((300, 1, 8, 8), np.float32), "labels": np.zeros(299, np.int64)},
             "the arrays hold different numbers of samples: {'images': 300, 'labels': 299}"),
            ({INPUT: np.zeros((299, 1, 8, 8), np.float32)}, "299 samples; a gate on 99.0% agreement needs at least "
             "300"),
        ],
    )  # fmt: skip
    def test_a_validation_set_that_does_not_fit_names_the_tensor(
        self,
        capsys: pytest.CaptureFixture[str],
        task: Task,
        fp32_file: Path,
        tmp_path: Path,
        arrays: dict[str, np.ndarray],
        message: str,
    ) -> None:
        validation = tmp_path / "validation.npz"
        np.savez(validation, **arrays)
        code, _, err = export(capsys, tmp_path / "repo", "onnx", str(fp32_file), *with_sets(task, None, validation))
        assert code == 2 and f"--validation {validation}: " in err and message in err, err
        assert not (tmp_path / "repo").exists()

    def test_a_directory_of_npy_files_is_a_set(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path
    ) -> None:
        images, labels = samples(300, 6)
        (tmp_path / "validation").mkdir()
        np.save(tmp_path / "validation" / f"{INPUT}.npy", images)
        np.save(tmp_path / "validation" / "labels.npy", labels)
        args = ["onnx", str(fp32_file), *with_sets(task, validation=tmp_path / "validation")]
        code, report, err = export(capsys, tmp_path / "repo", *args)
        assert code == 0, err
        assert report["gate"]["samples"] == 300 and report["gate"]["accuracy"] is not None

    @pytest.mark.parametrize(
        ("flags", "message"),
        [
            (["--precision", "int8"], "mine is calibrated and gated on your own samples: give --calibration PATH and "
             "--validation PATH"),
            (["--precision", "int8", "--calibration", "x.npz"], "give both --calibration and --validation"),
            (["--calibration", "x.npz", "--validation", "y.npz"], "are for a reduced --precision (int8)"),
            (["--precision", "int8", "--calibration", "x.npz", "--validation", "y.npz", "--gate", "cosine=0.9"],
             "--gate 'cosine=0.9': expected key=value, one of top1"),
            (["--precision", "int8", "--calibration", "x.npz", "--validation", "y.npz", "--gate", "agreement=2"],
             "--gate 'agreement=2': agreement must be in (0, 1)"),
        ],
    )  # fmt: skip
    def test_a_user_s_model_is_never_calibrated_on_noise(
        self, capsys: pytest.CaptureFixture[str], fp32_file: Path, tmp_path: Path, flags: list[str], message: str
    ) -> None:
        code, _, err = export(capsys, tmp_path, "onnx", str(fp32_file), "--name", "mine", *flags)
        assert code == 2 and message in err, err

    def test_a_missing_file_is_named(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path
    ) -> None:
        missing = tmp_path / "nowhere.npz"
        code, _, err = export(capsys, tmp_path, "onnx", str(fp32_file), *with_sets(task, calibration=missing))
        assert code == 2 and f"--calibration {missing}: no such file or directory" in err


@pytest.fixture(scope="module")
def int8_repo(task: Task, tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("int8-repo")
    assert inferop(["export", *task.export_args, "--repo", str(repo), "--json"]) == 0
    return repo


@pytest.fixture(scope="module")
def server(int8_repo: Path) -> Iterator[str]:
    with serving(int8_repo) as url:
        yield url


@pytest.mark.integration
def test_the_int8_classifier_is_served_and_answers_as_its_file_does(
    capsys: pytest.CaptureFixture[str], int8_repo: Path, server: str, tmp_path: Path
) -> None:
    import onnxruntime as ort

    images = samples(1, 11)[0]  # one image: its ten logits are printed whole
    np.save(tmp_path / "images.npy", images)
    code = inferop(
        ["infer", "--url", server, "--model", "classifier", "--json", "--input", f"{INPUT}={tmp_path}/images.npy"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    served = np.array(json.loads(out)["outputs"]["logits"]["values"]).reshape(1, 10)
    session = ort.InferenceSession(
        str(int8_repo / "classifier" / "1" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    (expected,) = session.run(None, {INPUT: images})
    np.testing.assert_allclose(served, expected, rtol=1e-4, atol=1e-4)


class TestALayerInt8CannotHold:
    """The trained classifier with one layer whose weights int8 cannot hold (`damaged`): every compute node in
    int8 is refused, and export leaves that layer, found by its measured noise, in fp32 and the rest in int8."""

    @pytest.mark.parametrize(("layer", "index"), [("linear", 2), ("conv", 1)])
    def test_the_layer_stays_fp32_and_the_gate_passes(
        self, capsys: pytest.CaptureFixture[str], task: Task, fp32_file: Path, tmp_path: Path, layer: str, index: int
    ) -> None:
        node = compute_nodes(onnx.load(fp32_file))[index]  # the convolutions and the linear layer, in order
        weights = damaged(task.weights, tmp_path / f"{layer}.pth", layer)
        args = [*task.export_args, "--weights", str(weights)]  # the last --weights wins
        code, report, err = export(capsys, tmp_path / "repo", *args)
        assert code == 0, err
        first, served = report["attempts"][0], report["attempts"][-1]
        assert not first["passed"] and "top-1 agreement" in first["summary"]  # every node int8: near chance
        assert served["passed"] and node in report["fp32Nodes"]
        assert report["attempts"][1]["fp32Nodes"] == [node]  # the first measure of the noise picks the layer
        # The measured noise finds the layer first: only the linear layer stays fp32 where it is the damaged one; a
        # convolution's neighbour follows it once the first attempt shows it is not enough.
        assert report["fp32Nodes"] == [node] if layer == "linear" else len(report["fp32Nodes"]) == 2
        assert report["gate"]["accuracy"]["fp32"] - report["gate"]["accuracy"]["int8"] <= 0.01
        kept = ", ".join(report["fp32Nodes"])
        assert any(f"passes with the {served['why']}: {kept}; capacity" in note for note in report["notes"])

        # The ablation: without the fallback the same model is refused, and nothing is written.
        code, _, err = export(capsys, tmp_path / "refused", *args, "--no-fallback")
        assert code == 1
        assert "int8 fails its accuracy gate (logits: top-1 agreement" in err
        assert not (tmp_path / "refused" / "classifier").exists()

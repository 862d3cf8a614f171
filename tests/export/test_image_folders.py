"""int8 of a user's image classifier on folders of images: processed as callers' images are (`--processing`),
labelled by their subfolders named as in `--labels`, and refused, naming the file or folder, where they cannot be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from PIL import Image

from inferop_core.cli import main as inferop

SIDE = 16
ONNX_IR = 10  # what ONNX Runtime 1.18 and later read
CLASSES = ("red", "green", "blue")
PROCESSING = '{"kind": "imageClassification", "resizeRatio": 1.0, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25]}'


def colour_classifier(path: Path) -> Path:
    """Logits from each colour channel's mean: a classifier of the dominant colour, as an ONNX file."""
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["images"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["features"]),
            helper.make_node("Gemm", ["features", "weight", "bias"], ["logits"], transB=1),
        ],
        "colours",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["n", 3, SIDE, SIDE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", len(CLASSES)])],
        [
            numpy_helper.from_array((np.eye(3) * 4 - 1).astype(np.float32), "weight"),
            numpy_helper.from_array(np.zeros(3, np.float32), "bias"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=ONNX_IR), path)
    return path


def write_images(folder: Path, per_class: int, seed: int, labelled: bool = True) -> Path:
    """PNGs of one dominant colour each under noise, in one subfolder a class (or all in `folder`)."""
    rng = np.random.default_rng(seed)
    for number, name in enumerate(CLASSES):
        target = folder / name if labelled else folder
        target.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            pixels = rng.normal(100, 40, size=(SIDE, SIDE, 3))
            pixels[..., number] += rng.uniform(40, 120)
            Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(target / f"{name}-{index}.png")
    return folder


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("colours")
    labels = root / "labels.txt"
    labels.write_text("\n".join(CLASSES) + "\n")
    return {
        "file": colour_classifier(root / "colours.onnx"),
        "labels": labels,
        "calibration": write_images(root / "calibration", 10, seed=1, labelled=False),
        "validation": write_images(root / "validation", 110, seed=2),
    }


def export(capsys: pytest.CaptureFixture[str], repo: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    code = inferop(["export", *args, "--repo", str(repo), "--json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if code == 0 else {}, err


def int8_args(model: dict[str, Path], **paths: Path) -> list[str]:
    files = {**model, **paths}
    return [
        "onnx", str(files["file"]), "--processing", PROCESSING, "--labels", str(files["labels"]),
        "--precision", "int8", "--calibration", str(files["calibration"]), "--validation", str(files["validation"]),
    ]  # fmt: skip


def test_an_image_classifier_is_gated_on_folders_of_images_with_its_accuracy(
    capsys: pytest.CaptureFixture[str], model: dict[str, Path], tmp_path: Path
) -> None:
    code, report, err = export(capsys, tmp_path, *int8_args(model))
    assert code == 0, err
    gate = report["gate"]
    assert gate["passed"] and gate["samples"] == 330
    assert gate["accuracy"]["fp32"] >= 0.95 and gate["accuracy"]["fp32"] - gate["accuracy"]["int8"] <= 0.01
    # What callers need is served with the model: its processing and its class names.
    config = Path(report["configPath"]).read_text()
    assert "imageClassification" in config and 'label_filename: "labels.txt"' in config
    assert (Path(report["configPath"]).parent / "labels.txt").read_text().split() == list(CLASSES)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("no-processing", "holds images, which only an image classifier can read: give --processing with kind "
         "imageClassification"),
        ("unknown-class", "subfolder 'purple' is not a class: name it one of --labels (red, green, blue)"),
        ("unreadable", "green/broken.png is not a readable image"),
        ("mixed", "holds images both in it (loose.png...) and in subfolders (blue/)"),
        ("bad-processing", "--processing '{\"kind\": \"imageClassification\"}': value: kind imageClassification "
         "needs resizeRatio, mean, std"),
        ("two-labels", "colours: --labels names 2 classes; output 'logits' has 3"),
    ],
)  # fmt: skip
def test_a_folder_that_cannot_be_read_is_refused_naming_it(
    capsys: pytest.CaptureFixture[str], model: dict[str, Path], tmp_path: Path, change: str, message: str
) -> None:
    validation = write_images(tmp_path / "validation", 110, seed=3)
    args = int8_args(model, validation=validation)
    if change == "no-processing":
        args[2:4] = []
    elif change == "unknown-class":
        (validation / "red").rename(validation / "purple")
    elif change == "unreadable":
        (validation / "green" / "broken.png").write_text("not a picture")
    elif change == "mixed":
        Image.new("RGB", (SIDE, SIDE)).save(validation / "loose.png")
    elif change == "bad-processing":
        args[3] = '{"kind": "imageClassification"}'
    elif change == "two-labels":
        (tmp_path / "two.txt").write_text("red\ngreen\n")
        args[5] = str(tmp_path / "two.txt")
    code, _, err = export(capsys, tmp_path / "repo", *args)
    assert code == 2
    assert message in " ".join(err.split())


@pytest.mark.integration
def test_the_int8_model_that_passed_its_gate_is_served_behind_the_pipeline(
    capsys: pytest.CaptureFixture[str], model: dict[str, Path], tmp_path: Path
) -> None:
    code, report, err = export(capsys, tmp_path, *int8_args(model), "--pipeline", "image", "--top-k", "2")
    assert code == 0, err
    assert report["precision"] == "int8" and report["gate"]["passed"]
    # The photographs went through the ensemble on tritonserver and answered as the int8 model does in process.
    assert "40 photographs" in report["pipeline"] and "top-2 labels equal" in report["pipeline"]
    served = onnx.load(str(tmp_path / "colours_model" / "1" / "model.onnx"))
    assert any(node.op_type == "QuantizeLinear" for node in served.graph.node)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "colours",
        "colours_model",
        "colours_post",
        "colours_pre",
    ]

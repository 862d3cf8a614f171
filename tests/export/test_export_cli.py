"""`inferop export` as a user runs it: a verified model directory and a report, or an error naming a flag."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from inferop_core.tritonconfig import parse_model_config

INFEROP = Path(sys.executable).with_name("inferop")
TINY_FLAGS = ["--rows", "6", "--cols", "5", "--depth", "2", "--hidden", "8", "--moves", "5"]


def inferop(*args: str | Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(INFEROP), *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    repo = tmp_path_factory.mktemp("cli") / "repo"
    result = inferop("export", "conv_net", *TINY_FLAGS, "--max-batch-size", "4", "--repo", repo, "--json")
    return result, repo


@pytest.fixture(scope="module")
def report(exported: tuple[subprocess.CompletedProcess[str], Path]) -> dict[str, Any]:
    result, _ = exported
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class TestExportConvNet:
    def test_exits_zero_with_a_passed_checker(self, report: dict[str, Any]) -> None:
        assert report["model"] == "conv_net"
        assert report["checker"] == "passed"

    def test_parity_at_batch_one_and_eight_within_tolerance(self, report: dict[str, Any]) -> None:
        parity = {(p["batch"], p["output"]): p for p in report["parity"]}
        assert set(parity) == {(b, o) for b in (1, 8) for o in ("policy", "value")}
        assert report["tolerance"] > 0
        for entry in parity.values():
            assert 0 <= entry["maxAbsDiff"] <= report["tolerance"]
            assert entry["maxAbsValue"] > 0  # a network that outputs zeros would agree vacuously

    def test_profile_numbers_of_the_tiny_net(self, report: dict[str, Any]) -> None:
        # 6x5 board, two 8-channel torso convolutions, heads of 2 and 1 channels, 5 moves (see test_profile).
        assert report["profile"]["parameters"] == 1219
        assert report["profile"]["macs_per_sample"] == 26250
        assert report["profile"]["weight_bytes"] >= 4 * 1219
        assert report["profile"]["activation_bytes_per_sample"] > 0

    def test_writes_the_model_and_its_config(
        self, exported: tuple[subprocess.CompletedProcess[str], Path], report: dict[str, Any]
    ) -> None:
        _, repo = exported
        model = repo / "conv_net" / "1" / "model.onnx"
        assert Path(report["modelPath"]) == model
        assert model.stat().st_size > 4 * 1219
        config = parse_model_config((repo / "conv_net" / "config.pbtxt").read_text())
        assert config.name == "conv_net"
        assert config.max_batch_size == 4  # the flag, not the default
        assert [list(i.dims) for i in config.input] == [[1, 6, 5]]
        assert [(o.name, list(o.dims)) for o in config.output] == [("policy", [5]), ("value", [1])]

    def test_measures_capacity_and_derives_the_queue_bound_from_it(
        self, exported: tuple[subprocess.CompletedProcess[str], Path], report: dict[str, Any]
    ) -> None:
        """No --max-queue-size: the bound in config.pbtxt is Little's law on the capacity export measured."""
        from inferop_core.capacity import derive_queue_bound, pod_capacity
        from inferop_core.threads import local_cpus, plan_threads

        _, repo = exported
        rate = report["profile"]["samples_per_cpu_second"]
        assert rate > 0
        serving = report["serving"]
        threads = plan_threads(local_cpus(), 1, serving["intra_op_threads"], serving["inter_op_threads"])
        expected = derive_queue_bound(pod_capacity(rate, threads), 10.0, instances=1, max_batch_size=4)
        assert expected.source == "capacity"
        config = parse_model_config((repo / "conv_net" / "config.pbtxt").read_text())
        assert config.dynamic_batching.default_queue_policy.max_queue_size == expected.size == serving["max_queue_size"]

    def test_records_random_weights_in_the_config_and_the_report(
        self, exported: tuple[subprocess.CompletedProcess[str], Path], report: dict[str, Any]
    ) -> None:
        """The conv net has no weights to load: its config and report say so, for `inferop infer` to repeat."""
        from inferop_core.tritonconfig import WEIGHTS_PARAMETER
        from inferop_export.cli import format_report

        _, repo = exported
        config = parse_model_config((repo / "conv_net" / "config.pbtxt").read_text())
        assert config.parameters[WEIGHTS_PARAMETER].string_value == "random (seed 0)"
        assert report["serving"]["weights"] == "random (seed 0)"
        assert "  weights: random (seed 0)" in format_report(report).splitlines()

    def test_json_mode_keeps_progress_off_stdout(self, exported: tuple[subprocess.CompletedProcess[str], Path]) -> None:
        result, _ = exported
        assert result.stdout.lstrip().startswith("{")
        assert "[1/4]" not in result.stdout


class TestExportErrors:
    def test_depth_zero_exits_2_naming_the_flag(self, tmp_path: Path) -> None:
        result = inferop("export", "conv_net", "--depth", "0", "--repo", tmp_path / "repo")
        assert result.returncode == 2
        assert "--depth must be >= 1, got 0" in result.stderr
        assert not (tmp_path / "repo").exists()

    def test_missing_weights_file_exits_2_naming_the_file(self, tmp_path: Path) -> None:
        missing = tmp_path / "missing.pth"
        result = inferop("export", "inception_v3", "--weights", missing, "--repo", tmp_path / "repo")
        assert result.returncode == 2
        assert f"--weights {missing}: no such file" in result.stderr

    def test_weights_of_another_shape_exit_2_naming_the_file(self, tmp_path: Path) -> None:
        import torch

        weights = tmp_path / "ten_classes.pth"
        torch.save({"fc.weight": torch.zeros(10, 2048), "fc.bias": torch.zeros(10)}, weights)
        result = inferop("export", "inception_v3", "--weights", weights, "--repo", tmp_path / "repo")
        assert result.returncode == 2, result.stderr
        assert f"--weights {weights}: not a torchvision Inception V3 state dict" in result.stderr
        assert "Traceback" not in result.stderr


def test_gpu_memory_exports_for_a_gpu_pod(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    result = inferop("export", "conv_net", *TINY_FLAGS, "--gpu-memory", "4Gi", "--instances", "2", "--repo", repo)
    assert result.returncode == 0, result.stderr
    config = parse_model_config((repo / "conv_net" / "config.pbtxt").read_text())
    assert [(g.kind, g.count) for g in config.instance_group] == [(config.instance_group[0].KIND_GPU, 2)]
    share = int(config.parameters["gpu_mem_limit"].string_value)
    assert 2 * share <= 4 * 2**30 and config.parameters["arena_extend_strategy"].string_value == "1"


def test_a_bad_gpu_memory_names_the_field(tmp_path: Path) -> None:
    result = inferop("export", "conv_net", *TINY_FLAGS, "--gpu-memory", "lots", "--repo", tmp_path / "repo")
    assert result.returncode == 2
    assert "gpu.memory" in result.stderr and "lots" in result.stderr
    assert not (tmp_path / "repo").exists()  # refused before anything was written


def test_each_serving_flag_takes_its_spec_field_s_own_unit() -> None:
    """`--request-timeout-seconds 2.5` is timeouts.requestSeconds 2.5, as the spec states it; help shows the default
    in that unit."""
    import argparse

    from inferop_export.cli import add_arguments, serving_settings

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["conv_net", "--request-timeout-seconds", "2.5", "--max-queue-size", "16"])
    assert serving_settings(args) == {"timeouts": {"requestSeconds": 2.5}, "batching": {"maxQueueSize": 16}}
    help_text = parser._subparsers._group_actions[0].choices["conv_net"].format_help()  # type: ignore[union-attr]
    assert "(spec.timeouts.requestSeconds; default: 10)" in " ".join(help_text.split())


class TestPipelineErrors:
    @pytest.mark.parametrize(
        ("args", "words"),
        [
            (
                ["conv_net", "--pipeline", "image"],
                "conv_net: --pipeline image needs an image classifier with its "
                "preprocessing (--processing with kind imageClassification)",
            ),
            (["conv_net", "--top-k", "3"], "--top-k is for --pipeline image"),
            (["inception_v3", "--pipeline", "image", "--top-k", "0"], "--top-k 0: spec.pipeline.topK: Input should be"),
            (["inception_v3", "--pipeline", "audio"], "argument --pipeline: invalid choice: 'audio'"),
        ],
    )
    def test_a_pipeline_it_cannot_build_exits_2_naming_the_flag(
        self, tmp_path: Path, args: list[str], words: str
    ) -> None:
        result = inferop("export", *args, "--repo", tmp_path / "repo")
        assert result.returncode == 2 and words in result.stderr, result.stderr
        assert not (tmp_path / "repo").exists()

"""`inferop plan`: the operator's decision for a manifest without a cluster, with exit codes a CI pipeline reads.
That it matches what the operator writes on the control plane is tests/kube/test_plan_command.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_core.cli import main
from inferop_operator.identity import API_VERSION, KIND
from tests.specs import EXAMPLES, raw_spec


def plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def planned(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]]]:
    code, out, err = plan(capsys, *argv, "--json")
    assert not err
    return code, json.loads(out)


def conditions(verdict: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in verdict["status"]["conditions"]}


def test_an_accepted_example_shows_threads_queue_and_memory_with_their_arithmetic(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = plan(capsys, "-f", str(EXAMPLES / "conv-net.yaml"))
    assert code == 0
    assert out.startswith(f"conv-net ({EXAMPLES / 'conv-net.yaml'}): accepted")
    assert "ThreadBudget  True    WithinBudget: 2 instance(s) x (1 intra-op + 1 inter-op - 1) = 2 threads" in out
    assert "queue         queue bound 128 (batching.maxQueueSize)" in out
    assert "MemoryFit     True    Fits: peak estimate " in out and " against 1Gi " in out


def test_the_json_is_the_status_the_operator_writes_with_the_arithmetic_beside_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, (verdict,) = planned(capsys, "-f", str(EXAMPLES / "conv-net.yaml"))
    assert code == 0 and verdict["outcome"] == "accepted"
    assert conditions(verdict) == {
        "Valid": ("True", "SpecValid"),
        "ThreadBudget": ("True", "WithinBudget"),
        "MemoryFit": ("True", "Fits"),
    }
    status = verdict["status"]
    assert status["threads"]["summary"] == "2x(1+1)/2cpu"
    assert status["queue"] == {"maxQueueSize": 128, "source": "spec"}  # the example sets batching.maxQueueSize
    memory = verdict["arithmetic"]["memory"]
    terms = ("runtimeBytes", "instancesBytes", "weightsBytes", "activationsBytes", "inFlightBytes")
    assert sum(memory[term] for term in terms) == memory["requiredBytes"] == status["memory"]["requiredBytes"]
    assert memory["availableBytes"] == 2**30 == status["memory"]["availableBytes"]


@pytest.mark.parametrize(
    ("example", "condition", "fix"),
    [
        ("oversubscribed.yaml", "ThreadBudget", "lower instances to 1"),
        ("out-of-memory.yaml", "MemoryFit", "batching.maxBatchSize <= 12"),
    ],
)
def test_a_refused_example_exits_1_with_its_fixes(
    capsys: pytest.CaptureFixture[str], example: str, condition: str, fix: str
) -> None:
    code, out, _ = plan(capsys, "-f", str(EXAMPLES / "refused" / example))
    assert code == 1
    assert ": refused" in out.splitlines()[0]
    line = next(line for line in out.splitlines() if line.strip().startswith(condition))
    assert "False" in line and fix in line


def test_an_invalid_spec_exits_2_naming_the_field(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    manifest = tmp_path / "isvc.yaml"
    document = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": "bad"}}
    manifest.write_text(yaml.safe_dump(document | {"spec": raw_spec(instances=0)}))
    code, (verdict,) = planned(capsys, "-f", str(manifest))
    assert code == 2 and verdict["outcome"] == "invalid"
    (valid,) = [c for c in verdict["status"]["conditions"] if c["type"] == "Valid"]
    assert valid["status"] == "False" and "instances" in valid["message"]


def test_other_kinds_are_invalid_and_the_worst_outcome_is_the_exit_code(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    manifest = tmp_path / "mixed.yaml"
    manifest.write_text(
        (EXAMPLES / "conv-net.yaml").read_text()
        + "\n---\n"
        + yaml.safe_dump({"kind": "Deployment", "apiVersion": "v1"})
    )
    code, verdicts = planned(capsys, "-f", str(manifest), "-f", str(EXAMPLES / "refused" / "oversubscribed.yaml"))
    assert code == 2
    assert [v["outcome"] for v in verdicts] == ["accepted", "invalid", "refused"]
    assert "kind: 'Deployment' is not an InferenceService" in verdicts[1]["status"]["conditions"][0]["message"]


def test_other_limits_are_planned_in_place_of_the_spec_s(capsys: pytest.CaptureFixture[str]) -> None:
    example = str(EXAMPLES / "conv-net.yaml")
    code, (verdict,) = planned(capsys, "-f", example, "--cpus", "4")
    assert code == 0 and verdict["status"]["threads"]["cpus"] == 4
    code, (verdict,) = planned(capsys, "-f", example, "--memory", "64Mi")
    assert code == 1
    (fit,) = [c for c in verdict["status"]["conditions"] if c["type"] == "MemoryFit"]
    assert fit["reason"] == "InsufficientMemory" and "against 64Mi" in fit["message"]


@pytest.mark.parametrize(("option", "value"), [("--cpus", "two"), ("--memory", "-1Gi"), ("--cpus", "0")])
def test_a_bad_limit_is_named(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    code, _, err = plan(capsys, "-f", str(EXAMPLES / "conv-net.yaml"), f"{option}={value}")
    assert code == 2 and f"{option} {value!r}" in err


def test_an_unreadable_file_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = plan(capsys, "-f", str(tmp_path / "missing.yaml"))
    assert code == 2 and "missing.yaml" in err

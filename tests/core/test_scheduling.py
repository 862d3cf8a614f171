"""The scheduling policy tritonserver runs under: what the container's command and the local server set."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from inferop_core import scheduling

REPORT_POLICY = "import os; print(os.sched_getscheduler(0))"


def policy_of_child(command: list[str], preexec: scheduling.CpuScheduling | None = None) -> int:
    """The policy a child process runs under, and its own child: what tritonserver's stubs inherit."""
    grandchild = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {REPORT_POLICY!r}])"
    result = subprocess.run(
        [*command, sys.executable, "-c", grandchild],
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=(lambda: scheduling.apply(preexec)) if preexec else None,
    )
    return int(result.stdout)


@pytest.mark.parametrize(("policy", "expected"), [("batch", os.SCHED_BATCH), ("normal", os.SCHED_OTHER)])
def test_the_containers_command_prefix_sets_the_policy_for_every_descendant(
    policy: scheduling.CpuScheduling, expected: int
) -> None:
    assert policy_of_child(scheduling.command_prefix(policy)) == expected


@pytest.mark.parametrize(("policy", "expected"), [("batch", os.SCHED_BATCH), ("normal", os.SCHED_OTHER)])
def test_apply_before_exec_sets_the_policy_for_every_descendant(
    policy: scheduling.CpuScheduling, expected: int
) -> None:
    assert policy_of_child([], preexec=policy) == expected

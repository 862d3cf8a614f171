"""What a pod did with its time during a run, read from the server itself rather than from separate windows.

The overload drill judged goodput against a capacity measured in 15 s closed-loop windows just before and after the
run, and consecutive windows of one server on one machine differ by up to 20%: a verdict at 0.9 then fell to the
machine's drift as often as to the server (issue 21). The same run's own figures decide instead:

- Triton's statistics per batch size: the rate at which the pod computes full batches during the run, the share of
  the computed samples that went in full batches, and how many samples it computed in all;
- the CPU time of the pod's processes (procfs): the model's instances (the python backend's stub processes, every
  process of the pod but the server's own) against the whole pod. CPU spent reading and rejecting requests inside
  the pod is taken from the model's quota, and it shows here, where the rate of full batches would absorb it.

Each is a ratio within one run and one machine state, so a slower or drifting CPU scales both sides alike.
"""

from __future__ import annotations

import json
import os
import urllib.request
from dataclasses import dataclass
from typing import Any

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Snapshot:
    batches: dict[int, tuple[int, int]]  # batch size -> (executions, nanoseconds in the backend), cumulative
    pod_cpu_seconds: float
    model_cpu_seconds: float  # the pod's processes other than the server's own: its model instances


@dataclass(frozen=True)
class Work:
    computed: int  # samples the pod computed
    full_batch_share: float | None  # of those, the share computed in batches of max_batch_size
    full_batch_rate: float | None  # samples per second the pod's instances compute at in full batches
    model_cpu_share: float | None  # of the pod's CPU time, the share its model instances used

    def as_dict(self) -> dict[str, Any]:
        def rounded(value: float | None) -> float | None:
            return None if value is None else round(value, 4)

        return {
            "computed": self.computed,
            "full_batch_share": rounded(self.full_batch_share),
            "full_batch_rate": rounded(self.full_batch_rate),
            "model_cpu_share": rounded(self.model_cpu_share),
        }


def snapshot(url: str, model: str, pids: list[int], server_pid: int) -> Snapshot:
    """Triton's cumulative execution statistics of `model` (the server at `url`) and the CPU time of the pod's
    processes `pids` (the server's own is `server_pid`), now."""
    with urllib.request.urlopen(f"http://{url}/v2/models/{model}/stats", timeout=30) as response:
        stats = json.load(response)["model_stats"][0]
    batches = {
        int(row["batch_size"]): (
            int(row["compute_infer"]["count"]),
            sum(int(row[phase]["ns"]) for phase in ("compute_input", "compute_infer", "compute_output")),
        )
        for row in stats.get("batch_stats", [])
    }
    cpu = {pid: cpu_seconds(pid) for pid in pids}
    return Snapshot(
        batches=batches,
        pod_cpu_seconds=sum(cpu.values()),
        model_cpu_seconds=sum(seconds for pid, seconds in cpu.items() if pid != server_pid),
    )


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of a process and all its threads; 0 for one that has gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()  # the command name may hold spaces
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime and stime, fields 14 and 15 of proc(5)


def work_between(before: Snapshot, after: Snapshot, max_batch_size: int, executing: int) -> Work:
    """What the pod did between two snapshots. The full-batch rate assumes its `executing` instances computed side
    by side, as a saturated pod's do (one where its instances take turns)."""
    executed = {
        size: (after.batches[size][0] - before.batches.get(size, (0, 0))[0],
               after.batches[size][1] - before.batches.get(size, (0, 0))[1])
        for size in after.batches
    }  # fmt: skip
    computed = sum(size * count for size, (count, _) in executed.items())
    full_count, full_ns = executed.get(max_batch_size, (0, 0))
    pod_cpu = after.pod_cpu_seconds - before.pod_cpu_seconds
    return Work(
        computed=computed,
        full_batch_share=max_batch_size * full_count / computed if computed else None,
        full_batch_rate=executing * max_batch_size * full_count / (full_ns / 1e9) if full_ns else None,
        model_cpu_share=(after.model_cpu_seconds - before.model_cpu_seconds) / pod_cpu if pod_cpu > 0 else None,
    )

"""`make bench`'s reference client: what is read from perf_analyzer's own files, and how its goals are judged."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inferop_devtools.bench.clients import clients_lines, clients_targets, perf_analyzer_command, perf_analyzer_figures

# perf_analyzer 2.51's CSV (-f) as it wrote it for the conv net at 16 callers.
CSV = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "16,2049.81,21,504,4257,43,2893,82,0,6743,7694,8451,11815\n"
)


def export(latencies_ms: list[float]) -> dict[str, Any]:
    """A per-request export (--profile-export-file) as perf_analyzer 2.51 writes it, inputs left out."""
    start = 1_796_448_541_871_861_475
    requests = [
        {"timestamp": start + i * 10**6, "response_timestamps": [start + i * 10**6 + int(ms * 1e6)]}
        for i, ms in enumerate(latencies_ms)
    ]
    requests.append({"timestamp": start, "response_timestamps": []})  # no answer: not a latency
    return {"experiments": [{"experiment": {"mode": "concurrency", "value": 16}, "requests": requests}]}


def test_the_figures_are_perf_analyzer_s_and_the_stall_band_is_counted_from_its_export(tmp_path: Path) -> None:
    out = tmp_path / "conv_net-16"
    out.with_suffix(".csv").write_text(CSV)
    out.with_suffix(".json").write_text(json.dumps(export([6.5, 7.0, 479.9, 480.0, 512.3, 700.0, 700.1])))
    figures = perf_analyzer_figures(out, export=True)
    assert figures == {
        "throughput": 2049.81, "p50_ms": 6.743, "p99_ms": 11.815, "requests": 7, "in_stall_band": 3, "max_ms": 700.1,
    }  # fmt: skip
    assert perf_analyzer_figures(out, export=False)["in_stall_band"] is None
    command = perf_analyzer_command(Path("pa"), "127.0.0.1:8000", "conv_net", 16, 15, out, export=False)
    assert "--profile-export-file" not in command and command[command.index("--measurement-interval") + 1] == "5000"


def level(throughput: float, p99: float, band: int | None = None) -> dict[str, Any]:
    return {"throughput": throughput, "p50_ms": 5.0, "p99_ms": p99, "in_stall_band": band, "max_ms": None,
            "client_cpu_ms_per_request": 0.1}  # fmt: skip


def test_a_hidden_tail_and_the_stall_are_missed_targets() -> None:
    figures = {"seconds": 6, "models": {"conv_net": {
        "4": {"perf_analyzer": level(1000, 6.0, band=0), "inferop_bench": level(950, 6.6)},
        "16": {"perf_analyzer": level(2000, 12.5, band=16), "inferop_bench": level(1700, 20.0)},
    }, "inception_v3": {"1": {"perf_analyzer": level(32, 40.0), "inferop_bench": level(32, 41.0)}}}}  # fmt: skip
    outcome = {target.name: (target.missed, target.not_applicable) for target in clients_targets(figures)}
    assert outcome["conv_net at 4: |inferop bench p99 / perf_analyzer p99 - 1|"] == (False, None)
    assert outcome["conv_net at 16: |inferop bench p99 / perf_analyzer p99 - 1|"] == (True, None)
    assert outcome["conv_net at 16: |inferop bench throughput / perf_analyzer's - 1|"] == (True, None)
    assert outcome["conv_net at 16: perf_analyzer's answers in 480-700 ms"] == (True, None)
    assert outcome["inception_v3 at 1: perf_analyzer's answers in 480-700 ms"] == (
        False, "requests too large to export",
    )  # fmt: skip
    assert any("conv_net" in line and "16" in line and line.split()[-2] == "16" for line in clients_lines(figures))
    longer = clients_lines({**figures, "seconds_factor": {"conv_net": 1, "inception_v3": 3}})[0]
    assert "6 s a level (inception_v3 18 s)" in longer

"""`inferop tune`'s climb against the exhaustive sweep of the same grid on the conv net under a CPU quota and a p99
budget: trials, time and best throughput, the winners measured again side by side."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from inferop_devtools.bench.targets import Target

TIME_RATIO = 0.33  # the climb's time over the sweep's, at most
THROUGHPUT_RATIO = 0.95  # the climb's best over the sweep's, measured again, at least


TUNE_CPUS = 2.0
TUNE_P99_MS = 40.0
TUNE_SECONDS = 3.0
TUNE_CONCURRENCY = 16
CONFIRM_ROUNDS = 3


def tune_bench() -> dict[str, Any]:
    """The climb and the exhaustive sweep of one grid, with one budget, on the default conv net; then both winners
    measured again in alternation, because the best of 72 noisy measurements is biased upwards against the best of
    a few (repeated trials of one config differ by up to 8% here)."""
    from inferop_core.tritonconfig import parse_model_config, read_serving_config
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_export.tune import Grid, Search, TritonTrials, TuneError, require_best, thread_layouts

    with tempfile.TemporaryDirectory(prefix="inferop-bench-tune-") as work:
        repo = Path(work) / "repo"
        print("tune: exporting conv_net ...", flush=True)
        export_model(conv_net(), repo, quiet=True)
        model_dir = repo / "conv_net"
        serving = read_serving_config(parse_model_config((model_dir / "config.pbtxt").read_text()))
        grid = Grid(TUNE_CPUS, thread_layouts(TUNE_CPUS), (1, 2, 4, 8, 16, 32), (0, 1000, 4000))
        measure = TritonTrials(model_dir, serving, TUNE_CPUS, TUNE_CONCURRENCY, 1, TUNE_SECONDS)
        found: dict[str, dict[str, Any]] = {}
        for how in ("climb", "exhaustive"):
            print(f"tune: {how} over {grid.size} configs, p99 <= {TUNE_P99_MS:g} ms ...", flush=True)
            search = Search(measure, TUNE_P99_MS)
            began = time.monotonic()
            if how == "climb":
                search.climb(grid, grid.start(serving.max_batch_size, serving.max_queue_delay_microseconds))
            else:
                search.sweep(grid)
            found[how] = {"trials": len(search.trials), "seconds": round(time.monotonic() - began, 1)}
            try:
                best = require_best(search.trials, TUNE_P99_MS)
            except TuneError as error:  # a search that meets no budget is a result too: the other one is kept
                found[how]["error"] = str(error)
                continue
            found[how].update(
                best=best.settings.describe(),
                best_samples_per_s=round(best.throughput, 1),
                best_p99_ms=round(best.p99_ms, 1),
                settings=best.settings,
            )
        winners = [how for how, figures in found.items() if "settings" in figures]
        print(f"tune: {' and '.join(winners) or 'no'} winner(s) again, in alternation ...", flush=True)
        again: dict[str, list[float]] = {how: [] for how in winners}
        for _ in range(CONFIRM_ROUNDS):
            for how in again:
                again[how].append(measure(found[how]["settings"]).throughput)
    for how in winners:
        found[how].pop("settings")
        found[how]["again_samples_per_s"] = round(statistics.median(again[how]), 1)
    return {"cpus": TUNE_CPUS, "p99_budget_ms": TUNE_P99_MS, "grid": grid.size, **found}


def tune_targets(figures: dict[str, Any]) -> list[Target]:
    """The climb at most a third of the sweep's time, for at least 0.95 of its best throughput measured again; a
    search that found no config within the budget scores 0."""
    climb, sweep = figures["climb"], figures["exhaustive"]
    found = "again_samples_per_s" in climb and "again_samples_per_s" in sweep
    best = climb["again_samples_per_s"] / sweep["again_samples_per_s"] if found else 0.0
    return [
        Target("climb / exhaustive time", climb["seconds"] / sweep["seconds"], TIME_RATIO, at_least=False),
        Target("climb / exhaustive best throughput, measured again", best, THROUGHPUT_RATIO),
    ]

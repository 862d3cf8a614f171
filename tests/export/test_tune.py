"""`inferop tune`: the grid and the climb on measured landscapes, the outputs, bad input, and real runs on the
local tritonserver under a CPU quota (the tiny conv net), Ctrl-C included."""

from __future__ import annotations

import argparse
import json
import math
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from inferop_core.tritonconfig import (
    ConfigNotRenderable,
    parse_model_config,
    read_serving_config,
    render_model_config,
)
from inferop_export.tune import (
    Grid,
    Layout,
    Search,
    Settings,
    Trial,
    TuneError,
    TuneRequest,
    add_arguments,
    default_layout,
    pareto_front,
    require_best,
    thread_layouts,
    tuned_spec,
)
from tests.helpers import SERVE_EXTRA, ExportedRepo, wait_for

INFEROP = Path(sys.executable).with_name("inferop")


def grid(
    cpus: float = 2, batches: tuple[int, ...] = (1, 2, 4, 8, 16), delays: tuple[int, ...] = (0, 1000, 4000)
) -> Grid:
    return Grid(cpus, thread_layouts(cpus), batches, delays)


def trial(settings: Settings, throughput: float, p99_ms: float, errors: int = 0, failure: str | None = None) -> Trial:
    return Trial(settings, throughput, p99_ms / 2, p99_ms, errors, 1.0, 1.0, failure)


class Landscape:
    """A measured-looking objective: throughput falls off with the distance from one layout, batch size and delay;
    p99 grows with batch and delay. Counts what was measured, as a real measurement costs a server start."""

    def __init__(self, peak: Settings, cpus: float = 2) -> None:
        self.peak, self.cpus, self.measured = peak, cpus, 0

    def __call__(self, s: Settings) -> Trial:
        self.measured += 1
        here, peak = s.layout, self.peak.layout
        layout_penalty = 0.08 * (
            abs(here.instances - peak.instances)
            + abs(here.intra_op - peak.intra_op)
            + abs(here.inter_op - peak.inter_op)
        )
        batch_penalty = 0.12 * abs(math.log2(s.max_batch_size) - math.log2(self.peak.max_batch_size))
        delay_penalty = 0.05 * abs(s.max_queue_delay_us - self.peak.max_queue_delay_us) / 1000
        throughput = 1000 * (1 - layout_penalty - batch_penalty - delay_penalty)
        p99 = 5 + 2 * s.max_batch_size + s.max_queue_delay_us / 1000
        return trial(s, throughput, p99)


class TestGrid:
    def test_thread_layouts_are_exactly_those_within_the_budget(self) -> None:
        assert thread_layouts(1) == (Layout(1, 1, 1), Layout(2, 1, 1, take_turns=True))  # the derived one too
        assert set(thread_layouts(2)) == {Layout(1, 1, 1), Layout(1, 2, 1), Layout(1, 1, 2), Layout(2, 1, 1)}
        for layout in thread_layouts(4):
            assert layout.instances * (layout.intra_op + layout.inter_op - 1) <= 4
        assert Layout(4, 1, 1) in thread_layouts(4) and Layout(2, 2, 1) in thread_layouts(4.5)

    def test_the_climb_starts_at_the_operators_default_and_the_nearest_grid_values(self) -> None:
        assert (default_layout(1), default_layout(4)) == (Layout(2, 1, 1, take_turns=True), Layout(2, 2, 1))
        start = grid(4).start(max_batch_size=12, max_queue_delay_us=2000)
        assert start == Settings(Layout(2, 2, 1), 8, 1000)

    def test_neighbours_step_one_setting_or_move_threads_between_instances(self) -> None:
        g = grid(4)
        point = Settings(Layout(1, 4, 1), 4, 1000)
        neighbours = g.neighbours(point)
        assert Settings(Layout(1, 4, 1), 2, 1000) in neighbours and Settings(Layout(1, 4, 1), 8, 1000) in neighbours
        assert Settings(Layout(1, 4, 1), 4, 0) in neighbours and Settings(Layout(1, 4, 1), 4, 4000) in neighbours
        assert Settings(Layout(1, 3, 1), 4, 1000) in neighbours
        # One instance more, with the threads the budget derives for two: 2 x 2.
        assert Settings(Layout(2, 2, 1), 4, 1000) in neighbours
        assert point not in neighbours and all(n.layout in g.layouts for n in neighbours)
        assert len(set(neighbours)) == len(neighbours)


class TestSearch:
    @pytest.mark.parametrize("cpus", [2, 4])
    def test_the_climb_finds_the_peak_in_a_fraction_of_the_grid(self, cpus: int) -> None:
        g = grid(cpus)
        peak = Settings(g.layouts[0], 16, 0)  # far from the start on every axis
        landscape = Landscape(peak, cpus)
        trials = Search(landscape, None).climb(g, g.start(8, 2000))
        best = require_best(trials, None)
        exhaustive = require_best(Search(Landscape(peak, cpus), None).sweep(g), None)
        assert best.throughput >= 0.95 * exhaustive.throughput
        assert landscape.measured <= g.size / 3, (landscape.measured, g.size)

    def test_a_p99_budget_steers_the_climb_to_the_fastest_config_within_it(self) -> None:
        g = grid()
        landscape = Landscape(Settings(Layout(1, 2, 1), 16, 4000))
        budget = 20.0  # batch 16 (p99 37 ms and more) is out; batch 4 delay 0 is the best within
        trials = Search(landscape, budget).climb(g, g.start(16, 4000))
        best = require_best(trials, budget)
        assert best.p99_ms <= budget
        exhaustive = require_best(Search(Landscape(landscape.peak), budget).sweep(g), budget)
        assert best.throughput >= 0.95 * exhaustive.throughput

    def test_each_config_is_measured_once_and_each_trial_reported(self) -> None:
        g = grid()
        seen: list[Trial] = []
        landscape = Landscape(Settings(Layout(2, 1, 1), 4, 0))
        search = Search(landscape, None, on_trial=seen.append)
        search.climb(g, g.start(8, 1000))
        assert landscape.measured == len(search.trials) == len(seen)
        assert len({t.settings for t in search.trials}) == len(search.trials)

    def test_noise_does_not_move_the_climb(self) -> None:
        g = grid()
        start = g.start(8, 1000)
        flat = Search(lambda s: trial(s, 1000 * (1.02 if s != start else 1.0), 10), None)
        flat.climb(g, start)
        assert len(flat.trials) == 1 + len(g.neighbours(start))

    def test_a_budget_no_config_meets_states_the_best_p99(self) -> None:
        g = grid()
        trials = [trial(s, 100.0 + i, 40.0 + i) for i, s in enumerate(list(g.points())[:3])]
        with pytest.raises(TuneError, match=r"--p99-ms 10: no config met it; the best p99 measured was 40.0 ms"):
            require_best(trials, 10.0)

    def test_failed_requests_or_servers_never_win(self) -> None:
        points = list(grid().points())
        trials = [trial(points[0], 900, 5), trial(points[1], 2000, 5, errors=3), trial(points[2], 3000, 5, failure="x")]
        assert require_best(trials, None).settings == points[0]
        with pytest.raises(TuneError, match="no config served without errors"):
            require_best(trials[1:], None)

    def test_the_pareto_front_keeps_only_undominated_configs(self) -> None:
        points = list(grid().points())
        a, b, c, d = (
            trial(points[0], 500, 10),
            trial(points[1], 800, 20),
            trial(points[2], 700, 25),
            trial(points[3], 900, 40),
        )
        assert pareto_front([c, d, a, b]) == [a, b, d]


def test_a_config_reads_back_into_the_settings_that_render_it(model_repo: ExportedRepo) -> None:
    for model in model_repo.reports:
        text = (model_repo.path / model / "config.pbtxt").read_text()
        serving = read_serving_config(parse_model_config(text))
        assert render_model_config(serving) == text
        edited = parse_model_config(text)
        edited.optimization.priority = 1
        with pytest.raises(ConfigNotRenderable, match="optimization: not as its other settings render them"):
            read_serving_config(edited)


def test_the_tuned_spec_renders_the_measured_config(model_repo: ExportedRepo) -> None:
    from inferop_operator.plan import plan_service

    model_dir = model_repo.path / "conv_net"
    serving = read_serving_config(parse_model_config((model_dir / "config.pbtxt").read_text()))
    tuned = Settings(Layout(2, 1, 1), 4, 0).apply(serving)
    profile = model_repo.reports["conv_net"].profile.as_spec()
    spec = tuned_spec(tuned, model_dir, 2, profile)
    assert render_model_config(plan_service(spec).serving) == render_model_config(tuned)


def inferop(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(INFEROP), *map(str, args)], capture_output=True, text=True, timeout=timeout, check=False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cpus", "two"], "--cpus 'two': not a Kubernetes quantity"),
        (["--cpus", "2", "--p99-ms", "-5"], "--p99-ms -5: must be a positive number"),
        (["--cpus", "2", "--batch-sizes", "4,x"], "--batch-sizes '4,x': expected comma-separated positive integers"),
        (["--cpus", "2", "--queue-delays-us", "-1"], "--queue-delays-us '-1': expected comma-separated integers >= 0"),
        (["--cpus", "2", "--batch", "4", "--batch-sizes", "1,8"], "--batch 4: requests of 4 samples exceed"),
        (["--cpus", "2", "--concurrency", "0"], "--concurrency 0: must be >= 1"),
    ],
)
def test_bad_input_is_refused_before_any_server_starts(
    model_repo: ExportedRepo, flags: list[str], message: str
) -> None:
    result = inferop("tune", "--repo", model_repo.path, "--model", "conv_net", *flags, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_without_cgroups_tune_is_refused_before_any_server_starts(
    model_repo: ExportedRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import inferop.limits

    (tmp_path / "mounts").write_text("proc /proc proc rw 0 0\n")
    monkeypatch.setattr(inferop.limits, "MOUNTS", tmp_path / "mounts")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--repo", str(model_repo.path), "--model", "conv_net", "--cpus", "1"])
    with pytest.raises(TuneError, match=r"--cpus 1: every trial runs inside this CPU limit, in a cgroup: cgroups are"):
        TuneRequest.from_args(args)


def test_an_unknown_model_names_those_there_are(model_repo: ExportedRepo) -> None:
    result = inferop("tune", "--repo", model_repo.path, "--model", "resnet", "--cpus", "1", timeout=60)
    assert result.returncode == 2
    assert "--model 'resnet': no such model" in result.stderr and "conv_net" in result.stderr


@pytest.fixture(scope="module")
def tuned(model_repo: ExportedRepo, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    out = tmp_path_factory.mktemp("tune")
    result = inferop(
        "tune", "--repo", model_repo.path, "--model", "conv_net", "--cpus", "1", "--batch-sizes", "1,8",
        "--queue-delays-us", "0,2000", "--seconds", "1", "--concurrency", "4", "--out", out, "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout), out


@pytest.mark.integration
class TestTuneOnTriton:
    """Real trials: the tiny conv net in a fresh tritonserver per config, under a 1-CPU quota."""

    def test_it_measures_part_of_the_grid_and_names_the_best(self, tuned: tuple[Any, Path]) -> None:
        summary, out = tuned
        assert summary["gridSize"] == 8 and 1 <= summary["trials"] <= 8  # 2 layouts on 1 CPU, 2 batch sizes, 2 delays
        rows = [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]
        assert len(rows) == summary["trials"]
        assert all(row["errors"] == 0 and row["throughput"] > 0 and row["failure"] is None for row in rows)
        assert summary["best"]["throughput"] == max(row["throughput"] for row in rows)
        assert (out / "pareto.png").stat().st_size > 10_000
        assert len((out / "trials.csv").read_text().splitlines()) == summary["trials"] + 1

    def test_the_manifest_renders_the_winning_config(self, tuned: tuple[Any, Path]) -> None:
        from inferop_operator.plan import plan_service
        from inferop_operator.spec import parse_spec

        summary, out = tuned
        manifest = yaml.safe_load((out / "inferenceservice.yaml").read_text())
        plan = plan_service(parse_spec(manifest["spec"]))
        assert render_model_config(plan.serving) == (out / "config.pbtxt").read_text()
        assert manifest["spec"]["resources"]["limits"]["cpu"] == "1"
        config = parse_model_config((out / "config.pbtxt").read_text())
        assert config.max_batch_size == summary["best"]["max_batch_size"]
        assert config.dynamic_batching.max_queue_delay_microseconds == summary["best"]["max_queue_delay_us"]

    def test_an_unmeetable_budget_states_the_best_p99(self, model_repo: ExportedRepo, tmp_path: Path) -> None:
        result = inferop(
            "tune", "--repo", model_repo.path, "--model", "conv_net", "--cpus", "1", "--batch-sizes", "8",
            "--queue-delays-us", "2000", "--seconds", "1", "--p99-ms", "0.01", "--out", tmp_path,
        )  # fmt: skip
        assert result.returncode == 1
        assert "--p99-ms 0.01: no config met it; the best p99 measured was" in result.stderr
        assert len((tmp_path / "trials.jsonl").read_text().splitlines()) == 2  # the grid: 2 layouts on 1 CPU

    @pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
    def test_ctrl_c_stops_cleanly_and_keeps_what_was_measured(
        self, model_repo: ExportedRepo, tmp_path: Path, stop: signal.Signals
    ) -> None:
        process = subprocess.Popen(
            [str(INFEROP), "tune", "--repo", str(model_repo.path), "--model", "conv_net", "--cpus", "1",
             "--exhaustive", "--seconds", "1", "--out", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            # As from a terminal: a suite started in the background has SIGINT ignored, and children inherit that.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        log = tmp_path / "trials.jsonl"
        wait_for(lambda: log.exists() and log.read_text().count("\n") >= 1, 120, "a first trial")
        first = trial_servers(process.pid)
        following = wait_for(lambda: trial_servers(process.pid) - first, 120, "the next trial's server")
        process.send_signal(stop)
        stdout, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert "interrupted after" in stderr and str(tmp_path) in stderr
        assert "samples/s" in stdout  # the table of what was measured
        kept = log.read_text().splitlines()
        assert kept and all(json.loads(line)["throughput"] > 0 for line in kept)
        assert (tmp_path / "pareto.png").exists()
        assert not [pid for pid in first | following if Path(f"/proc/{pid}").exists()]  # no server outlives tune


def trial_servers(tune: int) -> set[str]:
    """The pids of the tritonservers that the `inferop tune` process `tune` runs for its trials (its children)."""
    found = subprocess.run(["pgrep", "-P", str(tune), "tritonserver"], capture_output=True, text=True)
    return set(found.stdout.split())

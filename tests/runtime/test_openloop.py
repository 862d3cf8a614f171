"""Open-loop load: arrivals, classification of Triton's answers, the summary, the CLI's flags, and runs
against the real tritonserver that show requests offered on schedule whatever the server does with them."""

from __future__ import annotations

import json
import os
import re
import resource
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferop.openloop import (
    LATE_WARNING_MS,
    QUEUE_FULL,
    Outcome,
    arrival_times,
    cgroup_memory_probe,
    classify,
    encode_request,
    generator_process,
    run_open_loop,
    summarise,
)
from inferop_core.cli import main
from tests.helpers import SERVING, ExportedRepo, RunningServer, wait_for


class TestArrivalTimes:
    def test_poisson_is_seeded_and_reproducible(self) -> None:
        np.testing.assert_array_equal(arrival_times(50, 10, seed=3), arrival_times(50, 10, seed=3))
        assert not np.array_equal(arrival_times(50, 10, seed=3)[:10], arrival_times(50, 10, seed=4)[:10])

    def test_poisson_mean_rate_over_many_arrivals(self) -> None:
        rate = 200.0
        times = arrival_times(rate, 100, "poisson", seed=0)
        assert len(times) > 19_000
        gaps = np.diff(times)
        assert np.mean(gaps) == pytest.approx(1 / rate, rel=0.03)
        # Exponential gaps: the standard deviation equals the mean, unlike evenly spaced arrivals.
        assert np.std(gaps) == pytest.approx(1 / rate, rel=0.05)

    @pytest.mark.parametrize("process", ["poisson", "fixed"])
    def test_arrivals_are_ordered_and_within_the_duration(self, process: Any) -> None:
        times = arrival_times(37.5, 3.2, process, seed=1)
        assert times[0] >= 0
        assert times[-1] < 3.2
        assert np.all(np.diff(times) >= 0)

    @pytest.mark.parametrize(("rate", "seconds", "count"), [(50, 2, 100), (3, 0.1, 1), (7, 1, 7), (1000, 0.5, 500)])
    def test_fixed_spacing_is_exact(self, rate: float, seconds: float, count: int) -> None:
        times = arrival_times(rate, seconds, "fixed")
        assert len(times) == count
        np.testing.assert_allclose(times, np.arange(count) / rate)

    @pytest.mark.parametrize(
        ("rate", "seconds", "process"), [(0, 1, "fixed"), (-1, 1, "poisson"), (5, 0, "fixed"), (5, 1, "burst")]
    )
    def test_invalid_input_is_refused(self, rate: float, seconds: float, process: Any) -> None:
        with pytest.raises(ValueError):
            arrival_times(rate, seconds, process)


class TestClassify:
    # Bodies exactly as tritonserver 2.51 (and Envoy in front of it) answered over HTTP.
    @pytest.mark.parametrize(
        ("status", "body", "kind"),
        [
            (503, '{"error":"[request id: <id_unknown>] Exceeds maximum queue size"}', "rejected"),
            (503, '{"error":"Request timeout expired"}', "timed_out"),
            (400, "{\"error\":\"unexpected shape for input 'board' for model 'conv_net'\"}", "failed"),
            (404, '{"error":"Request for unknown model: \'nope\' is not found"}', "failed"),
            (500, '{"error":"Exceeds maximum queue size"}', "failed"),  # not the queue's status: something else
            # Envoy 1.39's answer when a gateway's circuit breaker (sized from the queue bound) refuses
            (503, "upstream connect error or disconnect/reset before headers. reset reason: overflow", "rejected"),
            (
                503,
                "upstream connect error or disconnect/reset before headers. reset reason: connection failure",
                "failed",
            ),
        ],
    )
    def test_triton_answers(self, status: int, body: str, kind: str) -> None:
        assert classify(status, body) == kind


def outcome(sent_at: float, latency_s: float, kind: Any, late_ms: float = 1.0) -> Outcome:
    return Outcome(sent_at=sent_at, started_late_ms=late_ms, latency_s=latency_s, kind=kind)


class TestSummarise:
    OUTCOMES = (
        outcome(0.1, 0.2, "ok"),
        outcome(0.5, 0.1, "ok"),
        outcome(0.9, 0.011, "rejected"),  # sent 1 ms late: refused 10 ms after the send
        outcome(1.2, 0.5, "timed_out"),
        outcome(1.5, 0.3, "client_timeout"),
        outcome(1.7, 0.4, "ok", late_ms=80.0),  # answered after the 2 s window: counted, but not as goodput
        outcome(1.9, 0.6, "unfinished"),
    )

    def summary(self, memory: list[tuple[float, int]] | None = None) -> Any:
        return summarise(
            list(self.OUTCOMES),
            memory or [],
            {"rejected": "503 full"},
            model="m",
            rate=3.5,
            seconds=2.0,
            process="fixed",
            batch=4,
            timeout=None,
        )

    def test_counts_add_up(self) -> None:
        result = self.summary()
        assert (result.sent, result.ok, result.rejected, result.timed_out) == (7, 3, 1, 1)
        assert (result.client_timeout, result.failed, result.unfinished) == (1, 0, 1)

    def test_goodput_counts_samples_answered_within_the_window(self) -> None:
        assert self.summary().goodput == pytest.approx(2 * 4 / 2.0)

    def test_a_late_send_is_the_generator_s_not_the_server_s_time_to_reject(self) -> None:
        late = [outcome(0.0, 0.05, "rejected", late_ms=45.0), outcome(0.1, 0.005, "rejected", late_ms=0.0)]
        result = summarise(late, [], {}, model="m", rate=20, seconds=1.0, process="fixed", batch=1, timeout=None)
        assert result.reject_ms["max"] == pytest.approx(5.0)
        assert result.late_ms_p99 == pytest.approx(44.55)  # reported apart

    def test_percentiles(self) -> None:
        result = self.summary()
        assert result.latency_ms["max"] == pytest.approx(400.0)
        assert result.latency_ms["p50"] == pytest.approx(200.0)
        assert result.reject_ms == {"p50": 10.0, "p99": 10.0, "max": 10.0}
        assert result.server_timeout_ms["max"] == pytest.approx(500.0)
        assert result.late_ms_p99 > LATE_WARNING_MS
        assert "could not keep the rate" in result.warnings()[0]

    def test_timeline_buckets_arrivals_by_sending_and_answers_by_finishing(self) -> None:
        rows = self.summary().timeline
        assert [row["t"] for row in rows] == [0, 1, 2]
        assert [row["offered"] for row in rows] == [3, 4, 0]
        assert [row["ok"] for row in rows] == [2, 0, 1]
        assert [row["rejected"] for row in rows] == [1, 0, 0]
        assert [row["timed_out"] for row in rows] == [0, 1, 0]
        assert [row["client_timeout"] for row in rows] == [0, 1, 0]
        assert [row["unfinished"] for row in rows] == [0, 0, 1]
        assert rows[0]["p99_ms"] == pytest.approx(199.0)
        assert rows[1]["p99_ms"] is None
        assert "memory" not in rows[0]

    def test_memory_per_second_is_the_peak(self) -> None:
        rows = self.summary(memory=[(0.0, 10), (0.25, 30), (0.5, 20), (1.0, 5), (2.25, 7)]).timeline
        assert [row["memory"] for row in rows] == [30, 5, 7]

    def test_as_dict_is_json(self) -> None:
        result = self.summary(memory=[(0.0, 10)])
        assert json.loads(json.dumps(result.as_dict()))["memory"] == [[0.0, 10]]

    def test_nothing_answered_has_empty_percentiles(self) -> None:
        result = summarise([], [], {}, model="m", rate=1, seconds=1, process="poisson", batch=1, timeout=1.0)
        assert (result.sent, result.latency_ms, result.reject_ms, result.late_ms_p99) == (0, {}, {}, 0.0)


class TestEncodeRequest:
    def test_every_input_by_name_in_one_body(self) -> None:
        """A model with several inputs (the ranker: FP32 features, INT64 category) gets all of them."""
        features = np.ones((1, 16), dtype=np.float32)
        category = np.array([[3]], dtype=np.int64)
        body, headers = encode_request({"features": features, "category": category}, ["score"])
        header = json.loads(body[: int(headers["Inference-Header-Content-Length"])])
        assert [(t["name"], t["datatype"], t["shape"]) for t in header["inputs"]] == [
            ("features", "FP32", [1, 16]),
            ("category", "INT64", [1, 1]),
        ]
        assert body.endswith(features.tobytes() + category.tobytes())


class TestOutcomes:
    def test_in_flight_at_a_moment(self) -> None:
        """Which callers were waiting at a moment (the monotonic clock): sent before it, answered after it."""
        outcomes = [outcome(0.0, 1.0, "ok"), outcome(0.5, 5.0, "failed"), outcome(2.0, 1.0, "ok")]
        result = summarise(
            outcomes, [], {}, model="m", rate=1, seconds=3, process="fixed", batch=1, timeout=None, started_at=100.0
        )
        assert result.in_flight_at(101.5) == [outcomes[1]]
        assert "outcomes" not in result.as_dict()


class TestCgroupMemoryProbe:
    @pytest.mark.parametrize("name", ["memory.current", "memory.usage_in_bytes"])
    def test_reads_v2_and_v1(self, tmp_path: Path, name: str) -> None:
        (tmp_path / name).write_text("4096\n")
        probe = cgroup_memory_probe(tmp_path)
        (tmp_path / name).write_text("8192\n")
        assert probe() == 8192

    def test_a_directory_without_either_file_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match=re.escape("neither memory.current")):
            cgroup_memory_probe(tmp_path)


class TestGeneratorProcess:
    def test_affinity_is_restored_and_files_raised(self) -> None:
        before = os.sched_getaffinity(0)
        one = {min(before)}
        with generator_process(one):
            assert os.sched_getaffinity(0) == one
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            assert soft == hard
        assert os.sched_getaffinity(0) == before


def exit_code(argv: list[str]) -> int:
    """`inferop ...`'s exit code, whether argparse or the command refused the input."""
    try:
        return main(argv)
    except SystemExit as exit:
        return int(exit.code or 0)


class TestBenchFlags:
    @pytest.mark.parametrize(
        ("flags", "message"),
        [
            (["--rate", "0"], "argument --rate: 0 is not a positive number"),
            (["--rate", "-1"], "argument --rate: -1 is not a positive number"),
            (["--rate", "abc"], "argument --rate: 'abc' is not a number"),
            (["--rate", "6000"], "argument --rate: 6000 requests/s is more than one generator can offer"),
            (["--rate", "10", "--seconds", "0"], "argument --seconds: 0 is not a positive number of seconds"),
            (["--rate", "10", "--timeout", "-2"], "argument --timeout: -2: expected seconds, or 0 for no"),
            (["--rate", "10", "--arrivals", "burst"], "argument --arrivals: invalid choice: 'burst'"),
            (["--rate", "10", "--client-cpuset", "x"], "argument --client-cpuset: 'x': 'x' is not a CPU number"),
            (["--rate", "10", "--client-cpuset", "4096"], "argument --client-cpuset: '4096': this process may run"),
            (["--rate", "10", "--concurrency", "4"], "--concurrency 4 cannot be combined with --rate"),
            (["--rate", "10", "--memory-cgroup", "/nonexistent"], "--memory-cgroup /nonexistent: /nonexistent has"),
            (["--seconds", "0"], "argument --seconds: 0 is not a positive"),
            (["--timeout", "0"], "--timeout 0 (no client timeout) needs --rate"),
            (["--client-cpuset", "0"], "--client-cpuset needs --rate"),
            (["--cpu-cgroup", "/sys"], "--cpu-cgroup needs --rate"),
        ],
    )
    def test_bad_input_names_the_flag_and_exits_2(
        self, flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        # The URL is never reached: every refusal comes before the first request.
        assert exit_code(["bench", "--url", "127.0.0.1:9", "--model", "m", *flags]) == 2
        assert message in capsys.readouterr().err


@pytest.mark.integration
class TestAgainstTriton:
    @pytest.fixture(autouse=True)
    def _server(self, triton: RunningServer) -> None:
        self.url = triton.url

    @staticmethod
    def board(model_repo: ExportedRepo) -> np.ndarray:
        (spec,) = model_repo.reports["conv_net"].serving.inputs
        return np.random.default_rng(0).integers(-1, 2, size=(1, *spec.dims)).astype(np.float32)

    @staticmethod
    def image(model_repo: ExportedRepo) -> np.ndarray:
        (spec,) = model_repo.reports["inception_v3"].serving.inputs
        return np.random.default_rng(0).standard_normal((1, *spec.dims)).astype(np.float32)  # about 1 MB

    def wait_until_idle(self, triton: RunningServer, image: np.ndarray) -> None:
        """Nothing of ours left in the server, so later tests meet an idle model: the queue empty, then one
        request of our own answered behind whatever batch was running."""
        import tritonclient.http as httpclient

        pending = re.compile(r'^nv_inference_pending_request_count\{model="inception_v3",version="1"\} (\d+)', re.M)

        def queue_empty() -> bool:
            with urllib.request.urlopen(triton.server.metrics_url, timeout=10) as response:
                match = pending.search(response.read().decode())
            return match is not None and match.group(1) == "0"

        wait_for(queue_empty, timeout=60, what="inception_v3's queue to empty")
        client = httpclient.InferenceServerClient(triton.url, connection_timeout=10, network_timeout=60)
        try:
            request = httpclient.InferInput("images", list(image.shape), "FP32")
            request.set_data_from_numpy(image, binary_data=True)
            client.infer("inception_v3", [request])
        finally:
            client.close()

    def test_arrivals_follow_the_schedule(self, model_repo: ExportedRepo) -> None:
        result = run_open_loop(
            self.url, "conv_net", self.board(model_repo), 50, 2, timeout=30, process="fixed", memory_probe=lambda: 123
        )
        assert result.sent == 100
        assert (result.ok, result.first_errors) == (100, {})
        assert sum(row["offered"] for row in result.timeline) == 100
        assert [row["offered"] for row in result.timeline[:2]] == [50, 50]
        # Sent on schedule: never early, and late by far less than the 20 ms between arrivals would allow
        # a closed loop (generous: about 5 ms is usual on a busy 2-core machine).
        assert result.late_ms_p99 >= 0
        assert result.late_ms_p99 < 250
        assert result.memory and {used for _, used in result.memory} == {123}
        assert result.timeline[0]["memory"] == 123

    def test_overload_is_rejected_quickly_and_counts_add_up(
        self, triton: RunningServer, model_repo: ExportedRepo
    ) -> None:
        # Inception answers a few tens of images a second here; 80/s overflows its queue of 16 within a second.
        assert SERVING["inception_v3"]["batching"]["maxQueueSize"] == 16
        image = self.image(model_repo)
        result = run_open_loop(self.url, "inception_v3", image, 80, 1.5, timeout=60, process="fixed")
        self.wait_until_idle(triton, image)
        assert result.sent == 120
        assert result.sent == (
            result.ok + result.rejected + result.timed_out + result.client_timeout + result.failed + result.unfinished
        )
        assert result.rejected > 0 and result.ok > 0
        assert (result.client_timeout, result.failed, result.unfinished) == (0, 0, 0)
        assert QUEUE_FULL in result.first_errors["rejected"]
        assert result.first_errors["rejected"].startswith("503 ")
        # A full queue answers at once; an accepted request waits for its turn.
        assert result.reject_ms["p50"] < result.latency_ms["p50"]

    def test_callers_without_timeout_are_left_unfinished(self, triton: RunningServer, model_repo: ExportedRepo) -> None:
        image = self.image(model_repo)
        result = run_open_loop(self.url, "inception_v3", image, 80, 1.0, timeout=None, process="fixed", drain=0)
        self.wait_until_idle(triton, image)
        assert result.sent == result.ok + result.rejected + result.timed_out + result.failed + result.unfinished
        assert result.unfinished > 0
        assert result.client_timeout == 0
        # Still waiting when the run ended: each one is counted at the end, none before.
        assert [row["unfinished"] for row in result.timeline[:2]] == [0, result.unfinished]

    def test_bench_command_json_plot_and_cgroup_memory(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        cgroup = tmp_path / "cgroup"  # a v2 pod's directory, as `inferop serve --memory --cpus` prints it
        cgroup.mkdir()
        (cgroup / "memory.current").write_text(f"{300 * 2**20}\n")
        (cgroup / "memory.peak").write_text(f"{400 * 2**20}\n")
        (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        (cgroup / "cpu.stat").write_text("usage_usec 9\nnr_periods 50\nnr_throttled 7\nthrottled_usec 350000\n")
        png = tmp_path / "load.png"
        argv = ["bench", "--url", self.url, "--model", "conv_net", "--rate", "20", "--seconds", "1"]
        argv += ["--arrivals", "fixed", "--json", "--plot", str(png), "--memory-cgroup", str(cgroup)]
        assert main([*argv, "--cpu-cgroup", str(cgroup)]) == 0
        answer = json.loads(capsys.readouterr().out)
        assert (answer["sent"], answer["ok"], answer["rate"], answer["process"]) == (20, 20, 20.0, "fixed")
        assert {used for _, used in answer["memory"]} == {300 * 2**20}
        pod = answer["pod"]
        assert (pod["memory_peak_bytes"], pod["oom_kills"], pod["cgroup_version"]) == (400 * 2**20, 1, 2)
        assert (pod["cpu_periods"], pod["cpu_throttled_periods"], pod["cpu_throttled_seconds"]) == (50, 7, 0.35)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    def test_bench_command_table(self, capsys: pytest.CaptureFixture[str]) -> None:
        argv = ["bench", "--url", self.url, "--model", "conv_net", "--rate", "20", "--seconds", "0.5", "--timeout", "0"]
        assert main(argv) == 0
        table = capsys.readouterr().out
        assert "client timeout none" in table
        for label in ("offered", "goodput", "rejected", "timed out", "client timeouts", "unfinished"):
            assert re.search(rf"^  {label} +\S", table, re.M), table
        assert re.search(r"^  success p50/p99 +[\d.]+ / [\d.]+ ms$", table, re.M), table
        assert re.search(r"^  time-to-reject p99 +- ms \(from the send\)$", table, re.M), table
        assert re.search(r"^  generator late p99 +[\d.]+ ms$", table, re.M), table

"""The Triton container's liveness check: its timing derived from the timeouts, its rendering in the Deployment, and
the rendered command itself, run against a server that plays Triton's health and metrics endpoints."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferop_operator import liveness
from inferop_operator.builders import build_deployment
from tests.operator.test_operator_builders import make_service, raw_spec, triton_container


class TestStallCheck:
    @pytest.mark.parametrize("request_seconds", [0.5, 1, 3, 10, 11, 60, 3600])
    def test_two_periods_span_the_request_timeout_and_three_do_not_overshoot(self, request_seconds: float) -> None:
        check = liveness.stall_check(request_seconds, capacity=None, instances=1, samples_per_batch=8)
        assert check.failure_threshold == 3
        assert check.window_seconds == request_seconds
        # A restart needs failureThreshold consecutive failures: at least threshold - 1 whole periods without a
        # completed execution, at most threshold periods.
        assert (check.failure_threshold - 1) * check.period_seconds >= request_seconds
        assert (check.failure_threshold - 1) * check.period_seconds < max(request_seconds, 1) + 2
        assert 1 <= check.timeout_seconds <= min(check.period_seconds, liveness.MAX_TIMEOUT_SECONDS)

    def test_a_fast_pod_keeps_the_request_timeout(self) -> None:
        fast = liveness.stall_check(10, capacity=100.0, instances=1, samples_per_batch=8)  # a batch in 0.08 s
        assert (fast.window_seconds, fast.period_seconds) == (10, 5)

    @pytest.mark.parametrize(("capacity", "instances", "batch", "window"), [(2.0, 1, 8, 8.0), (1.0, 1, 8, 16.0)])
    def test_a_slow_pod_gets_two_batches(self, capacity: float, instances: int, batch: int, window: float) -> None:
        """A batch of 8 at 1 sample/s takes 8 s: a healthy pod completes no execution for that long, however busy,
        so the window must cover it (two of them, for a batch that starts just after a run)."""
        check = liveness.stall_check(5, capacity=capacity, instances=instances, samples_per_batch=batch)
        assert check.window_seconds == max(5, window)
        assert (check.failure_threshold - 1) * check.period_seconds >= check.window_seconds

    def test_each_instance_runs_its_own_batches(self) -> None:
        """Two instances share the pod's capacity: each batch takes twice as long as at one instance."""
        one = liveness.stall_check(1, capacity=8.0, instances=1, samples_per_batch=8)
        two = liveness.stall_check(1, capacity=8.0, instances=2, samples_per_batch=8)
        assert (one.window_seconds, two.window_seconds) == (2.0, 4.0)

    def test_explain(self) -> None:
        check = liveness.stall_check(10, capacity=None, instances=1, samples_per_batch=8)
        assert check.explain() == (
            "restart after no execution completed for 10-15 s while requests waited (every 5 s, 3 failures)"
        )


class TestRenderedProbe:
    @pytest.mark.parametrize("request_seconds", [1, 10, 45])
    def test_an_exec_probe_timed_from_the_spec(self, request_seconds: float) -> None:
        service = make_service(raw_spec(timeouts={"requestSeconds": request_seconds}))
        probe = triton_container(build_deployment(service))["livenessProbe"]
        check = liveness.stall_check(
            request_seconds,
            service.plan.queue.capacity,
            service.spec.instances,
            service.spec.batching.samples_per_batch,
        )
        assert probe == {
            "exec": {"command": liveness.probe_command(check)},
            "periodSeconds": check.period_seconds,
            "timeoutSeconds": check.timeout_seconds,
            "failureThreshold": 3,
        }
        command = probe["exec"]["command"]
        assert command[:4] == ["python3", "-I", "-S", "-c"]
        assert command[5:8] == [
            "http://127.0.0.1:8000/v2/health/live",
            "http://127.0.0.1:8002/metrics",
            liveness.STATE_FILE,
        ]

    def test_the_state_lives_in_the_pods_tmp_emptydir_under_a_read_only_root(self) -> None:
        deployment = build_deployment(make_service(raw_spec()))
        container = triton_container(deployment)
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert "emptyDir" in volumes["tmp"]
        assert Path(liveness.STATE_FILE).parent == Path("/tmp")

    def test_ports_are_the_containers(self) -> None:
        container = triton_container(build_deployment(make_service(raw_spec())))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert liveness.LIVE_URL.startswith(f"http://127.0.0.1:{ports['http']}/")
        assert liveness.METRICS_URL.startswith(f"http://127.0.0.1:{ports['metrics']}/")


# ------------------------------------------------------------------------------------- the command itself


class FakeTriton:
    """/v2/health/live and /metrics as Triton serves them, with settable counters."""

    def __init__(self) -> None:
        self.live_status = 200
        self.executions, self.pending, self.rejected, self.other_failures = 10, 0, 0, 0
        self.reason_labels = True
        self.others: dict[str, tuple[int, int]] = {}  # other models of the server: executions, pending
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/v2/health/live":
                    body, status = b"", fake.live_status
                else:
                    body, status = fake.metrics().encode(), 200
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def metrics(self) -> str:
        lines = self.model_metrics('model="m",version="1"', self.executions, self.pending, self.rejected)
        for name, (executions, pending) in self.others.items():
            lines += self.model_metrics(f'model="{name}",version="1"', executions, pending, 0)
        return "\n".join(["# HELP nv_inference_exec_count Number of model executions performed", *lines, ""])

    def model_metrics(self, labels: str, executions: int, pending: int, rejected: int) -> list[str]:
        if self.reason_labels:
            failures = [
                f'nv_inference_request_failure{{{labels},reason="{reason}"}} {count}'
                for reason, count in (("REJECTED", rejected), ("BACKEND", self.other_failures))
            ]
        else:  # Triton before the reason label
            failures = [f"nv_inference_request_failure{{{labels}}} {rejected + self.other_failures}"]
        return [
            f"nv_inference_exec_count{{{labels}}} {executions}",
            f"nv_inference_pending_request_count{{{labels}}} {pending}",
            *failures,
            f"nv_inference_request_success{{{labels}}} {executions * 3}",
        ]


@pytest.fixture
def fake() -> Iterator[FakeTriton]:
    server = FakeTriton()
    yield server
    server.httpd.shutdown()


def run_probe(fake: FakeTriton, state: Path, period: int = 5, port: int | None = None) -> tuple[bool, str]:
    """The rendered command, its addresses and state file replaced by the fake's and a temporary one."""
    check = liveness.StallCheck(
        window_seconds=2 * period, period_seconds=period, failure_threshold=3, timeout_seconds=2
    )
    url = f"http://127.0.0.1:{port or fake.port}"
    command = [
        {liveness.LIVE_URL: f"{url}/v2/health/live", liveness.METRICS_URL: f"{url}/metrics"}.get(
            arg, str(state) if arg == liveness.STATE_FILE else arg
        )
        for arg in liveness.probe_command(check)
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=10, cwd=state.parent, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0, done.stdout.strip()


class TestProbeCommand:
    def test_first_run_passes_and_keeps_only_its_state(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        assert run_probe(fake, state) == (True, "")
        assert sorted(os.listdir(tmp_path)) == ["state.json"]  # nothing else written, anywhere it runs from
        assert json.loads(state.read_text())["models"]["m"]["executions"] == 10

    def test_executions_completing_pass_however_many_wait(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.pending, fake.rejected = 500, 40  # a full queue, timeouts: overload, but the model works
        for _ in range(3):
            fake.executions += 1
            assert run_probe(fake, state)[0]

    def test_no_execution_while_requests_are_pending_fails(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.pending = 7
        ok, output = run_probe(fake, state)
        assert not ok
        assert "no execution of model m completed" in output
        assert "7 pending" in output
        assert not run_probe(fake, state)[0]  # and again, each period it stays so: the kubelet counts them
        fake.executions += 1
        assert run_probe(fake, state)[0]

    def test_a_model_stalled_behind_a_busy_one_fails(self, fake: FakeTriton, tmp_path: Path) -> None:
        """An image pipeline: its decoding stage goes on completing requests, which then wait for the hung model."""
        state = tmp_path / "state.json"
        fake.others["m_pre"] = (100, 0)
        run_probe(fake, state)
        fake.others["m_pre"], fake.pending = (140, 2), 40
        ok, output = run_probe(fake, state)
        assert (ok, output.startswith("no execution of model m completed")) == (False, True), output
        fake.executions, fake.others["m_pre"] = fake.executions + 1, (180, 2)
        assert run_probe(fake, state)[0]
        fake.others["m_pre"] = (180, 3)  # now the stage stalls, the model working
        fake.executions += 1
        ok, output = run_probe(fake, state)
        assert (ok, output.startswith("no execution of model m_pre completed")) == (False, True), output

    def test_no_execution_while_requests_time_out_fails(self, fake: FakeTriton, tmp_path: Path) -> None:
        """With a queue timeout the pending gauge drains at each expiry: the timed-out requests still waited."""
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.rejected += 3
        ok, output = run_probe(fake, state)
        assert (ok, "3 timed out of the queue" in output) == (False, True)

    def test_failures_without_the_reason_label_count_as_timeouts(self, fake: FakeTriton, tmp_path: Path) -> None:
        fake.reason_labels = False
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.rejected += 2
        assert not run_probe(fake, state)[0]

    def test_other_failures_are_not_waiting_requests(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.other_failures += 5
        assert run_probe(fake, state)[0]

    def test_idle_passes(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        for _ in range(3):
            assert run_probe(fake, state) == (True, "")

    def test_a_restarted_server_starts_over(self, fake: FakeTriton, tmp_path: Path) -> None:
        """The pod's /tmp outlives a container restart: counters that went down are a new server."""
        state = tmp_path / "state.json"
        run_probe(fake, state)
        fake.executions, fake.pending = 2, 4  # the new server's warm-up, and callers already queued
        assert run_probe(fake, state)[0]
        assert not run_probe(fake, state)[0]  # from there on, it is judged again

    def test_a_stale_state_starts_over(self, fake: FakeTriton, tmp_path: Path) -> None:
        state = tmp_path / "state.json"
        run_probe(fake, state, period=1)
        saved = json.loads(state.read_text())
        state.write_text(json.dumps({**saved, "time": time.time() - 10}))  # runs were missed
        fake.pending = 3
        assert run_probe(fake, state, period=1)[0]

    def test_not_live_fails(self, fake: FakeTriton, tmp_path: Path) -> None:
        fake.live_status = 503
        ok, output = run_probe(fake, tmp_path / "state.json")
        assert not ok
        assert output.startswith("tritonserver does not answer: http://127.0.0.1:")
        assert output.endswith("/v2/health/live answered 'HTTP/1.0 503 Service Unavailable'")

    def test_no_server_fails(self, fake: FakeTriton, tmp_path: Path) -> None:
        fake.httpd.shutdown()
        fake.httpd.server_close()
        ok, output = run_probe(fake, tmp_path / "state.json")
        assert not ok
        assert output.startswith("tritonserver does not answer")

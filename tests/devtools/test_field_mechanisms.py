"""The mechanisms behind `make field`, where they live (inferop_devtools.field), small and fast against the real
tritonserver: a stalled model that answers 503 in time while Triton's metrics show the stall, and the pod's own
figures of its work. The kubelet's side (the rendered liveness probe restarting a stalled pod and leaving a busy one
alone) is tested on the local cluster's node, in tests/node."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from inferop.limits import PodLimits, cgroup_unavailable_reason
from tests.helpers import ExportedRepo, wait_for

CGROUPS = cgroup_unavailable_reason()

pytestmark = pytest.mark.integration


def served_copy(model_repo: ExportedRepo, model: str, target: Path, **settings: object):  # type: ignore[no-untyped-def]
    """The exported `model` under other serving settings, in a repository of its own."""
    from inferop.serving.localrepo import write_model_repo

    serving = model_repo.reports[model].serving.model_copy(update=settings)
    write_model_repo(serving, model_repo.path / model, target)
    return serving


SUCCESS, PENDING = "nv_inference_request_success", "nv_inference_pending_request_count"


def test_a_stalled_model_answers_503_in_time_and_shows_in_the_metrics(model_repo: ExportedRepo, tmp_path: Path) -> None:
    """While the stall file exists every execution blocks: queued requests get Triton's 503 once their queue
    timeout passes, pending requests show in the metrics, successes stop; without the file it serves again."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import TritonServer, free_port

    timeout_s = 1.0
    serving = served_copy(
        model_repo, "conv_net", tmp_path / "repo", request_timeout_microseconds=int(timeout_s * 1e6), max_queue_size=8
    )
    board = np.zeros((1, *serving.inputs[0].dims), dtype=np.float32)
    stall_file = tmp_path / "stall"
    env = {"INFEROP_FAULT_STALL_FILE": str(stall_file)}
    with TritonServer(tmp_path / "repo", http_port=free_port(), env=env) as server:

        def metric(name: str) -> float:
            return server.metrics("conv_net", name)[name]

        success_before = metric(SUCCESS)
        stall_file.touch()
        answers: list[tuple[str, float]] = []

        def call() -> None:
            client = httpclient.InferenceServerClient(server.url, network_timeout=30)
            request = httpclient.InferInput(serving.inputs[0].name, list(board.shape), "FP32")
            request.set_data_from_numpy(board)
            began = time.monotonic()
            try:
                client.infer("conv_net", [request])
                answers.append(("ok", time.monotonic() - began))
            except InferenceServerException as error:
                answers.append((f"{error.status()} {error.message()}", time.monotonic() - began))
            finally:
                client.close()

        callers = [threading.Thread(target=call) for _ in range(3)]
        callers[0].start()
        held = Path(f"{stall_file}.held")
        wait_for(held.exists, timeout=10, what="the first request held by the stalled execution")
        for caller in callers[1:]:
            caller.start()
        wait_for(
            lambda: metric(PENDING) > 0,
            timeout=10,
            what="pending requests in the metrics",
        )
        # The two requests queued behind the held one time out in the queue.
        wait_for(lambda: len(answers) >= 2, timeout=timeout_s + 10, what="503 answers for the queued requests")
        timed_out = [seconds for text, seconds in answers if "Request timeout expired" in text]
        assert len(timed_out) == 2, answers
        assert max(timed_out) < timeout_s + 2.0
        assert metric(SUCCESS) == success_before

        os.unlink(stall_file)
        for caller in callers:
            caller.join(30)
        assert "ok" in {text for text, _ in answers}, answers  # the held request finishes once released
        assert metric(SUCCESS) > success_before


@pytest.mark.skipif(CGROUPS is not None, reason=str(CGROUPS))
def test_the_pods_own_figures_match_what_its_callers_got(model_repo: ExportedRepo, tmp_path: Path) -> None:
    """The overload drill's capacity in the run, read from the real server in a pod's cgroup: every sample the
    callers got answered is a sample Triton computed, closed-loop callers beyond a batch fill the batches, the rate
    of full batches is at least the rate the callers saw, and the model's instance uses part of the pod's CPU."""
    from inferop import bench
    from inferop.openloop import run_open_loop
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_devtools.field.work import Snapshot, snapshot, work_between

    serving = served_copy(
        model_repo, "conv_net", tmp_path / "repo", max_batch_size=8, max_queue_size=8, instances=1, intra_op_threads=1
    )
    board = np.zeros((1, *serving.inputs[0].dims), dtype=np.float32)
    with TritonServer(tmp_path / "repo", http_port=free_port(), limits=PodLimits(cpus=0.25)) as server:
        assert server.cgroup is not None and server.process is not None

        def now() -> Snapshot:
            assert server.cgroup is not None and server.process is not None
            return snapshot(server.url, "conv_net", server.cgroup.pids(), server.process.pid)

        before = now()
        closed = bench.sweep(server.url, "conv_net", [16], 5.0, batch=1)[0]
        calm = work_between(before, now(), 8, 1)
        before = now()
        flood = run_open_loop(server.url, "conv_net", board, 1000.0, 5.0, timeout=10.0)
        flooded = work_between(before, now(), 8, 1)
    assert (calm.computed, flooded.computed) == (closed.requests, flood.ok), (calm, flooded)
    assert flood.rejected > 0, "not overloaded"
    assert calm.full_batch_share is not None and calm.full_batch_share > 0.5, calm
    assert calm.full_batch_rate is not None and calm.full_batch_rate >= closed.throughput, (calm, closed.throughput)
    for work in (calm, flooded):
        assert work.model_cpu_share is not None and 0 < work.model_cpu_share < 1, work


def resident_mib(pid: int) -> float:
    """Resident memory of process `pid` and its children (Triton's python stubs), in MiB."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    total = 0
    for each in [pid, *map(int, children)]:
        status = Path(f"/proc/{each}/status").read_text()
        total += int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
    return total / 1024


def test_armed_faults_act_only_once_their_file_is_made(model_repo: ExportedRepo, tmp_path: Path) -> None:
    """The rollout drill's late faults: before the arm file exists the model answers every board and keeps its
    memory; once it is made, a board holding the fail value fails, the others are answered, and each execution
    keeps the leak's MiB."""
    from http.client import HTTPException

    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    from inferop.serving.tritonserver import TritonServer, free_port

    serving = served_copy(model_repo, "conv_net", tmp_path / "repo")
    plain = np.zeros((1, *serving.inputs[0].dims), dtype=np.float32)
    marked = plain.copy()
    marked.flat[0] = 0.5
    arm_file = tmp_path / "armed"
    env = {"INFEROP_FAULT_ARM_FILE": str(arm_file), "INFEROP_FAULT_FAIL_VALUE": "0.5", "INFEROP_FAULT_LEAK_MIB": "64"}

    def answered(url: str, board: np.ndarray) -> bool:
        client = httpclient.InferenceServerClient(url, network_timeout=30)
        request = httpclient.InferInput(serving.inputs[0].name, list(board.shape), "FP32")
        request.set_data_from_numpy(board)
        try:
            client.infer("conv_net", [request])
            return True
        except (InferenceServerException, HTTPException, OSError):  # an error answer, or the connection closed
            return False
        finally:
            client.close()

    with TritonServer(tmp_path / "repo", http_port=free_port(), env=env) as server:
        assert server.process is not None
        before = resident_mib(server.process.pid)
        assert answered(server.url, marked) and answered(server.url, plain)
        assert resident_mib(server.process.pid) < before + 64
        arm_file.touch()
        assert not answered(server.url, marked)
        assert answered(server.url, plain) and answered(server.url, plain)
        assert resident_mib(server.process.pid) > before + 2.5 * 64  # three executions armed, 64 MiB each


def test_the_tail_fault_delays_a_share_of_executions(model_repo: ExportedRepo, tmp_path: Path) -> None:
    """The rollout drill's p99 regression: about INFEROP_FAULT_TAIL_SHARE of the executions take INFEROP_FAULT_TAIL_MS
    more (each drawn alone), the others none."""
    import tritonclient.http as httpclient

    from inferop.serving.tritonserver import TritonServer, free_port

    serving = served_copy(model_repo, "conv_net", tmp_path / "repo")
    board = np.zeros((1, *serving.inputs[0].dims), dtype=np.float32)
    env = {"INFEROP_FAULT_TAIL_SHARE": "0.5", "INFEROP_FAULT_TAIL_MS": "400"}
    with TritonServer(tmp_path / "repo", http_port=free_port(), env=env) as server:
        client = httpclient.InferenceServerClient(server.url, network_timeout=30)
        request = httpclient.InferInput(serving.inputs[0].name, list(board.shape), "FP32")
        request.set_data_from_numpy(board)
        took = []
        for _ in range(40):  # one at a time: each request an execution of its own
            began = time.perf_counter()
            client.infer("conv_net", [request])
            took.append(time.perf_counter() - began)
        client.close()
    delayed = sum(1 for seconds in took if seconds >= 0.4)
    assert 8 <= delayed <= 32, took  # Binomial(40, 0.5): outside with a chance of 2e-4

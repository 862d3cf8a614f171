"""The mechanisms behind `make field`, small and fast: the memory model against a peak the kernel measured,
and a stalled model that answers 503 in time while Triton's metrics show the stall."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from inferop.limits import PodLimits, cgroup_unavailable_reason
from inferop.memory import LOCAL_RUNTIME, ModelCosts, ServingShape, estimate_memory
from tests.conftest import ExportedRepo, RunningServer, wait_for

CGROUPS = cgroup_unavailable_reason()

pytestmark = pytest.mark.integration


def served_copy(model_repo: ExportedRepo, model: str, target: Path, **settings: object):  # type: ignore[no-untyped-def]
    """The exported `model` under other serving settings, in a repository of its own."""
    from inferop.serving.localrepo import write_model_repo

    serving = model_repo.reports[model].serving.model_copy(update=settings)
    write_model_repo(serving, model_repo.path / model, target)
    return serving


@pytest.mark.skipif(CGROUPS is not None, reason=str(CGROUPS))
def test_memory_model_predicts_the_measured_peak(
    model_repo: ExportedRepo, triton: RunningServer, tmp_path: Path
) -> None:
    """Inception V3 (1 instance, batch 8, queue 16) in a memory cgroup: idle and with its queue full, the
    estimate is within the +-25% the model promises. `triton` has already read the files, as a node has."""
    from inferop.openloop import run_open_loop
    from inferop.serving.tritonserver import TritonServer, free_port

    serving = served_copy(
        model_repo, "inception_v3", tmp_path / "repo", intra_op_threads=1, max_queue_size=16, memory_pattern=False
    )
    profile = model_repo.reports["inception_v3"].profile
    costs = ModelCosts(
        weight_bytes=profile.weight_bytes,
        activation_bytes_per_sample=profile.activation_bytes_per_sample,
        io_bytes_per_sample=sum(t.bytes_per_sample for t in (*serving.inputs, *serving.outputs)),
    )
    shape = ServingShape(instances=1, max_batch_size=8, queue_bound=16)
    with TritonServer(tmp_path / "repo", http_port=free_port(), limits=PodLimits(memory_bytes=4 * 2**30)) as server:
        assert server.cgroup is not None
        idle = server.cgroup.memory_peak()
        data = np.zeros((1, 3, 299, 299), dtype=np.float32)
        result = run_open_loop(server.url, "inception_v3", data, rate=40.0, seconds=4.0, timeout=30.0, drain=0.0)
        saturated = server.cgroup.memory_peak()
    assert result.rejected > 0, "the queue never filled: the test did not saturate the server"
    for state, measured in (("idle", idle), ("saturated", saturated)):
        estimate = estimate_memory(costs, shape, LOCAL_RUNTIME, saturated=state == "saturated").total
        assert abs(estimate / measured - 1) <= 0.25, f"{state}: estimate {estimate} against measured {measured}"


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

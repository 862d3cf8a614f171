"""The exported models served by the real tritonserver: what a caller sees over HTTP.

Answers are compared with ONNX Runtime run in-process on the same model.onnx, and counters as differences
(warm-up counts in Triton's statistics and metrics).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferop_core.objectstore import sha256_file
from tests.helpers import SERVING, TINY_BOARD, ExportedRepo, RunningServer, wait_for

pytestmark = pytest.mark.integration

INFEROP = Path(sys.executable).with_name("inferop")
INPUTS = {"conv_net": "board", "inception_v3": "images"}
OUTPUTS = {"conv_net": ("policy", "value"), "inception_v3": ("logits",)}


def sample(model_repo: ExportedRepo, model: str, batch: int, seed: int) -> np.ndarray:
    """Inputs like the export's: boards of -1/0/1 stones, roughly standard normal (normalised) images."""
    (spec,) = model_repo.reports[model].serving.inputs
    rng = np.random.default_rng(seed)
    if model == "conv_net":
        return rng.integers(-1, 2, size=(batch, *spec.dims)).astype(np.float32)
    return rng.standard_normal((batch, *spec.dims)).astype(np.float32)


def infer(client: Any, model: str, data: np.ndarray, **kwargs: Any) -> Any:
    import tritonclient.http as httpclient

    request = httpclient.InferInput(INPUTS[model], list(data.shape), "FP32")
    request.set_data_from_numpy(data, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in OUTPUTS[model]]
    return client.infer(model, [request], outputs=outputs, **kwargs)


def new_client(triton: RunningServer) -> Any:
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(triton.url, connection_timeout=10, network_timeout=60)


def model_stats(client: Any, model: str) -> dict[str, Any]:
    return dict(client.get_inference_statistics(model)["model_stats"][0])


@pytest.fixture(scope="module")
def onnxruntime_reference(model_repo: ExportedRepo) -> Callable[[str, np.ndarray], dict[str, np.ndarray]]:
    """ONNX Runtime in this process on each served model.onnx: name -> outputs for an input batch."""
    import onnxruntime as ort

    sessions = {
        model: ort.InferenceSession(str(model_repo.model_path(model)), providers=["CPUExecutionProvider"])
        for model in model_repo.reports
    }

    def run(model: str, data: np.ndarray) -> dict[str, np.ndarray]:
        session = sessions[model]
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, {INPUTS[model]: data}), strict=True))

    return run


def infer_command(triton: RunningServer, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`inferop infer` against the server, as a user runs it; fails the test on a non-zero exit if `check`."""
    command = [str(INFEROP), "infer", "--url", triton.url, *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert not check or result.returncode == 0, result.stderr
    return result


def process_group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:  # ended while we looked
        return None


class TestModelsAndConfig:
    def test_both_models_are_ready(self, client: Any, model_repo: ExportedRepo) -> None:
        assert client.is_server_ready()
        assert sorted(model_repo.reports) == ["conv_net", "inception_v3"]
        for model in model_repo.reports:
            assert client.is_model_ready(model), model

    def test_server_and_its_stubs_run_under_sched_batch(self, triton: RunningServer) -> None:
        """As the operator's pods run them: the batcher then starts the next batch at once under overload."""
        group = os.getpgid(triton.server.process.pid)  # its own process group, the stubs included
        members = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc"))) if process_group(pid) == group]
        assert len(members) >= 3  # the server and a stub per model
        assert {os.sched_getscheduler(pid) for pid in members} == {os.SCHED_BATCH}

    @pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
    def test_config_shows_the_renderers_settings(self, client: Any, model_repo: ExportedRepo, model: str) -> None:
        served = model_repo.reports[model].serving
        settings = SERVING[model]  # the fixture's settings, as a spec spells them
        assert (served.instances, served.intra_op_threads, served.inter_op_threads) == (
            settings["instances"],
            settings["threads"]["intraOp"],
            settings["threads"]["interOp"],
        )
        assert (served.max_batch_size, served.max_queue_delay_microseconds, served.max_queue_size) == tuple(
            settings["batching"][key] for key in ("maxBatchSize", "maxQueueDelayMicroseconds", "maxQueueSize")
        )
        assert served.request_timeout_microseconds == settings["timeouts"]["requestSeconds"] * 1e6
        config = client.get_model_config(model)
        assert config["backend"] == "python"
        assert config["max_batch_size"] == served.max_batch_size
        assert [(i["name"], [int(d) for d in i["dims"]]) for i in config["input"]] == [
            (s.name, list(s.dims)) for s in served.inputs
        ]
        assert [(o["name"], [int(d) for d in o["dims"]], o["label_filename"]) for o in config["output"]] == [
            (s.name, list(s.dims), s.label_filename or "") for s in served.outputs
        ]
        assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(served.instances, "KIND_CPU")]
        batching = config["dynamic_batching"]
        assert int(batching["max_queue_delay_microseconds"]) == served.max_queue_delay_microseconds
        assert batching["default_queue_policy"] == {
            "timeout_action": "REJECT",
            "default_timeout_microseconds": served.request_timeout_microseconds,
            "allow_timeout_override": True,
            "max_queue_size": served.max_queue_size,
        }
        assert config["parameters"] == {
            "intra_op_thread_count": {"string_value": str(served.intra_op_threads)},
            "inter_op_thread_count": {"string_value": str(served.inter_op_threads)},
            "execution_mode": {"string_value": "1" if (served.inter_op_threads or 0) > 1 else "0"},
            "enable_mem_pattern": {"string_value": "0"},
            "inferop_weights": {"string_value": "random (seed 0)"},  # read by `inferop infer`, ignored by the backend
            "inferop_processing": {"string_value": served.processing.to_parameter()},  # read by `inferop infer` too
            "inferop_model_sha256": {"string_value": sha256_file(Path(model_repo.reports[model].model_path))},
        }
        assert sorted(int(w["batch_size"]) for w in config["model_warmup"]) == [1, served.max_batch_size]


class TestInference:
    @pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
    def test_batch_one_matches_onnxruntime(
        self, client: Any, model_repo: ExportedRepo, onnxruntime_reference: Any, model: str
    ) -> None:
        data = sample(model_repo, model, batch=1, seed=11)
        response = infer(client, model, data)
        expected = onnxruntime_reference(model, data)
        tolerance = model_repo.reports[model].tolerance
        assert sorted(o["name"] for o in response.get_response()["outputs"]) == sorted(expected)
        for name, want in expected.items():
            got = response.as_numpy(name)
            assert got.shape == want.shape
            assert np.abs(want).max() > 0
            np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=f"{model}/{name}")

    def test_concurrent_requests_are_batched_and_answered_each_their_own(
        self, triton: RunningServer, client: Any, model_repo: ExportedRepo, onnxruntime_reference: Any
    ) -> None:
        callers = 8
        boards = [sample(model_repo, "conv_net", batch=1, seed=100 + i) for i in range(callers)]
        answers: dict[int, Any] = {}
        errors: list[BaseException] = []
        gate = threading.Barrier(callers)

        def caller(index: int) -> None:
            own = new_client(triton)
            try:
                gate.wait(timeout=30)
                answers[index] = infer(own, "conv_net", boards[index])
            except BaseException as error:
                errors.append(error)
            finally:
                own.close()

        before = model_stats(client, "conv_net")
        threads = [threading.Thread(target=caller, args=(i,)) for i in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        after = model_stats(client, "conv_net")

        assert errors == []
        assert sorted(answers) == list(range(callers))
        requests = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
        executions = after["execution_count"] - before["execution_count"]
        assert requests == callers
        assert after["inference_count"] - before["inference_count"] == callers
        assert 1 <= executions < requests  # the dynamic batcher merged some of them
        for index, board in enumerate(boards):
            for name, want in onnxruntime_reference("conv_net", board).items():
                np.testing.assert_allclose(answers[index].as_numpy(name), want, rtol=0, atol=1e-4)

    def test_wrong_input_shape_is_refused_with_400_and_the_servers_reason(self, client: Any) -> None:
        from tritonclient.utils import InferenceServerException

        with pytest.raises(InferenceServerException) as error:
            infer(client, "conv_net", np.zeros((1, 1, 7, 5), dtype=np.float32))
        assert error.value.status() == "400"
        assert "unexpected shape for input 'board'" in error.value.message()
        assert "Expected [-1,1,6,5], got [1,1,7,5]" in error.value.message()


class TestQueueTimeout:
    # Longer than the batcher's queue delay (an idle model answers in time), far shorter than a batch of 8
    # Inception images (a busy model does not).
    TIMEOUT_US = 100_000

    def test_idle_model_answers_within_the_timeout(self, client: Any, model_repo: ExportedRepo) -> None:
        assert SERVING["inception_v3"]["batching"]["maxQueueDelayMicroseconds"] < self.TIMEOUT_US
        response = infer(client, "inception_v3", sample(model_repo, "inception_v3", 1, seed=5), timeout=self.TIMEOUT_US)
        assert response.as_numpy("logits").shape == (1, 1000)

    def test_request_queued_behind_a_busy_instance_is_rejected_not_left_hanging(
        self, triton: RunningServer, client: Any, model_repo: ExportedRepo
    ) -> None:
        from tritonclient.utils import InferenceServerException

        assert SERVING["inception_v3"]["instances"] == 1
        big = sample(model_repo, "inception_v3", batch=8, seed=6)
        busy_answers: list[Any] = []
        busy_errors: list[BaseException] = []

        def keep_busy() -> None:
            own = new_client(triton)
            try:
                busy_answers.append(infer(own, "inception_v3", big))
            except BaseException as error:
                busy_errors.append(error)
            finally:
                own.close()

        before = model_stats(client, "inception_v3")
        threads = [threading.Thread(target=keep_busy) for _ in range(3)]  # three full batches, one at a time
        for thread in threads:
            thread.start()
        # Once the first batch is done the second runs and the third waits: a batch or more is ahead of us.
        wait_for(
            lambda: model_stats(client, "inception_v3")["execution_count"] > before["execution_count"],
            timeout=60,
            what="the first batch of 8 to finish",
            interval=0.01,
        )
        with pytest.raises(InferenceServerException) as error:
            infer(client, "inception_v3", sample(model_repo, "inception_v3", 1, seed=7), timeout=self.TIMEOUT_US)
        for thread in threads:
            thread.join(timeout=60)
        after = model_stats(client, "inception_v3")

        assert error.value.status() == "503"
        assert "Request timeout expired" in error.value.message()
        assert busy_errors == []
        assert [a.as_numpy("logits").shape for a in busy_answers] == [(8, 1000)] * 3
        assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1


class TestStatistics:
    @pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
    def test_warmup_is_counted_before_any_request(self, triton: RunningServer, model: str) -> None:
        initial = triton.initial_statistics[model]
        max_batch = SERVING[model]["batching"]["maxBatchSize"]
        assert initial["inference_count"] == 1 + max_batch  # warm-up batches of 1 and max_batch_size
        assert initial["execution_count"] == 2

    def test_count_exactly_the_requests_sent(self, client: Any, model_repo: ExportedRepo) -> None:
        before = model_stats(client, "conv_net")
        batches = [1, 3, 2]
        for seed, batch in enumerate(batches):
            infer(client, "conv_net", sample(model_repo, "conv_net", batch, seed))
        after = model_stats(client, "conv_net")

        def delta(*keys: str) -> int:
            a: Any = before
            b: Any = after
            for key in keys:
                a, b = a[key], b[key]
            return int(b) - int(a)

        assert delta("inference_stats", "success", "count") == len(batches)
        assert delta("inference_stats", "fail", "count") == 0
        assert delta("inference_count") == sum(batches)
        assert delta("execution_count") == len(batches)  # one at a time: nothing to merge

    def test_metrics_endpoint_counts_successful_requests(
        self, triton: RunningServer, client: Any, model_repo: ExportedRepo
    ) -> None:
        pattern = re.compile(r'^nv_inference_request_success\{model="conv_net",version="1"\} (\d+)', re.MULTILINE)

        def successes() -> int:
            with urllib.request.urlopen(triton.server.metrics_url, timeout=10) as response:
                text = response.read().decode()
            match = pattern.search(text)
            assert match, f"no nv_inference_request_success for conv_net in:\n{text[:2000]}"
            return int(match.group(1))

        before = successes()
        for seed in range(2):
            infer(client, "conv_net", sample(model_repo, "conv_net", 1, seed))
        wait_for(lambda: successes() - before == 2, timeout=10, what="the metrics to count 2 more requests")


class TestInferCommand:
    def test_classifies_an_image_with_five_labels(
        self, triton: RunningServer, model_repo: ExportedRepo, onnxruntime_reference: Any, tmp_path: Path
    ) -> None:
        from PIL import Image

        from inferop.client import preprocess_image, softmax
        from inferop_export.networks.inception_v3 import PROCESSING

        image = tmp_path / "noise.png"
        rng = np.random.default_rng(8)
        Image.fromarray(rng.integers(0, 256, size=(360, 420, 3), dtype=np.uint8)).save(image)
        result = infer_command(triton, "--model", "inception_v3", str(image))
        lines = result.stdout.splitlines()
        assert lines[0] == str(image)
        printed = [re.fullmatch(r"\s+(\d)\. (.+?)\s+(\d\.\d{4})", line) for line in lines[1:6]]
        assert all(printed) and len(printed) == 5, result.stdout
        # The session's Inception has seeded random weights: the answer must not pass for a classification.
        assert lines[6:] == ["weights: random (seed 0); the labels show the pipeline working, not accuracy"]
        ranks = [int(m.group(1)) for m in printed if m]
        labels = [m.group(2) for m in printed if m]
        probabilities = [float(m.group(3)) for m in printed if m]
        assert ranks == [1, 2, 3, 4, 5]

        logits = onnxruntime_reference("inception_v3", preprocess_image(image, 299, PROCESSING)[None])["logits"][0]
        expected = softmax(logits.astype(np.float64))
        top = np.argsort(-expected)[:5]
        categories = (model_repo.path / "inception_v3" / "labels.txt").read_text().splitlines()
        assert labels == [categories[i] for i in top]
        assert probabilities == pytest.approx([expected[i] for i in top], abs=1e-4)

    def test_an_image_classifier_called_without_an_image_classifies_the_drawn_picture(
        self, triton: RunningServer
    ) -> None:
        result = infer_command(triton, "--model", "inception_v3", "--json")
        (answer,) = json.loads(result.stdout)
        assert answer["image"] == "sample picture (drawn)"
        assert len(answer["top"]) == 5

    def test_waiting_for_a_model_the_server_does_not_have_ends_with_why(self, triton: RunningServer) -> None:
        result = infer_command(triton, "--model", "no_such_model", "--wait", "1", check=False)
        assert result.returncode == 1
        assert f"{triton.url}: not ready within --wait 1 s (model 'no_such_model' is not ready)" in result.stderr

    def test_a_flag_of_another_kind_of_model_is_refused(self, triton: RunningServer) -> None:
        result = infer_command(triton, "--model", "conv_net", "--input", "board=x.npy", check=False)
        assert result.returncode == 1
        assert "model 'conv_net' declares policyValue processing: --input does not apply to it" in result.stderr

    def test_plays_a_board(self, triton: RunningServer, onnxruntime_reference: Any, tmp_path: Path) -> None:
        board = np.array(TINY_BOARD)
        path = tmp_path / "board.txt"
        np.savetxt(path, board, fmt="%d")
        result = infer_command(triton, "--model", "conv_net", "--board", str(path), "--json")
        answer = json.loads(result.stdout)
        expected = onnxruntime_reference("conv_net", board.astype(np.float32)[None, None])
        np.testing.assert_allclose(answer["policy"], expected["policy"][0], atol=1e-5)
        assert answer["bestMove"] == int(np.argmax(expected["policy"][0]))
        assert answer["value"] == pytest.approx(float(expected["value"][0, 0]), abs=1e-5)
        assert answer["weights"] == "random (seed 0)"

    def test_a_board_answer_says_the_weights_are_random(self, triton: RunningServer) -> None:
        result = infer_command(triton, "--model", "conv_net")
        lines = result.stdout.splitlines()
        assert lines[0].startswith("policy  0:")
        assert lines[-1] == (
            "weights: random (seed 0); policy and value show the pipeline working, not playing strength"
        )


class TestBenchCommand:
    def test_every_answer_is_counted_as_triton_counted_it(self, triton: RunningServer, client: Any) -> None:
        from inferop import bench

        before = model_stats(client, "conv_net")["inference_stats"]["success"]["count"]
        (level,) = bench.sweep(triton.url, "conv_net", [4], seconds=2.0, batch=1)
        after = model_stats(client, "conv_net")["inference_stats"]["success"]["count"]
        assert (level.errors, level.rejected, level.first_error) == (0, 0, None)
        assert level.requests == int(after) - int(before) > 0
        assert level.throughput == pytest.approx(level.requests / level.seconds, rel=1e-3)  # seconds in ms
        assert 0 < level.p50_ms <= level.p99_ms
        assert level.mean_batch > 1  # four callers at once meet in the dynamic batcher
        assert 0 < level.client_cpu_ms < level.p50_ms

    def test_a_full_queue_s_answers_are_rejections_not_errors(self, triton: RunningServer) -> None:
        """More callers than the queue bound and the executing batch hold: Triton answers the rest 503 at once."""
        bound = SERVING["conv_net"]["batching"]["maxQueueSize"]
        (level,) = bench_command(triton, "--concurrency", str(4 * bound), "--seconds", "2", "--json")["levels"]
        assert level["rejected"] > 0 and level["requests"] > 0
        assert (level["errors"], level["first_error"]) == (0, None)


def bench_command(triton: RunningServer, *args: str) -> dict[str, Any]:
    """`inferop bench` against the server's conv net, as a user runs it, with --json."""
    command = [str(INFEROP), "bench", "--url", triton.url, "--model", "conv_net", *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    figures: dict[str, Any] = json.loads(result.stdout)
    return figures

"""What the tests share beyond fixtures: the tiny conv net's sizes, the integration repository's serving settings,
the exported repository and running server the fixtures hand out, and a poller that fails naming what it waited for."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeVar

import pytest

from inferop_core.processing import Processing

T = TypeVar("T")

# A policy/value net small enough to export in a couple of seconds.
TINY = {"rows": 6, "cols": 5, "depth": 2, "hidden": 8, "moves": 5}
MODEL_BUCKET = "models"  # the S3 server fixture's bucket
# A position on the tiny conv net's board (TINY's 6 rows, 5 columns): 1 the side to move, -1 the other.
TINY_BOARD = [
    [0, 1, -1, 0, 0],
    [1, 1, 0, 0, -1],
    [0, 0, 0, 0, 0],
    [-1, 0, 1, 0, 0],
    [0, 0, 0, 0, 1],
    [1, -1, 0, 0, 0],
]

# Serving settings of the integration repository, as an InferenceService spec spells them. The queue delay is
# long enough that concurrent batch-1 requests meet in the dynamic batcher; one instance each, so a long
# request keeps the model busy.
SERVING: dict[str, dict[str, Any]] = {
    "conv_net": {
        "instances": 1,
        "threads": {"intraOp": 1, "interOp": 1},
        "batching": {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 20_000, "maxQueueSize": 32},
        "timeouts": {"requestSeconds": 5.0},
    },
    "inception_v3": {
        "instances": 1,
        "threads": {"intraOp": 2, "interOp": 1},
        "batching": {"maxBatchSize": 8, "maxQueueDelayMicroseconds": 20_000, "maxQueueSize": 16},
        "timeouts": {"requestSeconds": 10.0},
    },
}

SERVE_EXTRA = "install the serving extra: .venv/bin/pip install -e '.[serve]' (or make install)"
NO_GPU = "no NVIDIA GPU with onnxruntime-gpu's CUDA provider here: scripts/gpu-check.sh runs the gpu tier"
EXPORT_EXTRA = "install the export distribution (torch, ONNX): .venv/bin/pip install -e ./export (or make install)"


def wait_for(probe: Callable[[], T | None], timeout: float = 20.0, what: str = "condition", interval: float = 0.1) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what} (last: {result!r})")
        time.sleep(interval)


@dataclass(frozen=True)
class ExportedRepo:
    path: Path
    reports: dict[str, Any]  # model name -> inferop_export.exporter.ExportReport

    def model_path(self, model: str) -> Path:
        return Path(self.reports[model].model_path)


@dataclass(frozen=True)
class PipelineRepo:
    path: Path
    config: Any  # inferop_core.tritonconfig.PipelineConfig


@dataclass(frozen=True)
class RunningServer:
    server: Any  # inferop.serving.tritonserver.TritonServer
    initial_statistics: dict[str, dict[str, Any]]  # per model, read right after the server became ready

    @property
    def url(self) -> str:
        return str(self.server.url)


@contextmanager
def serving(repo: Path) -> Iterator[str]:
    """A real tritonserver on `repo` at a free port, by its URL (skipped without the serving extra)."""
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)
    from inferop.serving.tritonserver import TritonServer, free_port

    with TritonServer(repo, http_port=free_port()) as running:
        yield str(running.url)


@contextmanager
def stopped_by_sigterm(process: subprocess.Popen[bytes], output: Path) -> Iterator[None]:
    """The body runs while `process` serves; then SIGTERM, as the kubelet stops a container, must end it with exit 0
    within a minute (its output quoted if not). A body that fails kills it, so nothing is left running."""
    try:
        yield
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def inferop_with_credentials(s3: Any, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`inferop ARGS` in a process of its own, with the S3 server's credentials in that process's environment alone,
    as a user runs it."""
    inferop = Path(sys.executable).with_name("inferop")
    return subprocess.run(
        [str(inferop), *args],
        env={"PATH": "/usr/bin:/bin", **s3.credentials()},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def push_tiny(s3: Any, exported_tiny: ExportedRepo) -> str:
    """The tiny conv net pushed by `inferop push` as s3://MODEL_BUCKET/repo/conv_net, with the credentials in the
    pushing process's environment only; the repository's URI."""
    uri = f"s3://{MODEL_BUCKET}/repo"
    result = inferop_with_credentials(
        s3, "push", str(exported_tiny.path), uri, "--endpoint", s3.url, "--addressing", "path"
    )
    assert result.returncode == 0, result.stderr
    assert f"{uri}/conv_net/1/model.onnx" in result.stdout.splitlines()
    assert s3.secret_key not in result.stdout + result.stderr
    return uri


class WebhookReceiver:
    """A webhook's receiver on 127.0.0.1: an HTTP server that answers 500 to its first `failures` posts, then
    204, keeping what it accepted; each answer waits until `open` is set."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.open = threading.Event()
        self.open.set()
        self.accepted: list[dict[str, Any]] = []
        self.posts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.open.wait()
                receiver.posts += 1
                if receiver.posts <= receiver.failures:
                    self.send_response(500)
                else:
                    receiver.accepted.append(json.loads(body))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@dataclass(frozen=True)
class StubProcess:
    """A python backend stub as the kernel sees it (/proc): its threads and the math libraries' thread variables it
    started with."""

    pid: int
    threads: int
    variables: dict[str, str]


def python_stubs(model: str, server: int | None = None) -> dict[str, StubProcess]:
    """The running python backend stubs of the model named `model` (of the tritonserver whose process is `server`,
    where given), by instance name (Triton's `<model>_<group>_<n>`, its stub's eighth argument), read from /proc:
    wherever the server runs on this machine, a pod's as well."""
    from inferop_core.threads import THREAD_ENV
    from inferop_core.tritonconfig import STAGE_STUB

    found = {}
    for process in Path("/proc").iterdir():
        try:
            argv = (process / "cmdline").read_bytes().split(b"\0")
            # Triton's own stub, which a stage's script of the same name execs in its place
            if Path(argv[0].decode()).name != STAGE_STUB or len(argv) < 9:
                continue
            environ = dict(e.decode().partition("=")[::2] for e in (process / "environ").read_bytes().split(b"\0") if e)
            threads = len(list((process / "task").iterdir()))
            parent = int((process / "stat").read_text().rpartition(")")[2].split()[1])
        except (FileNotFoundError, NotADirectoryError, ProcessLookupError, PermissionError):
            continue  # not a process, or one that ended
        instance = argv[8].decode()
        if server not in (None, parent):
            continue
        if re.fullmatch(rf"{re.escape(model)}_\d+_\d+", instance):
            variables = {v: environ[v] for v in THREAD_ENV if v in environ}
            found[instance] = StubProcess(int(process.name), threads, variables)
    return found


# What Inception declares: torchvision's ImageNet preprocessing (inferop_export.networks.inception_v3.PROCESSING).
IMAGENET = Processing(
    kind="imageClassification", resize_ratio=342 / 299, mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]
)


# The pipeline's (tests/conftest.py pipeline_repo) limit on an image's bytes.
PIPELINE_MAX_IMAGE_BYTES = 2 * 2**20


def pipeline_in_process(served: dict[str, Any], data: bytes) -> tuple[list[str], Any]:
    """Decode, the model in ONNX Runtime, top-k: what a caller that decodes on its side gets from the model that
    `served` (the served_pipeline fixture) serves behind its pipeline."""
    from inferop.serving.pipeline import top_k
    from inferop_export.pipeline import pixels

    config = served["config"]
    (logits,) = served["session"].run(None, {config.model.inputs[0].name: pixels(config, data)[None]})
    order, probabilities = top_k(logits, config.top_k)
    return [served["labels"][i] for i in order[0]], probabilities[0]


def image_classifier(**changes: Any) -> Any:
    """Inception V3's ServingConfig as the model of its pipeline (`inception_v3_model`), with `changes`."""
    from inferop_core.tritonconfig import ServingConfig, TensorSpec

    settings: dict[str, Any] = {
        "name": "inception_v3_model",
        "inputs": (TensorSpec(name="images", dims=(3, 299, 299)),),
        "outputs": (TensorSpec(name="logits", dims=(1000,), label_filename="labels.txt"),),
        "max_batch_size": 8,
        "processing": IMAGENET,
    }
    return ServingConfig(**{**settings, **changes})

"""`inferop serve` as a user runs it: ready, stopped cleanly by SIGTERM, clear errors when it cannot start."""

from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import SERVE_EXTRA, ExportedRepo, stopped_by_sigterm, wait_for

pytestmark = pytest.mark.integration

INFEROP = Path(sys.executable).with_name("inferop")


@pytest.fixture(autouse=True)
def _needs_tritonserver() -> None:
    pytest.importorskip("pytriton", reason=SERVE_EXTRA)


def serve(repo: Path, port: int, output: Path) -> subprocess.Popen[bytes]:
    """`inferop serve` in the background, its output in a file (a pipe nobody reads could block it)."""
    with open(output, "wb") as sink:
        return subprocess.Popen(
            [str(INFEROP), "serve", "--repo", str(repo), "--http-port", str(port), "--ready-timeout", "90"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def serve_and_wait(repo: Path, port: int, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(INFEROP), "serve", "--repo", str(repo), "--http-port", str(port), "--ready-timeout", "90"],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def processes(pattern: str) -> list[str]:
    """`pid command` of every process whose command line contains `pattern`, as pgrep sees them."""
    found = subprocess.run(["pgrep", "-a", "-f", re.escape(pattern)], capture_output=True, text=True, check=False)
    return [line for line in found.stdout.splitlines() if line.strip()]


def group_members(pgid: int) -> list[str]:
    found = subprocess.run(["pgrep", "-a", "-g", str(pgid)], capture_output=True, text=True, check=False)
    return [line for line in found.stdout.splitlines() if line.strip()]


@contextlib.contextmanager
def listening(port: int = 0) -> Iterator[socket.socket]:
    """Somebody else listening on `port` (0: a port the kernel picks)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield sock


@pytest.fixture
def listening_socket() -> Iterator[socket.socket]:
    with listening() as sock:
        yield sock


class TestServe:
    def test_ready_then_sigterm_exits_0_and_leaves_no_process(self, model_repo: ExportedRepo, tmp_path: Path) -> None:
        from inferop.serving.tritonserver import free_port, http_status, port_is_free

        port = free_port()
        output = tmp_path / "serve.out"
        cli = serve(model_repo.path, port, output)
        with stopped_by_sigterm(cli, output):

            def announced() -> re.Match[str] | None:
                if cli.poll() is not None:
                    pytest.fail(f"inferop serve exited with {cli.returncode}:\n{output.read_text()}")
                return re.search(r"^log: (.+)$", output.read_text(), re.MULTILINE)

            log = Path(wait_for(announced, timeout=120, what="inferop serve to report ready").group(1))
            assert http_status(f"http://127.0.0.1:{port}/v2/health/ready") == 200
            assert "models: conv_net, inception_v3" in output.read_text()

            # Everything this server started has its private repository copy on the command line.
            workdir = str(log.parent)
            running = processes(workdir)
            servers = [p for p in running if "/tritonserver " in p and f"--http-port={port}" in p]
            stubs = [p for p in running if "triton_python_backend_stub" in p]
            assert len(servers) == 1, running
            assert len(stubs) == 2, running  # one instance of each model
            server_pid = int(servers[0].split()[0])
            assert len(group_members(server_pid)) == 3  # the server leads its own process group

        assert "stopping tritonserver" in output.read_text()
        assert processes(workdir) == []
        assert group_members(server_pid) == []
        assert port_is_free(port)

    def test_busy_http_port_exits_1_naming_the_port(
        self, model_repo: ExportedRepo, listening_socket: socket.socket
    ) -> None:
        port = listening_socket.getsockname()[1]
        result = serve_and_wait(model_repo.path, port)
        assert result.returncode == 1
        assert f"--http-port {port}: port is already in use" in result.stderr

    def test_busy_grpc_port_exits_1_naming_that_port(self, model_repo: ExportedRepo) -> None:
        from inferop.serving.tritonserver import free_port

        # The HTTP port must be free: the port below a busy one the kernel picked need not be.
        http_port = free_port()
        grpc_port = http_port + 1
        with listening(grpc_port):
            result = serve_and_wait(model_repo.path, http_port)
        assert result.returncode == 1
        assert f"--grpc-port {grpc_port}: port is already in use" in result.stderr

    def test_missing_repository_exits_1_naming_the_path(self, tmp_path: Path) -> None:
        from inferop.serving.tritonserver import free_port

        missing = tmp_path / "no_repo"
        result = serve_and_wait(missing, free_port())
        assert result.returncode == 1
        assert f"model repository {missing.resolve()} does not exist" in result.stderr
        assert "Traceback" not in result.stderr

    @pytest.mark.parametrize(
        ("flag", "value", "message"),
        [
            ("--cpus", "-1", "--cpus '-1': must be positive"),
            ("--memory", "8Mi", "--memory '8Mi': must be at least 16Mi"),
            ("--cpuset", "0-4095", "--cpuset '0-4095': CPUs "),
        ],
    )
    def test_bad_pod_limit_exits_2_naming_the_flag(self, flag: str, value: str, message: str, tmp_path: Path) -> None:
        result = subprocess.run(
            [str(INFEROP), "serve", "--repo", str(tmp_path), flag, value],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2
        assert f"error: {message}" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr

    def test_model_with_a_garbage_onnx_file_fails_naming_the_model(
        self, model_repo: ExportedRepo, tmp_path: Path
    ) -> None:
        from inferop.serving.tritonserver import free_port

        repo = tmp_path / "repo"
        shutil.copytree(model_repo.path / "conv_net", repo / "conv_net")
        shutil.copytree(model_repo.path / "conv_net", repo / "broken_board")
        (repo / "broken_board" / "1" / "model.onnx").write_bytes(b"\x08\x07 this is not an ONNX model")
        port = free_port()
        result = serve_and_wait(repo, port)
        assert result.returncode == 1
        assert "failed to load 'broken_board' version 1" in result.stderr, result.stderr
        assert "INVALID_PROTOBUF" in result.stderr  # and why
        assert "failed to load 'conv_net'" not in result.stderr
        assert "Traceback" not in result.stderr
        assert processes(f"--http-port={port}") == []

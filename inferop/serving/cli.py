"""`inferop serve`: a local tritonserver on a model repository, in the foreground until stopped."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from types import FrameType

from inferop.serving.localrepo import RepositoryError
from inferop.serving.tritonserver import ServerError, TritonServer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path("model_repo"), help="model repository (default model_repo)")
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default HTTP port + 1)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default HTTP port + 2)")
    parser.add_argument("--log", type=Path, help="write tritonserver's log here (default: a temporary file)")
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for models to load")


def run(args: argparse.Namespace) -> int:
    server = TritonServer(
        repo=args.repo,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_path=args.log,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.start(timeout=args.ready_timeout)
        models = ", ".join(sorted(p.name for p in args.repo.iterdir() if (p / "config.pbtxt").is_file()))
        print(
            f"tritonserver ready: http://{server.url} (gRPC {server.grpc_port}, metrics {server.metrics_url})\n"
            f"models: {models}\nlog: {server.log_path}\nCtrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )
        assert server.process is not None
        code = server.process.wait()
        print(f"error: tritonserver exited with code {code}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except (RepositoryError, ServerError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping tritonserver", file=sys.stderr)
        return 0
    finally:
        server.stop()

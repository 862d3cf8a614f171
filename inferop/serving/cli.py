"""`inferop serve`: a local tritonserver on a model repository, in the foreground until stopped."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
from pathlib import Path
from types import FrameType

from inferop.limits import LimitsError, PodLimits, describe_usage
from inferop.serving.localrepo import RepositoryError
from inferop.serving.tritonserver import ServerError, TritonServer
from inferop_core import scheduling
from inferop_core.objectstore import StorageError, fetch, is_object_uri
from inferop_core.storagecli import add_endpoint_arguments, add_limit_arguments, endpoint_from, limits_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--repo",
        default="model_repo",
        help=(
            "model repository: a folder (default model_repo), or s3://bucket/path or http(s)://...tar.gz, fetched "
            "first and each model file checked against the digest its config records"
        ),
    )
    parser.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--grpc-port", type=int, help="gRPC port (default HTTP port + 1)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (default HTTP port + 2)")
    parser.add_argument("--log", type=Path, help="write tritonserver's log here (default: a temporary file)")
    parser.add_argument("--ready-timeout", type=float, default=120.0, help="seconds to wait for models to load")
    add_endpoint_arguments(parser)
    add_limit_arguments(parser)
    limits = parser.add_argument_group(
        "pod limits", "a pod's resources.limits, applied to the server and its stubs with cgroups as the kubelet does"
    )
    limits.add_argument("--cpus", help="CPU limit, a CFS quota per 100 ms period: 1, 1.5, 500m")
    limits.add_argument("--memory", help="memory limit; beyond it the kernel's OOM killer strikes: 1Gi, 900Mi")
    limits.add_argument("--cpuset", help="CPUs the server may run on: 1, 0-1, 0,2")
    limits.add_argument(
        "--cpu-scheduling",
        choices=scheduling.CPU_SCHEDULING_POLICIES,
        default=scheduling.DEFAULT_CPU_SCHEDULING,
        help="Linux scheduling policy, as the operator's runtime.cpuScheduling (default batch: SCHED_BATCH)",
    )


def run(args: argparse.Namespace) -> int:
    try:
        limits = PodLimits.from_strings(args.cpus, args.memory, args.cpuset)
    except LimitsError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    with contextlib.ExitStack() as cleanup:
        if is_object_uri(args.repo):
            fetched = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="inferop-repo-"))) / "repo"
            try:
                done = fetch(args.repo, fetched, endpoint_from(args), limits_from(args))
            except StorageError as error:
                print(f"error: {error.with_reason()}", file=sys.stderr)
                return 1
            print(done.summary(args.repo), file=sys.stderr)
            return serve(args, fetched, limits)
        return serve(args, Path(args.repo), limits)


def serve(args: argparse.Namespace, repo: Path, limits: PodLimits) -> int:
    server = TritonServer(
        repo=repo,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        log_path=args.log,
        limits=limits,
        cpu_scheduling=args.cpu_scheduling,
    )

    def stop(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        server.start(timeout=args.ready_timeout)
        models = ", ".join(sorted(p.name for p in repo.iterdir() if (p / "config.pbtxt").is_file()))
        pod = ""
        if server.cgroup is not None:
            cgroups = ", ".join(map(str, server.cgroup.directories))
            pod = f"limits: {limits.describe()} (cgroup v{server.cgroup.version}: {cgroups})\n"
        print(
            f"tritonserver ready: http://{server.url} (gRPC {server.grpc_port}, metrics {server.metrics_url})\n"
            f"models: {models}\n{pod}log: {server.log_path}\nCtrl-C stops it.",
            file=sys.stderr,
            flush=True,
        )
        assert server.process is not None
        server.process.wait()
        print(f"error: {server.exit_reason()}:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except (RepositoryError, ServerError, LimitsError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopping tritonserver", file=sys.stderr)
        return 0
    finally:
        server.stop()
        if server.usage is not None:
            print(f"pod usage: {describe_usage(server.usage)}", file=sys.stderr)

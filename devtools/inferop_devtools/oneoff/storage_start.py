"""One-off measurement behind the README's choice of fetch for models in object storage: start time and memory of a
100 MB model served from S3, fetched first by `inferop fetch` (what the operator's init container runs) against
tritonserver reading `s3://` itself.

A user's ONNX file with one 100 MB weight (a MatMul, seeded random) is exported, laid out for the local python
backend, and pushed to a real S3 server (versitygw). Then, in alternating rounds:
- fetch: `inferop fetch` into a folder (its wall time and peak RSS, read with wait4), then tritonserver on that folder;
- native: tritonserver with `--model-repository=s3://http://host:port/bucket/prefix`, which downloads the repository
  into a temporary folder itself before loading it, and checks no digest.
Each round reports the seconds to /v2/health/ready from the first process's start, and tritonserver's own peak RSS
(VmHWM; the model itself runs in the python backend's stub process, the same in both).

    python -m inferop_devtools.oneoff.storage_start [--megabytes 100] [--rounds 3]

Run by hand, quote as a one-off measurement with its date.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferop.serving.localrepo import prepare_local_repo
from inferop.serving.tritonserver import TritonInstall, TritonServer, free_port
from inferop_core.objectstore import push
from inferop_devtools.cluster.addons import Daemon
from inferop_devtools.cluster.controlplane import http_get
from inferop_devtools.s3 import S3Server

INFEROP = Path(sys.executable).with_name("inferop")
BUCKET = "models"
NAME = "big"
FEATURES = 2560


def big_onnx(path: Path, megabytes: float) -> Path:
    """x [n, FEATURES] @ W [FEATURES, k] with W of about `megabytes` MB of float32."""
    columns = int(megabytes * 1e6 / 4 / FEATURES)
    weight = np.random.default_rng(0).standard_normal((FEATURES, columns), dtype=np.float32) / FEATURES**0.5
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        NAME,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", columns])],
        [numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.save(model, str(path))
    return path


def vm_hwm(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def serve_until_ready(repository: str, env: dict[str, str], start: float, workdir: Path) -> dict[str, float]:
    """tritonserver on `repository` (a folder or an s3:// URI): seconds from `start` to ready, its peak RSS."""
    install = TritonInstall.locate()
    port = free_port()
    argv = TritonServer(repo=Path("."), http_port=port, grpc_port=port + 1, metrics_port=port + 2).command(
        install, Path("repository")
    )
    argv = [f"--model-repository={repository}" if a.startswith("--model-repository=") else a for a in argv]
    server = Daemon(argv, workdir / "tritonserver.log", env={**install.environment(), **env})
    server.start()
    try:
        server.wait(lambda: http_get(f"http://127.0.0.1:{port}/v2/health/ready")[0] == 200, "tritonserver", 120)
        ready = time.perf_counter() - start
        assert server.process is not None
        return {"ready_seconds": round(ready, 2), "tritonserver_peak_mib": round(vm_hwm(server.process.pid) / 2**20, 1)}
    finally:
        server.stop()


def fetch_round(s3: S3Server, workdir: Path) -> dict[str, float]:
    """`inferop fetch`, its peak RSS read from /proc while it runs: VmHWM starts again at exec, where wait4's
    ru_maxrss keeps the high-water mark of the forking process (this one, holding the model's weights)."""
    destination = workdir / "fetched"
    start = time.perf_counter()
    fetcher = subprocess.Popen(
        [str(INFEROP), "fetch", f"s3://{BUCKET}/native", str(destination), "--endpoint", s3.url],
        env={**os.environ, **s3.credentials()},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    peak = 0
    while fetcher.poll() is None:
        try:
            peak = max(peak, vm_hwm(fetcher.pid))
        except (FileNotFoundError, ProcessLookupError):
            break
        time.sleep(0.01)
    _, errors = fetcher.communicate()
    if fetcher.returncode != 0:
        raise RuntimeError(f"inferop fetch failed: {errors.decode()}")
    fetched = time.perf_counter() - start
    served = serve_until_ready(str(destination), {}, start, workdir)
    return {"fetch_seconds": round(fetched, 2), "fetch_peak_mib": round(peak / 2**20, 1), **served}


def native_round(s3: S3Server, workdir: Path) -> dict[str, float]:
    env = {**s3.credentials(), "AWS_DEFAULT_REGION": s3.region}
    return serve_until_ready(f"s3://{s3.url}/{BUCKET}/native", env, time.perf_counter(), workdir)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=100.0, help="the model file's size")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="inferop-storage-") as scratch, S3Server() as s3:
        workdir = Path(scratch)
        source = big_onnx(workdir / f"{NAME}.onnx", args.megabytes)
        subprocess.run(
            [str(INFEROP), "export", "onnx", str(source), "--repo", str(workdir / "repo"), "--json"],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        local = prepare_local_repo(workdir / "repo", workdir / "local", gpu=False)
        s3.make_bucket(BUCKET)
        os.environ.update(s3.credentials())
        push(local, f"s3://{BUCKET}/native", s3.endpoint)
        size = (workdir / "repo" / NAME / "1" / "model.onnx").stat().st_size
        print(json.dumps({"model_bytes": size}), flush=True)
        for round_ in range(args.rounds):
            for way in ("fetch", "native"):
                row = fetch_round(s3, workdir) if way == "fetch" else native_round(s3, workdir)
                print(json.dumps({"round": round_, "way": way, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

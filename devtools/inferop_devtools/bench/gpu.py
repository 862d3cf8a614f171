"""Both networks on the GPU, where one exists: throughput and p99 from 1 to 64 callers, and device memory against
the plans' estimates."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

GPU_LEVELS = [1, 2, 4, 8, 16, 32, 64]


def gpu_bench(seconds: float) -> dict[str, Any]:
    """Both networks on the GPU with its whole memory as gpu.memory: throughput and p99 from 1 to 64 callers, and the
    device memory of the server's processes after the sweep against the plans' estimates."""
    from inferop import bench
    from inferop.serving.gpu import process_group_device_memory
    from inferop.serving.tritonserver import TritonServer, free_port
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_export.networks.inception_v3 import inception_v3
    from inferop_operator.plan import plan_service

    total = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits", "--id=0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    name, mib = (part.strip() for part in total.rsplit(",", 1))
    figures: dict[str, Any] = {"device": name, "device_memory_mib": int(mib), "models": {}}
    with tempfile.TemporaryDirectory(prefix="inferop-bench-gpu-") as work:
        repo = Path(work) / "repo"
        estimate = 0
        for network in (conv_net, inception_v3):
            print(f"gpu: exporting {network.__name__} for the GPU ...", flush=True)
            report = export_model(network(), repo, gpu_memory=f"{mib}Mi", quiet=True)
            estimate += plan_service(report.spec).memory.required_bytes
        figures["device_memory_estimate_mib"] = round(estimate / 2**20)
        with TritonServer(repo, http_port=free_port()) as server:
            for model in ("conv_net", "inception_v3"):
                print(f"gpu: {model}, callers {GPU_LEVELS} ...", flush=True)
                levels = bench.sweep(server.url, model, GPU_LEVELS, seconds, batch=1)
                figures["models"][model] = [
                    {
                        "concurrency": r.concurrency,
                        "samples_per_s": round(r.throughput, 1),
                        "p99_ms": round(r.p99_ms, 2),
                        "mean_batch": round(r.mean_batch, 2),
                        "errors": r.errors,
                    }
                    for r in levels
                ]
            assert server.process is not None
            used = process_group_device_memory(os.getpgid(server.process.pid))
            figures["device_memory_used_mib"] = round(used / 2**20)
    return figures

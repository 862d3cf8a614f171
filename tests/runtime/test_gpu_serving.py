"""Serving on a GPU: an export for a GPU pod renders a GPU instance group with each instance's share of the device
as gpu_mem_limit; local serving keeps it on the GPU with ONNX Runtime's CUDA provider; callers at concurrency 1 to
64 get every answer; the device memory it takes stays within the memory fit. Runs only where an NVIDIA GPU and
onnxruntime-gpu exist (`-m gpu`; scripts/gpu-check.sh runs it with the figures)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from inferop.serving.gpu import local_gpu, process_group_device_memory
from inferop_core.quantity import format_bytes, parse_quantity
from tests.helpers import NO_GPU, SERVING, TINY

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not local_gpu(), reason=NO_GPU)]

GPU_MEMORY = "8Gi"
LEVELS = [1, 2, 4, 8, 16, 32, 64]


@dataclass(frozen=True)
class GpuRepo:
    path: Path
    reports: dict[str, Any]  # model name -> ExportReport


@pytest.fixture(scope="module")
def gpu_repo(tmp_path_factory: pytest.TempPathFactory, inception_network: Any) -> GpuRepo:
    from inferop_export.exporter import export_model
    from inferop_export.networks.conv_net import conv_net
    from inferop_operator.spec import parse_serving

    repo = tmp_path_factory.mktemp("gpu_repo")
    sources = {"conv_net": conv_net(**TINY), "inception_v3": inception_network}
    reports = {
        name: export_model(source, repo, serving=parse_serving(SERVING[name]), gpu_memory=GPU_MEMORY, quiet=True)
        for name, source in sources.items()
    }
    return GpuRepo(repo, reports)


@pytest.fixture(scope="module")
def gpu_server(gpu_repo: GpuRepo) -> Iterator[Any]:
    from inferop.serving.tritonserver import TritonServer, free_port

    with TritonServer(gpu_repo.path, http_port=free_port()) as server:
        yield server


@pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
def test_the_config_runs_each_instance_on_the_gpu_under_its_share(gpu_repo: GpuRepo, model: str) -> None:
    from inferop_core.memory import GPU_RUNTIME

    serving = gpu_repo.reports[model].serving
    config = (gpu_repo.path / model / "config.pbtxt").read_text()
    assert "kind: KIND_GPU" in config
    share = (parse_quantity(GPU_MEMORY, "gpu.memory") - GPU_RUNTIME.baseline_bytes) // serving.instances
    assert serving.gpu_memory_limit_bytes == share
    assert f'string_value: "{share}"' in config


@pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
def test_served_on_the_gpu_every_caller_is_answered_from_1_to_64(gpu_server: Any, model: str) -> None:
    from inferop import bench
    from inferop.client import connect

    client = connect(gpu_server.url, 30.0)
    try:
        kinds = {group["kind"] for group in client.get_model_config(model)["instance_group"]}
    finally:
        client.close()
    assert kinds == {"KIND_GPU"}
    results = bench.sweep(gpu_server.url, model, LEVELS, seconds=3.0, batch=1)
    print("\n" + bench.format_table(model, 1, results))
    assert all(r.errors == 0 and r.requests > 0 for r in results), [r.first_error for r in results]
    assert results[-1].mean_batch > 1  # 64 callers meet in the dynamic batcher


def test_device_memory_stays_within_the_memory_fit(gpu_repo: GpuRepo, gpu_server: Any) -> None:
    from inferop import bench
    from inferop_operator.plan import MEMORY_MARGIN, plan_service

    for model in gpu_repo.reports:
        bench.sweep(gpu_server.url, model, [64], seconds=3.0, batch=1)
    assert gpu_server.process is not None
    used = process_group_device_memory(os.getpgid(gpu_server.process.pid))
    fits = [plan_service(report.spec).memory for report in gpu_repo.reports.values()]
    estimate = sum(fit.required_bytes for fit in fits)
    print(f"\ndevice memory in use {format_bytes(used)}; estimate {format_bytes(estimate)}")
    assert 0 < used <= parse_quantity(GPU_MEMORY, "gpu.memory") * len(fits)
    assert used <= estimate * MEMORY_MARGIN, (
        f"device memory {format_bytes(used)} beyond the estimate {format_bytes(estimate)} with its margin"
    )

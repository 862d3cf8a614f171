"""Device memory with onnxruntime-gpu: the GPU estimate against what CUDA reports, and `gpu_mem_limit`
refusing an allocation instead of a pod dying. Runs only where a GPU and onnxruntime-gpu exist (`-m gpu`,
or scripts/gpu-check.sh in one go)."""

from __future__ import annotations

import numpy as np
import pytest

from inferop.serving.gpu import local_gpu
from inferop_core.memory import GPU_RUNTIME, ModelCosts, ServingShape, estimate_memory
from tests.helpers import NO_GPU, ExportedRepo

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not local_gpu(), reason=NO_GPU)]


def cuda_session(path: str, mem_limit: int | None = None):  # type: ignore[no-untyped-def]
    ort = pytest.importorskip("onnxruntime", reason="install onnxruntime-gpu")
    if hasattr(ort, "preload_dlls"):
        ort.preload_dlls()  # CUDA and cuDNN from onnxruntime-gpu[cuda,cudnn], where installed
    options: dict[str, object] = {"arena_extend_strategy": "kSameAsRequested"}
    if mem_limit is not None:
        options["gpu_mem_limit"] = mem_limit
    return ort.InferenceSession(path, providers=[("CUDAExecutionProvider", options)])


def device_used_bytes() -> int:
    """Bytes in use on device 0, from NVML through nvidia-smi (no extra Python package)."""
    import subprocess

    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip()) * 2**20


@pytest.mark.parametrize("model", ["conv_net", "inception_v3"])
def test_gpu_estimate_is_within_a_quarter_of_the_device_peak(model_repo: ExportedRepo, model: str) -> None:
    report = model_repo.reports[model]
    batch = report.serving.max_batch_size
    before = device_used_bytes()
    session = cuda_session(report.model_path)
    spec = report.serving.inputs[0]
    data = np.random.default_rng(0).standard_normal((batch, *spec.dims)).astype(np.float32)
    session.run(None, {spec.name: data})
    used = device_used_bytes() - before
    costs = ModelCosts(report.profile.weight_bytes, report.profile.activation_bytes_per_sample, 0)
    estimate = estimate_memory(costs, ServingShape(1, batch, 0), GPU_RUNTIME).total
    assert abs(estimate / used - 1) <= 0.25, f"{model}: estimate {estimate} against {used} bytes on the device"


def test_gpu_mem_limit_refuses_an_allocation_beyond_it(model_repo: ExportedRepo) -> None:
    report = model_repo.reports["inception_v3"]
    spec = report.serving.inputs[0]
    session = cuda_session(report.model_path, mem_limit=report.profile.weight_bytes * 2)
    data = np.zeros((32, *spec.dims), dtype=np.float32)
    with pytest.raises(Exception, match=r"(?i)memory|allocat"):
        session.run(None, {spec.name: data})

"""Our python-backend model's reading of config.pbtxt, with Triton's own utils module from the wheel."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from inferop.serving.localrepo import PYTHON_MODEL


@pytest.fixture(scope="module")
def model_module() -> ModuleType:
    pytriton = pytest.importorskip("pytriton", reason="install the serving extra (make install)")
    utils = Path(pytriton.__file__).parent / "tritonserver" / "backends" / "python"
    sys.path.insert(0, str(utils))
    try:
        spec = importlib.util.spec_from_file_location("inferop_python_model", PYTHON_MODEL)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(utils))
    return module


@pytest.mark.parametrize(
    ("parameters", "intra", "inter", "parallel"),
    [
        ({"intra_op_thread_count": "3", "inter_op_thread_count": "1", "execution_mode": "0"}, 3, 1, False),
        ({"intra_op_thread_count": "2", "inter_op_thread_count": "2", "execution_mode": "1"}, 2, 2, True),
        ({}, 0, 0, False),  # unset: ONNX Runtime's defaults, as NVIDIA's backend leaves them
    ],
)
def test_session_options_follow_the_config(
    model_module: ModuleType, parameters: dict[str, str], intra: int, inter: int, parallel: bool
) -> None:
    import onnxruntime as ort

    options = model_module.session_options(parameters)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (intra, inter)
    expected = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    assert options.execution_mode == expected
    # Spinning is left to ONNX Runtime, as NVIDIA's backend leaves it (it has no setting for it).
    with pytest.raises(RuntimeError, match="does not have configuration"):
        options.get_session_config_entry("session.intra_op.allow_spinning")


@pytest.mark.parametrize(
    ("parameters", "arena", "pattern"),
    [({}, True, True), ({"enable_mem_pattern": "0"}, True, False), ({"enable_mem_arena": "false"}, False, True)],
)
def test_memory_switches_follow_the_config(
    model_module: ModuleType, parameters: dict[str, str], arena: bool, pattern: bool
) -> None:
    options = model_module.session_options(parameters)
    assert (options.enable_cpu_mem_arena, options.enable_mem_pattern) == (arena, pattern)


def test_cpu_instances_run_on_the_cpu_provider(model_module: ModuleType) -> None:
    assert model_module.execution_providers("CPU", "0", {"gpu_mem_limit": "1024"}) == ["CPUExecutionProvider"]


def test_gpu_instances_run_on_cuda_with_the_configs_memory_options(model_module: ModuleType) -> None:
    parameters = {"gpu_mem_limit": "3221225472", "arena_extend_strategy": "1"}
    (cuda, options), cpu = model_module.execution_providers("GPU", "1", parameters)
    assert (cuda, cpu) == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert options == {"device_id": 1, "gpu_mem_limit": 3221225472, "arena_extend_strategy": "kSameAsRequested"}
    (_, defaults), _ = model_module.execution_providers("GPU", "0", {})
    assert defaults == {"device_id": 0, "arena_extend_strategy": "kNextPowerOfTwo"}  # the backend's default

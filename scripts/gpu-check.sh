#!/usr/bin/env bash
# The GPU checks in one go, for a machine with an NVIDIA GPU: onnxruntime-gpu in the project's venv, then
# the `gpu` test tier (device memory against the GPU estimate, gpu_mem_limit refusing an allocation).
# Nothing here runs on machines without a GPU; `make test` deselects the tier.
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || { echo "error: no NVIDIA GPU (nvidia-smi failed)" >&2; exit 1; }
make install
# onnxruntime-gpu replaces the CPU wheel: both install the same `onnxruntime` module.
.venv/bin/pip install --quiet onnxruntime-gpu
.venv/bin/python -c 'import onnxruntime as o; p = o.get_available_providers(); print(p); assert "CUDAExecutionProvider" in p'
.venv/bin/python -m pytest -m gpu -v "$@"

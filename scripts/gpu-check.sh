#!/usr/bin/env bash
# The GPU path in one run, on any machine with an NVIDIA GPU, its driver and PyPI: the project's venv with
# onnxruntime-gpu's CUDA and cuDNN libraries, the `gpu` test tier, and the GPU figures of `make bench`, all
# written to out/gpu/ (a report.txt to read first). Under 10 minutes once the venv exists.
# Nothing here runs on machines without a GPU: `make test` deselects the tier and `make bench` says "not measured".
set -euo pipefail
cd "$(dirname "$0")/.."
out=out/gpu
mkdir -p "$out"
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/device.csv"; then
    echo "error: no NVIDIA GPU here (nvidia-smi failed)" >&2
    exit 1
fi
make install
# The serve extra brings onnxruntime-gpu on Linux x86_64; its CUDA provider needs CUDA and cuDNN, from PyPI.
.venv/bin/pip install --quiet 'onnxruntime-gpu[cuda,cudnn]'
.venv/bin/python -c '
import onnxruntime as ort
ort.preload_dlls()
providers = ort.get_available_providers()
print(ort.__version__, providers)
assert "CUDAExecutionProvider" in providers, "onnxruntime-gpu has no CUDA provider here"
' | tee "$out/onnxruntime.txt"
status=0
timeout 420 .venv/bin/python -m pytest -m gpu -v -s -p no:cacheprovider --junitxml="$out/pytest.xml" "$@" \
    >"$out/pytest.log" 2>&1 || status=$?
timeout 240 .venv/bin/python scripts/bench.py --skip-serving --skip-tune --skip-operator --seconds 6 \
    --json "$out/bench.json" >"$out/bench.log" 2>&1 || status=$?
{
    echo "== device"
    cat "$out/device.csv"
    echo "== onnxruntime"
    cat "$out/onnxruntime.txt"
    echo "== gpu tier (pytest -m gpu)"
    tail -n 25 "$out/pytest.log"
    echo "== bench (GPU part of make bench)"
    sed -n '/=== results/,$p' "$out/bench.log"
} >"$out/report.txt"
cat "$out/report.txt"
exit "$status"

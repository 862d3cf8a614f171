"""The local NVIDIA GPU, seen through `nvidia-smi` (the driver's own tool, so no extra Python package)."""

from __future__ import annotations

import os
import shutil
import subprocess


def local_gpu() -> bool:
    """Whether GPU instances can run here: an NVIDIA GPU that `nvidia-smi` lists, and ONNX Runtime built with the
    CUDA provider (onnxruntime-gpu, which the serve extra installs on Linux x86_64)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    if not any(line.startswith("GPU ") for line in listed.splitlines()):
        return False
    import onnxruntime

    return "CUDAExecutionProvider" in onnxruntime.get_available_providers()


def process_group_device_memory(group: int) -> int:
    """Bytes of device memory held by one process group's processes: a local server and its python stubs, each
    stub with a CUDA context of its own."""
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=20,
        check=True,
    ).stdout
    used = 0
    for line in out.splitlines():
        pid, mib = (field.strip() for field in line.split(","))
        try:
            if os.getpgid(int(pid)) == group:
                used += int(mib) * 2**20
        except ProcessLookupError:  # ended since nvidia-smi listed it
            continue
    return used

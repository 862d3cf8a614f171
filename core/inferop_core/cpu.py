"""What a CPU offers int8 inference, and whether int8 paid on it.

ONNX Runtime's int8 kernels gain on CPUs with int8 dot-product instructions: AVX-512 VNNI, AVX-VNNI, AMX tiles
(Node Feature Discovery publishes the same as node labels, `feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI`...).
Without them int8 runs about as fast as fp32 (the README's int8 figures, by CPU).
"""

from __future__ import annotations

from pathlib import Path

INT8_INSTRUCTIONS = ("avx512_vnni", "avx_vnni", "amx_int8")  # the kernel's names in /proc/cpuinfo's flags
# The labels Node Feature Discovery puts on a node whose CPU has each (value "true"; its cpuid source's flag names).
NFD_LABELS = {
    "avx512_vnni": "feature.node.kubernetes.io/cpu-cpuid.AVX512VNNI",
    "avx_vnni": "feature.node.kubernetes.io/cpu-cpuid.AVXVNNI",
    "amx_int8": "feature.node.kubernetes.io/cpu-cpuid.AMXINT8",
}
# Below this ratio to fp32, int8 is within what repeated measures of the same model move by: it does not pay.
INT8_PAYS_FROM = 1.2


def cpu_int8_instructions(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Which of INT8_INSTRUCTIONS this machine's CPU has, from the kernel's flags."""
    flags: set[str] = set()
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return [name for name in INT8_INSTRUCTIONS if name in flags]


def int8_verdict(speedup: float, instructions: list[str]) -> str:
    """What a measured int8/fp32 ratio on a CPU with `instructions` means for where to serve int8."""
    has = ", ".join(instructions) if instructions else "none of AVX-512 VNNI, AVX-VNNI, AMX"
    if speedup >= INT8_PAYS_FROM:
        return f"int8 pays on this CPU: {speedup:.2f}x fp32 (int8 instructions: {has})"
    return (
        f"int8 does not pay on this CPU: {speedup:.2f}x fp32 (int8 instructions: {has}); serve fp32 here, or int8 "
        "on nodes whose CPUs have AVX-512 VNNI, AVX-VNNI or AMX"
    )

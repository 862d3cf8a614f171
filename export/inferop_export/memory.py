"""What an export holds at its peak, said before the work starts and refused where this process cannot have it.

Once the fp32 file is written and checked, everything an export does is a run of ONNX Runtime (or of the source)
on a known number of samples, and what it holds beyond what it held then is bounded by the model's size:

    bound = held + max over its runs (copies x weight bytes + ACTIVATION_FACTOR x samples x activation bytes)
            + OVERHEAD

`held` is the process's resident memory when the bound is made: the interpreter and its libraries, the source
(a PyTorch module), the fp32 file's session, the samples a user gave for int8. The weight bytes and the activation
bytes (the most that are alive at once for one sample) are the fp32 file's profile. The runs are the parity check
at batch 8 (ONNX Runtime, then the source), the capacity measure at the served batch (`--max-batch-size`) and, for
int8, the search: a quantization holds the weights six times at once (ONNX Runtime's quantizer keeps the model, its
augmented copy for calibration, their sessions and the quantized model), and the gate runs fp32 and int8 on
`--gate-batch` samples each. The fallback's noise measure asks for no more tensors per run than the gate holds
(`inferop_export.precision.noise_runs`): its samples and tensors come a few at a time, whatever the model. Nothing
grows with the number of samples.

The factors were measured on this project's machines (docs/how-to/precision.md, "Memory"): ONNX Runtime's arena
grows by doubling, so a run's activations take up to twice their size (a model of 64 MiB of activations a sample
reached 2.6 GiB from 634 MiB held with 1 GiB of them in its gate); OVERHEAD covers the sessions' thread pools and
buffers, and the interpreter's exit after the report, which with PyTorch loaded adds 120 MiB (a script that only
imports torch and onnxruntime: 591 MiB at its end, 710 MiB by `/usr/bin/time -v`).
"""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from inferop_core.errors import InferopError
from inferop_core.quantity import format_bytes

MiB = 2**20
ACTIVATION_FACTOR = 2.0
OVERHEAD = 192 * MiB
SESSION_COPIES = 2  # ONNX Runtime's session on a model holds its weights and prepacked copies of them
QUANTIZER_COPIES = 6
PARITY_BATCH = 8  # the largest batch ONNX Runtime is compared with the source at


class MemoryShortfall(InferopError, RuntimeError):
    """The export would need more memory than this process may take; the message names the flag that lowers it."""


@dataclass(frozen=True)
class Run:
    """One kind of run an export makes: the copies of the weights and the samples of activations it holds at once,
    and the flag that sets the samples (None: fixed) with the fewest it allows."""

    what: str
    copies: int
    samples: int
    flag: str | None = None
    fewest: int = 1

    def bytes(self, weight_bytes: int, activation_bytes: int) -> int:
        return round(self.copies * weight_bytes + ACTIVATION_FACTOR * self.samples * activation_bytes)


@dataclass(frozen=True)
class ExportMemory:
    """The bound on an export's resident memory from the moment its fp32 file is checked, and where it comes from."""

    held_bytes: int
    weight_bytes: int
    activation_bytes: int  # most alive at once for one sample
    runs: tuple[Run, ...]

    @property
    def largest(self) -> Run:
        return max(self.runs, key=lambda run: run.bytes(self.weight_bytes, self.activation_bytes))

    @property
    def need_bytes(self) -> int:
        """What the export may take beyond what it holds."""
        return self.largest.bytes(self.weight_bytes, self.activation_bytes) + OVERHEAD

    @property
    def bound_bytes(self) -> int:
        return self.held_bytes + self.need_bytes

    def describe(self) -> str:
        run = self.largest
        return (
            f"at most {format_bytes(self.bound_bytes)} resident: {format_bytes(self.held_bytes)} held now + "
            f"{run.copies} x {format_bytes(self.weight_bytes)} of weights + {ACTIVATION_FACTOR:g} x {run.samples} x "
            f"{format_bytes(self.activation_bytes)} of activations ({run.what}) + {format_bytes(OVERHEAD)}"
        )


def export_runs(serve_batch: int, gate_batch: int | None) -> tuple[Run, ...]:
    """The runs an export makes after its fp32 file is checked; `gate_batch` None for fp32."""
    runs = [
        Run(f"the parity check at batch {PARITY_BATCH}", SESSION_COPIES, PARITY_BATCH),
        Run(f"the capacity measure at batch {serve_batch}", SESSION_COPIES, serve_batch, "--max-batch-size"),
    ]
    if gate_batch is not None:
        what = f"int8's search: the gate runs fp32 and int8 on {gate_batch} samples each"
        runs.append(Run(what, QUANTIZER_COPIES, gate_samples(gate_batch), "--gate-batch", gate_samples(1)))
    return tuple(runs)


def gate_samples(gate_batch: int) -> int:
    """Samples of activations int8's gate holds at once, fp32's and int8's: what a run of the noise measure may
    hold too."""
    return 2 * gate_batch


def check_fits(memory: ExportMemory, available: int, where: str) -> None:
    """Refuse, before the work starts, an export that needs more than the `available` bytes (`where` says what sets
    them), naming the flag that lowers its largest run and what the export needs with the fewest samples it allows."""
    if memory.need_bytes <= available:
        return
    largest = memory.largest
    fix = "give it more memory"
    if largest.flag is not None:
        fewest = replace(largest, samples=largest.fewest)
        least = replace(memory, runs=tuple(fewest if run is largest else run for run in memory.runs))
        fix = f"lower {largest.flag}: at its least it needs {format_bytes(least.need_bytes)} more"
        if least.need_bytes > available:
            fix += ", so give it more memory too"
    raise MemoryShortfall(
        f"the export needs {format_bytes(memory.need_bytes)} more memory ({memory.describe()}), and this process may "
        f"take only {format_bytes(available)} more ({where}): {fix}"
    )


def resident_bytes() -> int:
    """This process's resident memory now (Linux's /proc/self/statm; elsewhere its high-water mark)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except OSError:
        return peak_resident_bytes()
    return pages * resource.getpagesize()


def peak_resident_bytes() -> int:
    """This process's high-water mark of resident memory: getrusage's ru_maxrss, which Linux counts in KiB and
    macOS in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024

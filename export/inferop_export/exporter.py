"""Export a network to `<repo>/<name>/1/model.onnx` + `config.pbtxt`, and prove the file is right.

Verification is part of the export, not an afterthought: `onnx.checker`, ONNX Runtime against PyTorch at
batch 1 and at a larger batch (so the dynamic batch axis is exercised), and a profile of the graph.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from torch import nn

from inferop.capacity import derive_queue_bound, pod_capacity
from inferop.threads import local_cpus, plan_threads
from inferop.tritonconfig import MODEL_FILENAME, ServingConfig, TensorSpec, render_model_config
from inferop_export.profile import ModelProfile, profile_onnx

PARITY_BATCHES = (1, 8)
LABELS_FILENAME = "labels.txt"


class VerificationError(RuntimeError):
    """The exported model is not faithful to the PyTorch one; the message carries the numbers."""


@dataclass(frozen=True)
class Network:
    """A module ready to export, with the tensor contract Triton will serve."""

    name: str
    module: nn.Module
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    make_input: Callable[[int, torch.Generator], tuple[torch.Tensor, ...]]
    tolerance: float  # max |ONNX Runtime - PyTorch| accepted, per output element
    weights: str  # where the weights came from (`random_weights(seed)` or a file), served with the config
    labels: list[str] | None = None  # class names for the first output (Triton's classification extension)


@dataclass
class ExportReport:
    model: str
    model_path: str
    config_path: str
    checker: str
    parity: list[dict[str, Any]]
    tolerance: float
    profile: ModelProfile
    serving: ServingConfig
    seconds: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "modelPath": self.model_path,
            "configPath": self.config_path,
            "checker": self.checker,
            "parity": self.parity,
            "tolerance": self.tolerance,
            "profile": self.profile.as_dict(),
            "serving": self.serving.model_dump(mode="json"),
            "seconds": self.seconds,
        }


class Progress:
    """Numbered step lines on stderr with elapsed times, so a minute-long export is visibly alive."""

    def __init__(self, total: int, quiet: bool = False):
        self.total, self.quiet, self.index = total, quiet, 0
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, label: str) -> Iterator[None]:
        self.index += 1
        if not self.quiet:
            print(f"[{self.index}/{self.total}] {label} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        yield
        self.seconds[label] = round(time.perf_counter() - start, 3)
        if not self.quiet:
            print(f"[{self.index}/{self.total}] {label}: {self.seconds[label]:.1f}s", file=sys.stderr, flush=True)


def export_network(
    network: Network, repo: Path, serving: dict[str, Any] | None = None, seed: int = 0, quiet: bool = False
) -> ExportReport:
    """Export, verify and write the Triton model directory; raise VerificationError if a check fails.

    Without `max_queue_size` in `serving`, the queue bound is derived from the capacity measured here."""
    config = ServingConfig(
        name=network.name,
        inputs=network.inputs,
        outputs=_with_labels(network),
        weights=network.weights,
        **(serving or {}),
    )
    model_dir = repo / network.name
    model_path = model_dir / "1" / MODEL_FILENAME
    model_path.parent.mkdir(parents=True, exist_ok=True)
    progress = Progress(total=5, quiet=quiet)
    module = network.module.eval()

    with progress.step(f"exporting {network.name} to ONNX"):
        export_onnx(module, network, model_path, config.max_batch_size, seed)
    with progress.step("onnx.checker"):
        onnx.checker.check_model(str(model_path), full_check=True)
    with progress.step(f"ONNX Runtime against PyTorch at batch {' and '.join(map(str, PARITY_BATCHES))}"):
        parity = compare_with_onnxruntime(module, network, model_path, seed)
    with progress.step("profile"):
        parameters = sum(p.numel() for p in module.parameters())
        profile = profile_onnx(onnx.load(str(model_path)), parameters=parameters)
    with progress.step(f"capacity: ONNX Runtime, one thread, batch {config.max_batch_size}"):
        rate = measure_capacity(network, model_path, config.max_batch_size, seed)
        profile = dataclasses.replace(profile, samples_per_cpu_second=rate)

    if "max_queue_size" not in (serving or {}):
        threads = plan_threads(local_cpus(), config.instances, config.intra_op_threads, config.inter_op_threads)
        timeout = (config.request_timeout_microseconds or 0) / 1e6
        queue = derive_queue_bound(pod_capacity(rate, threads), timeout, config.instances, config.max_batch_size)
        config = config.model_copy(update={"max_queue_size": queue.size})
    config_path = model_dir / "config.pbtxt"
    config_path.write_text(render_model_config(config))
    if network.labels:
        (model_dir / LABELS_FILENAME).write_text("\n".join(network.labels) + "\n")

    failed = [p for p in parity if p["maxAbsDiff"] > network.tolerance]
    report = ExportReport(
        model=network.name,
        model_path=str(model_path),
        config_path=str(config_path),
        checker="passed",
        parity=parity,
        tolerance=network.tolerance,
        profile=profile,
        serving=config,
        seconds=progress.seconds,
    )
    if failed:
        details = ", ".join(f"batch {p['batch']} {p['output']}: {p['maxAbsDiff']:.3g}" for p in failed)
        raise VerificationError(
            f"{network.name}: ONNX Runtime differs from PyTorch beyond tolerance {network.tolerance:g} ({details})"
        )
    return report


def export_onnx(module: nn.Module, network: Network, path: Path, max_batch: int, seed: int) -> None:
    """torch.onnx (dynamo exporter) with a dynamic batch axis and the weights inside the one file."""
    example = network.make_input(2, torch.Generator().manual_seed(seed))  # batch 2: a 1 would be specialised
    arg_names = list(inspect.signature(module.forward).parameters)[: len(example)]
    batch = torch.export.Dim("batch", min=1, max=max(max_batch, 2) * 64)
    torch.onnx.export(
        module,
        example,
        str(path),
        input_names=[t.name for t in network.inputs],
        output_names=[t.name for t in network.outputs],
        dynamic_shapes={name: {0: batch} for name in arg_names},
        external_data=False,
        dynamo=True,
        verbose=False,
    )


def compare_with_onnxruntime(module: nn.Module, network: Network, path: Path, seed: int) -> list[dict[str, Any]]:
    """Max absolute difference of every output, ONNX Runtime against PyTorch, at each parity batch size."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(seed + 1)
    results = []
    for batch in PARITY_BATCHES:
        inputs = network.make_input(batch, generator)
        with torch.no_grad():
            expected = module(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        feeds = {spec.name: tensor.numpy() for spec, tensor in zip(network.inputs, inputs, strict=True)}
        actual = session.run([t.name for t in network.outputs], feeds)
        for spec, want, got in zip(network.outputs, expected, actual, strict=True):
            if tuple(got.shape) != (batch, *spec.dims):
                raise VerificationError(
                    f"{network.name}: output {spec.name!r} has shape {list(got.shape)}, expected {[batch, *spec.dims]}"
                )
            diff = float(np.max(np.abs(want.numpy() - got)))
            results.append(
                {"batch": batch, "output": spec.name, "maxAbsDiff": diff, "maxAbsValue": float(np.max(np.abs(got)))}
            )
    return results


def measure_capacity(network: Network, path: Path, batch: int, seed: int, seconds: float = 2.0) -> float:
    """Samples per second that one CPU runs at `batch`: the capacity the queue bound is derived from.

    One intra-op thread that never spins, so the figure is one CPU's worth whatever the machine; at least
    three timed runs after a warm-up one, and at least `seconds` of them.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = network.make_input(batch, torch.Generator().manual_seed(seed + 2))
    feeds = {spec.name: tensor.numpy() for spec, tensor in zip(network.inputs, inputs, strict=True)}
    session.run(None, feeds)
    runs, start = 0, time.perf_counter()
    while runs < 3 or time.perf_counter() - start < seconds:
        session.run(None, feeds)
        runs += 1
    return round(runs * batch / (time.perf_counter() - start), 3)


def _with_labels(network: Network) -> tuple[TensorSpec, ...]:
    if not network.labels:
        return network.outputs
    first, *rest = network.outputs
    return (first.model_copy(update={"label_filename": LABELS_FILENAME}), *rest)

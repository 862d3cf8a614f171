"""Export a model to `<repo>/<name>/1/model.onnx` + `config.pbtxt`, and prove the file is right.

Verification is part of the export, not an afterthought: `onnx.checker`, ONNX Runtime loading the file,
ONNX Runtime against the source (PyTorch, or ONNX's reference implementation for a user's file) at batch 1
and at a larger batch (so the dynamic batch axis is exercised), and a profile of the graph. The config is
rendered from the same spec model the operator plans, so what is served locally is what a pod serves.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from inferop.limits import memory_headroom
from inferop.serving.localrepo import write_pipeline_members
from inferop_core.agreement import GateResult
from inferop_core.cpu import cpu_int8_instructions, int8_verdict
from inferop_core.errors import InferopError
from inferop_core.objectstore import sha256_file
from inferop_core.quantity import format_bytes, parse_quantity
from inferop_core.threads import local_cpus
from inferop_core.tritonconfig import (
    DYNAMIC_DIM,
    MODEL_FILENAME,
    VALIDATION_FILENAME,
    ServingConfig,
    member_name,
    render_model_config,
)
from inferop_export.data import SampleSet
from inferop_export.memory import (
    ExportMemory,
    check_fits,
    export_runs,
    gate_samples,
    peak_resident_bytes,
    resident_bytes,
)
from inferop_export.precision import (
    GATE_BATCH,
    Attempt,
    PrecisionError,
    Samples,
    UserData,
    check_precision,
    int8_with_fallback,
    precision_inputs,
)
from inferop_export.profile import ModelProfile, profile_onnx
from inferop_export.signature import Signature, read_signature
from inferop_export.sources import Inputs, OnnxFile, SourceError, TorchModule
from inferop_operator.plan import plan_service
from inferop_operator.spec import (
    GPU_RESOURCE,
    InferenceServiceSpec,
    Model,
    ObjectStorage,
    Pipeline,
    Profile,
    Serving,
    Tensor,
    ValidationSet,
    parse_spec,
)

PARITY_BATCHES = (1, 8)
LABELS_FILENAME = "labels.txt"
CAPACITY_WINDOWS = 3  # the capacity is their median: one window that another process's cache traffic slowed is out
# ONNX's reference implementation runs in numpy: compared against only up to this many multiply-accumulates.
REFERENCE_MAX_MACS = 300_000_000

Source = TorchModule | OnnxFile


class VerificationError(InferopError, RuntimeError):
    """The exported model is not faithful to its source or cannot be served; the message carries the numbers."""


@dataclass(frozen=True)
class Cost:
    """What an export took: its wall time, the process's high-water mark of resident memory, and the bound it
    stated before the work (`inferop_export.memory`; None where it stopped before)."""

    seconds: float
    peak_bytes: int
    bound_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "peakBytes": self.peak_bytes,
            "boundBytes": self.bound_bytes,
            "summary": self.describe(),
        }

    def describe(self) -> str:
        bound = f" (bound {format_bytes(self.bound_bytes)})" if self.bound_bytes is not None else ""
        return f"cost: {self.seconds:.1f}s, peak resident memory {format_bytes(self.peak_bytes)}{bound}"


@dataclass
class ExportReport:
    model: str
    model_path: str
    config_path: str
    checker: str
    parity: list[dict[str, Any]]
    parity_against: str  # "PyTorch", "ONNX reference", or why nothing was compared
    tolerance: float
    profile: ModelProfile
    serving: ServingConfig
    spec: InferenceServiceSpec  # what was planned for this machine; manifests start from it
    cost: Cost  # what the export took: wall time and memory
    precision: str = "fp32"
    gate: GateResult | None = None  # how a reduced precision kept fp32's answers; None for fp32
    attempts: list[Attempt] = field(default_factory=list)  # int8's quantizations behind the gate, the served last
    # A reduced precision's capacity over fp32's, both measured here, and what that means on this CPU
    speedup: float | None = None
    speed_verdict: str | None = None
    notes: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    pipeline: str | None = None  # with a pipeline: how the served ensemble was proved

    def as_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "modelPath": self.model_path,
            "configPath": self.config_path,
            "checker": self.checker,
            "parity": self.parity,
            "parityAgainst": self.parity_against,
            "tolerance": self.tolerance,
            "profile": self.profile.as_dict(),
            "serving": self.serving.model_dump(mode="json"),
            "precision": self.precision,
            "gate": self.gate.as_dict() if self.gate else None,
            "fp32Nodes": list(self.attempts[-1].fp32_nodes) if self.attempts else [],
            "attempts": [attempt.as_dict() for attempt in self.attempts],
            "speedup": self.speedup,
            "speedVerdict": self.speed_verdict,
            "notes": self.notes,
            "seconds": self.seconds,
            "cost": self.cost.as_dict(),
            "pipeline": self.pipeline,
        }


class Progress:
    """Numbered step lines on stderr with elapsed times and the process's resident memory at its highest so far, so
    a minute-long export is visibly alive and the step that needs the most memory shows."""

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
            took = f"{self.seconds[label]:.1f}s, peak {format_bytes(peak_resident_bytes())}"
            print(f"[{self.index}/{self.total}] {label}: {took}", file=sys.stderr, flush=True)

    def say(self, line: str) -> None:
        """A line within the current step."""
        if not self.quiet:
            print(f"      {line}", file=sys.stderr, flush=True)


def export_model(
    source: Source,
    repo: Path,
    serving: Serving | None = None,
    seed: int = 0,
    quiet: bool = False,
    storage_uri: str | None = None,
    storage: dict[str, Any] | None = None,
    precision: str = "fp32",
    gpu_memory: str | None = None,
    data: UserData | None = None,
    fallback: bool = True,
    gate_batch: int = GATE_BATCH,
    started: float | None = None,
    pipeline: Pipeline | None = None,
) -> ExportReport:
    """Export, verify and write the Triton model directory; raise VerificationError if a check fails.

    The config is what the operator would render for `serving` on a pod with this machine's CPUs: threads
    derived from them unless set, the queue bound from the capacity measured here unless set. A reduced
    `precision` is made from the verified fp32 file, calibrated and gated on the user's `data` (a built-in network
    may use its own inputs), and served only if it passes the gate, run `gate_batch` samples at a time, with compute
    nodes left in fp32 where that makes it pass unless `fallback` is False. `gpu_memory` serves it on one GPU with
    that much device memory. Before the work after the fp32 file's checks, the memory it needs is bounded
    (`inferop_export.memory`) and refused where this process cannot have it. The model directory is made in a
    temporary directory and moved into `repo` whole at the end: a failed or killed export leaves the repository
    as it was. `started`: the `time.perf_counter()` at which the work began, for the report's time (the command
    counts building the source); by default, now. With a `pipeline`, the model is written as `<name>_model` beside
    its stages and the ensemble `<name>` (`inferop_export.pipeline`), all proved together before any is installed."""
    started = time.perf_counter() if started is None else started
    check_precision(precision, source.gate, source.name, data)
    if pipeline is not None:
        check_wraps(source)
    if gpu_memory is not None:
        parse_quantity(gpu_memory, "--gpu-memory (gpu.memory)")  # before anything is written
    if gate_batch < 1:
        raise PrecisionError(f"--gate-batch {gate_batch}: must be at least 1")
    serving = serving or Serving()
    directory = source.name if pipeline is None else member_name(source.name, "model")
    model_dir = repo / directory
    reduced = precision != "fp32"
    progress = Progress(total=(8 if reduced else 6) + (2 if pipeline else 0), quiet=quiet)
    with tempfile.TemporaryDirectory(prefix="inferop-export-") as work:
        staged = Path(work) / "repo" / directory
        model_path = staged / "1" / MODEL_FILENAME
        model_path.parent.mkdir(parents=True)
        # A reduced precision starts from fp32 beside the model directory: it is served only if it passes.
        fp32_path = Path(work) / MODEL_FILENAME if reduced else model_path
        with progress.step(f"writing {source.name} as ONNX"):
            source.write_onnx(fp32_path, serving.batching.max_batch_size, seed)
        with progress.step("onnx.checker"):
            try:
                onnx.checker.check_model(str(fp32_path), full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
                reason = " ".join(str(error).split())[:500]
                raise VerificationError(f"{source.name}: onnx.checker refuses the model: {reason}") from None
        model = onnx.load(str(fp32_path))
        session = onnxruntime_session(fp32_path, model)
        signature = read_signature(model, source.overrides)
        check_labels_fit(source, signature)
        notes = list(signature.notes)
        if not signature.batched and serving.batching.max_batch_size:
            batching = serving.batching.model_copy(update={"max_batch_size": 0})
            serving = serving.model_copy(update={"batching": batching})
        batch = serving.batching.samples_per_batch
        fp32_profile = profile_onnx(model, parameters=source.parameters, input_shapes=signature.input_shapes(1))
        if reduced:
            calibration, validation, stated = precision_inputs(source, signature, data, seed + 3)
            gate_batch = min(gate_batch, validation.samples)  # never more at once than there are
        memory = ExportMemory(
            resident_bytes(),
            fp32_profile.weight_bytes,
            fp32_profile.activation_bytes_per_sample,
            export_runs(batch, gate_batch if reduced else None),
        )
        check_fits(memory, *memory_headroom())
        progress.say(f"memory: {memory.describe()}")

        with progress.step("ONNX Runtime against the source"):
            comparison = compare_with_source(source, session, fp32_path, signature, fp32_profile, seed)
        del session  # its weights and arena, before int8's work
        parity, against = comparison.parity, comparison.against
        failed = [p for p in parity if p["maxAbsDiff"] > source.tolerance]
        if failed:
            details = ", ".join(f"batch {p['batch']} {p['output']}: {p['maxAbsDiff']:.3g}" for p in failed)
            raise VerificationError(
                f"{source.name}: ONNX Runtime differs from {against} beyond tolerance {source.tolerance:g} ({details})"
            )
        if not parity:
            notes.append(f"outputs not compared: {against}")
        gate, fp32_rate, attempts, all_int8_rate = None, None, [], None
        if reduced:
            with progress.step(
                f"{precision}: static quantization calibrated on {calibration.origin}, gated against fp32 on "
                f"{validation.origin}"
            ):
                attempts = int8_with_fallback(
                    fp32_path,
                    Path(work),
                    calibration,
                    validation,
                    signature,
                    stated,
                    gate_batch,
                    gate_samples(gate_batch) * memory.activation_bytes,
                    fallback,
                    progress.say,
                )
            gate = attempts[-1].gate
            if not gate.passed:
                first = attempts[0].gate
                tried = "".join(f"; with the {a.why}: {'; '.join(a.gate.failures)}" for a in attempts[1:])
                raise VerificationError(
                    f"{source.name}: {precision} fails its accuracy gate ({'; '.join(first.failures)}); "
                    f"{first.describe()}{tried}. Nothing was written: export it as fp32"
                )
            with progress.step(f"fp32 capacity, to compare {precision} with (one thread, batch {batch})"):
                fp32_rate = measure_capacity(source, fp32_path, signature, batch, seed)
                if len(attempts) > 1:  # what the nodes left in fp32 cost, against every node in int8
                    all_int8_rate = measure_capacity(source, attempts[0].path, signature, batch, seed)
            shutil.copyfile(attempts[-1].path, model_path)
            model = onnx.load(str(model_path))
        with progress.step("profile"):
            profile = profile_onnx(model, parameters=source.parameters, input_shapes=signature.input_shapes(1))
        with progress.step(f"capacity: ONNX Runtime, one thread, batch {batch}"):
            rate = measure_capacity(source, model_path, signature, batch, seed)
        speedup = round(rate / fp32_rate, 2) if fp32_rate else None
        notes += fallback_notes(attempts, rate, all_int8_rate)
        # An output whose size varies has no bytes in its dims: the memory estimate takes what was measured.
        measured_io = comparison.io_bytes_per_sample if any(t.dynamic for t in signature.outputs) else None
        profile = dataclasses.replace(profile, samples_per_cpu_second=rate, io_bytes_per_sample=measured_io)

        # The user's validation set goes with the model: a rollout's agreement check sends it first.
        recorded = record_validation(validation, signature, staged) if reduced else None
        outputs = list(signature.outputs)
        if source.labels:
            outputs[0] = outputs[0].model_copy(update={"label_filename": LABELS_FILENAME})
        spec = parse_spec(
            {
                **serving.model_dump(by_alias=True, exclude_unset=True),
                "model": Model(
                    name=source.name,
                    storage_uri=storage_uri or f"hostpath://{model_dir.resolve()}",
                    storage=ObjectStorage.model_validate(storage) if storage else None,
                    profile=Profile.model_validate(profile.as_spec()),
                    weights=source.weights,
                    sha256=sha256_file(model_path),
                    inputs=[Tensor.of(t) for t in signature.inputs],
                    outputs=[Tensor.of(t) for t in outputs],
                    processing=source.processing,
                    validation=recorded,
                    precision="int8" if reduced else "fp32",
                ).model_dump(  # an fp32 model's manifest says nothing of int8
                    by_alias=True, exclude_none=True, exclude=None if reduced else {"precision", "int8_nodes"}
                ),
                "resources": {"limits": {"cpu": local_cpus(), **({GPU_RESOURCE: 1} if gpu_memory else {})}},
                **({"gpu": {"memory": gpu_memory}} if gpu_memory else {}),
                **({"pipeline": pipeline.model_dump(by_alias=True, exclude_none=True)} if pipeline else {}),
            }
        )
        plan = plan_service(spec)  # the operator's checks too: an export that oversubscribes is refused
        proved = None  # with a pipeline: how it was proved
        if plan.pipeline is not None:
            from inferop_export import pipeline as image_pipeline

            with progress.step("pipeline: the stages' rate (decode, preprocess, top-k; one thread)"):
                rate = image_pipeline.measure_stage_rate(plan.pipeline, image_pipeline.typical_images())
                progress.say(f"{rate:.1f} images per CPU-second")
            assert spec.pipeline is not None
            measured = spec.pipeline.model_copy(update={"images_per_cpu_second": rate})
            spec = spec.model_copy(update={"pipeline": measured})
            plan = plan_service(spec)
        with progress.step("config.pbtxt"):
            served = plan.serving if plan.pipeline is None else plan.pipeline.model
            (staged / "config.pbtxt").write_text(render_model_config(served))
            if source.labels:
                (staged / LABELS_FILENAME).write_text("\n".join(source.labels) + "\n")
        if plan.pipeline is not None:
            assert source.labels is not None
            members = write_pipeline_members(plan.pipeline, staged.parent, staged / LABELS_FILENAME, link=False)
            with progress.step(f"pipeline: photographs through {plan.pipeline.name} on tritonserver"):
                check = image_pipeline.check_pipeline(plan.pipeline, staged.parent, staged, source.labels)
                proved = check.describe(plan.pipeline)
            for name, member in members.items():
                install(member, repo / name)
        install(staged, model_dir)

    return ExportReport(
        model=source.name,
        model_path=str(model_dir / "1" / MODEL_FILENAME),
        config_path=str(model_dir / "config.pbtxt"),
        checker="passed",
        parity=parity,
        parity_against=against,
        tolerance=source.tolerance,
        profile=profile,
        serving=served,  # as written: a pipeline's model under its member's name
        spec=spec,
        precision=precision,
        gate=gate,
        attempts=attempts,
        speedup=speedup,
        speed_verdict=None if speedup is None else int8_verdict(speedup, cpu_int8_instructions()),
        notes=notes,
        seconds=progress.seconds,
        cost=Cost(round(time.perf_counter() - started, 3), peak_resident_bytes(), memory.bound_bytes),
        pipeline=proved,
    )


def check_wraps(source: Source) -> None:
    """Before any work: a pipeline wraps an image classifier whose preprocessing and classes are declared (the
    spec checks its tensors once they are known)."""
    if source.processing is None or source.processing.kind != "imageClassification":
        missing = "its preprocessing (--processing with kind imageClassification)"
    elif not source.labels:
        missing = "its class names (--labels)"
    else:
        return
    raise SourceError(f"{source.name}: --pipeline image needs an image classifier with {missing}")


def record_validation(validation: Samples, signature: Signature, model_dir: Path) -> ValidationSet | None:
    """The user's validation inputs written into the model directory (VALIDATION_FILENAME), and what the spec records
    of them; None for a built-in network's generated inputs, which the check makes itself."""
    if not isinstance(validation, SampleSet):
        return None
    path = model_dir / VALIDATION_FILENAME
    np.savez(path, **{t.name: array for t, array in zip(signature.inputs, validation.arrays, strict=True)})
    return ValidationSet(samples=validation.samples, sha256=sha256_file(path), size_bytes=path.stat().st_size)


def install(staged: Path, model_dir: Path) -> None:
    """Put the finished model directory `staged` at `model_dir`, so that a kill at any moment leaves the repository
    with the old directory or the new one, whole: copied beside it first (a rename is atomic only within one file
    system), then renamed into place, the old one renamed aside just before (nothing but two renames between) and
    removed after. The copy is a hidden directory without a config until its last file, which no server loads."""
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    beside = Path(tempfile.mkdtemp(prefix=f".{model_dir.name}.", dir=model_dir.parent))
    try:
        shutil.copytree(staged, beside, dirs_exist_ok=True, ignore=shutil.ignore_patterns("config.pbtxt"))
        shutil.copyfile(staged / "config.pbtxt", beside / "config.pbtxt")
        old = beside.with_name(f"{beside.name}.old")
        if model_dir.exists():
            model_dir.rename(old)
        beside.rename(model_dir)
    except BaseException:
        shutil.rmtree(beside, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def check_labels_fit(source: Source, signature: Signature) -> None:
    """Class names, where given, one for each class of the first output (Triton's classification extension)."""
    first = signature.outputs[0]
    classes = first.dims[-1] if first.dims else None
    if source.labels and classes not in (None, DYNAMIC_DIM, len(source.labels)):
        raise SourceError(
            f"{source.name}: --labels names {len(source.labels)} classes; output {first.name!r} has {classes}"
        )


def fallback_notes(attempts: list[Attempt], rate: float, all_int8_rate: float | None) -> list[str]:
    """What leaving nodes in fp32 made pass, and what it cost against every node in int8 (both measured here)."""
    if len(attempts) < 2:
        return []
    served = attempts[-1]
    cost = f"; capacity {rate / all_int8_rate:.2f}x that of every node in int8" if all_int8_rate else ""
    return [
        f"int8 failed its gate with every compute node int8 ({'; '.join(attempts[0].gate.failures)}) and passes "
        f"with the {served.why}: {', '.join(served.fp32_nodes)}{cost}"
    ]


def onnxruntime_session(path: Path, model: onnx.ModelProto) -> Any:
    """ONNX Runtime's session on the file, or an error that says why it cannot load it (an opset too new...)."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as error:  # ONNX Runtime raises its own Fail/InvalidGraph/NotImplemented kinds
        message = str(error)
        opset = re.search(r"Opset (\d+)", message)
        if opset:
            domains = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
            raise VerificationError(
                f"{path.name}: ONNX Runtime {ort.__version__} cannot load opset {opset[1]} (the model imports "
                f"{domains}); re-export it with an opset ONNX Runtime supports (onnx {onnx.__version__} knows up "
                f"to {onnx.defs.onnx_opset_version()})"
            ) from None
        raise VerificationError(
            f"{path.name}: ONNX Runtime {ort.__version__} cannot load it: {message[:500]}"
        ) from None


@dataclass(frozen=True)
class Comparison:
    parity: list[dict[str, Any]]  # per batch and output: maxAbsDiff, maxAbsValue; empty if nothing compared
    against: str  # the source compared with, or why there was none
    io_bytes_per_sample: int  # inputs and outputs of one sample, as run


def compare_with_source(
    source: Source, session: Any, path: Path, signature: Signature, profile: ModelProfile, seed: int
) -> Comparison:
    """Max absolute difference of every output, ONNX Runtime against the source, at each parity batch size
    (one run for a model without a batch axis); every output's shape is checked against the signature."""
    against = "PyTorch" if isinstance(source, TorchModule) else "ONNX reference"
    reference = source.reference
    if isinstance(source, OnnxFile):
        if profile.macs_per_sample > REFERENCE_MAX_MACS:
            reference = _no_reference
            against = (
                f"no source to compare with: a user's ONNX file, too large ({profile.macs_per_sample / 1e9:.2f} G "
                f"multiply-accumulates a sample) for ONNX's reference implementation"
            )
        else:
            reference = _onnx_reference(path)
    rng = np.random.default_rng(seed + 1)
    results: list[dict[str, Any]] = []
    io_bytes = 0
    for batch in PARITY_BATCHES if signature.batched else (1,):
        inputs = source.inputs_for(signature, batch, rng)
        feeds = {spec.name: array for spec, array in zip(signature.inputs, inputs, strict=True)}
        actual = session.run([t.name for t in signature.outputs], feeds)
        for spec, got in zip(signature.outputs, actual, strict=True):
            want_shape = signature.shape(spec, batch)
            if len(got.shape) != len(want_shape) or any(
                w != DYNAMIC_DIM and w != g for w, g in zip(want_shape, got.shape, strict=True)
            ):
                raise VerificationError(
                    f"{source.name}: output {spec.name!r} has shape {list(got.shape)}, expected {want_shape} (-1: any)"
                )
        io_bytes = max(io_bytes, sum(a.nbytes for a in (*inputs, *actual)) // batch)
        expected = reference(inputs)
        if expected is None:  # nothing to compare with: only the shapes above were checked
            continue
        for spec, want, got in zip(signature.outputs, expected, actual, strict=True):
            diff = float(np.max(np.abs(want.astype(np.float64) - got.astype(np.float64)))) if got.size else 0.0
            scale = float(np.max(np.abs(got.astype(np.float64)))) if got.size else 0.0
            results.append({"batch": batch, "output": spec.name, "maxAbsDiff": diff, "maxAbsValue": scale})
    return Comparison(results, against, io_bytes)


def _no_reference(inputs: Inputs) -> Inputs | None:
    return None


def _onnx_reference(path: Path) -> Any:
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(str(path))

    def run(inputs: Inputs) -> Inputs:
        return tuple(evaluator.run(None, dict(zip(evaluator.input_names, inputs, strict=True))))

    return run


def measure_capacity(
    source: Source,
    path: Path,
    signature: Signature,
    batch: int,
    seed: int,
    seconds: float = 2.0,
    clock: Callable[[], float] = time.thread_time,
) -> float:
    """Samples per CPU-second that one thread runs at `batch`: the capacity the queue bound is derived from.

    One intra-op thread that never spins, so the model runs on this thread alone, timed by the CPU time it was given
    (`time.thread_time`), not the clock: other work on the machine delays it but cannot halve the figure (wall-clock
    timing gave 297 and 691 samples/s 25 minutes apart on one loaded machine; 359-401 against this measure's 729-753
    beside three busy processes). The median of CAPACITY_WINDOWS windows after a warm-up run, together at least
    `seconds`. `clock`: another clock, for the benchmark that shows what the thread's CPU time does.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    inputs = source.inputs_for(signature, batch, np.random.default_rng(seed + 2))
    feeds = {spec.name: array for spec, array in zip(signature.inputs, inputs, strict=True)}
    session.run(None, feeds)
    rates = []
    for _ in range(CAPACITY_WINDOWS):
        runs, start = 0, clock()
        while runs < 1 or clock() - start < seconds / CAPACITY_WINDOWS:
            session.run(None, feeds)
            runs += 1
        rates.append(runs * batch / (clock() - start))
    return round(statistics.median(rates), 3)

"""Reduced precision at export, behind an accuracy gate.

int8 is ONNX Runtime's static quantization: QDQ format (QuantizeLinear/DequantizeLinear pairs that ONNX Runtime
fuses into int8 kernels), int8 weights per output channel, uint8 activations with ranges calibrated on the user's
calibration set (`--calibration`), or for a built-in network on inputs it generates. Before quantizing, average
pools become the depthwise convolutions they equal (`average_pools_as_depthwise_convs`). The quantized model is
then run beside the fp32 one on held-out inputs (`--validation`, or another seed): a model that does not keep
fp32's answers as its gate says (the network's, the output kind's, or `--gate`) is not written.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import onnx

from inferop_core.agreement import Comparison, Gate, GateResult, default_gate
from inferop_core.errors import InferopError
from inferop_core.processing import Processing
from inferop_core.tritonconfig import TensorSpec
from inferop_export.data import FORMS, DataError, SampleSet, check_labels, load_samples, samples_needed
from inferop_export.profile import tensor_sizes
from inferop_export.signature import Signature

if TYPE_CHECKING:  # the sources import torch; `inferop export --help` needs only PRECISIONS
    from inferop_export.sources import Inputs, OnnxFile, TorchModule

    Source = TorchModule | OnnxFile

# bf16 is not offered: ONNX Runtime refuses a Conv on bfloat16 tensors at load (README, "Reduced precision");
# fp16 is for GPUs.
PRECISIONS = ("fp32", "int8")
CALIBRATION_SAMPLES = 64
GATE_SAMPLES = 1000
# Samples the gate runs through each model at once (--gate-batch): what the search holds grows with it.
GATE_BATCH = 8
# The nodes int8 computes; the rest carry int8 tensors through or run in float.
QUANTIZED_OPS = frozenset({"Conv", "Gemm", "MatMul"})
# Validation samples that each node's added quantization noise is measured on, to choose which to leave in fp32.
SENSITIVITY_SAMPLES = 100
# Elements of a tensor whose squares are summed at once, in float64: 16 MiB of temporaries, whatever the tensor.
SQUARES_CHUNK = 2**20
# How ONNX Runtime's QDQ quantizer names a tensor's quantized-dequantized copy, and how many single-consumer nodes
# (a ReLU it folds into the quantization) are followed to find a node's output in the int8 model.
DEQUANTIZED = "_DequantizeLinear_Output"
FOLLOWED_NODES = 2
# Quantizations tried after every compute node in int8 fails its gate, each with more nodes left in fp32.
MAX_FALLBACKS = 4
# Outputs that are not judged by their top-1 class, where neither the network nor --gate says: each sample's output
# keeps at least this cosine similarity to fp32's. A scale-free measure of a whole output; a largest difference is
# set by the rare input beyond the calibrated range (24% of a trained classifier's largest logit, where the least
# cosine similarity of its 1,000 samples was 0.9905 with 8-bit weights).
MIN_COSINE = 0.98
GATE_KEYS = {
    "top1": "outputs judged by their top-1 class, comma-separated",
    "agreement": "share of inputs on which their top-1 class must agree with fp32, in (0, 1)",
    "max-abs": "the other outputs' largest absolute difference from fp32",
    "min-cosine": f"the other outputs' least cosine similarity to fp32 on any sample (default {MIN_COSINE})",
    "accuracy-drop": "how far accuracy against the validation labels may fall below fp32's, in [0, 1)",
}
GATE_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    "agreement": (lambda x: 0 < x < 1, "in (0, 1)"),
    "max-abs": (lambda x: x > 0, "above 0"),
    "min-cosine": (lambda x: -1 < x < 1, "in (-1, 1)"),
    "accuracy-drop": (lambda x: 0 <= x < 1, "in [0, 1)"),
}


class PrecisionError(InferopError, ValueError):
    """A precision cannot be given to this model (unknown, no gate, calibration inputs of the wrong shape)."""


class GateFailed(InferopError, RuntimeError):
    """The reduced-precision model lost too much of fp32's answers; the message has the numbers."""


@dataclass(frozen=True)
class UserData:
    """What the user gives a reduced precision: a calibration and a validation set, and the gate's settings
    (`--gate key=value`, GATE_KEYS)."""

    calibration: Path | None = None
    validation: Path | None = None
    gate: tuple[str, ...] = ()

    @property
    def sets(self) -> bool:
        return self.calibration is not None or self.validation is not None


def check_precision(precision: str, gate: Gate | None, name: str, data: UserData | None = None) -> None:
    """Refuse what cannot be exported before any work is done: a user's model is never calibrated on noise."""
    data = data or UserData()
    if precision not in PRECISIONS:
        raise PrecisionError(f"--precision {precision!r}: choose one of {', '.join(PRECISIONS)}")
    if precision == "fp32":
        if data.sets or data.gate:
            raise PrecisionError("--calibration, --validation and --gate are for a reduced --precision (int8)")
        return
    if (data.calibration is None) != (data.validation is None):
        raise PrecisionError(
            f"--precision {precision}: give both --calibration and --validation (held-out samples the calibration "
            "never saw); one was given"
        )
    if gate is None and not data.sets:
        raise PrecisionError(
            f"--precision {precision}: {name} is calibrated and gated on your own samples: give --calibration PATH "
            f"and --validation PATH, each {FORMS}"
        )
    _parse_gate(data.gate)  # before any work, too


class Samples(Protocol):
    """Inputs a batch at a time, with their labels where known."""

    @property
    def origin(self) -> str: ...

    @property
    def samples(self) -> int: ...

    def batches(self, batch: int) -> Iterator[tuple[Inputs, np.ndarray | None]]: ...


@dataclass(frozen=True)
class GeneratedSamples:
    """A built-in network's inputs, as its source makes them from `seed`."""

    source: Source
    signature: Signature
    samples: int
    seed: int
    origin: str = "generated inputs"

    def batches(self, batch: int) -> Iterator[tuple[Inputs, np.ndarray | None]]:
        rng = np.random.default_rng(self.seed)
        for start in range(0, self.samples, batch):
            inputs = self.source.inputs_for(self.signature, min(batch, self.samples - start), rng)
            _check_shapes(inputs, self.signature, min(batch, self.samples - start))
            yield inputs, None


def precision_inputs(
    source: Source, signature: Signature, data: UserData | None, seed: int
) -> tuple[Samples, Samples, Gate]:
    """The calibration and validation samples and the gate: the user's where given, else the network's own."""
    data = data or UserData()
    calibration: Samples
    validation: Samples
    if data.calibration is not None and data.validation is not None:
        declared = (source.processing, source.labels)
        calibration = load_samples(data.calibration, "--calibration", signature, *declared)
        validation = load_samples(data.validation, "--validation", signature, *declared)
    else:
        calibration = GeneratedSamples(source, signature, CALIBRATION_SAMPLES, seed)
        validation = GeneratedSamples(source, signature, GATE_SAMPLES, seed + 1)
    labelled = isinstance(validation, SampleSet) and validation.labels is not None
    gate = stated_gate(source.gate, source.processing, signature.outputs, labelled, data.gate)
    if isinstance(validation, SampleSet) and validation.labels is not None:
        if not gate.top1:
            raise DataError(f"{validation.origin}: holds labels, but no output is judged by its class (--gate top1=)")
        output = next(t for t in signature.outputs if t.name == gate.top1[0])
        if output.dims and output.dims[-1] > 0:
            check_labels(validation, output.name, output.dims[-1])
    needed = samples_needed(gate.min_agreement)
    if validation.samples < needed:
        raise DataError(
            f"{validation.origin}: {validation.samples} samples; a gate on {gate.min_agreement:.1%} agreement needs "
            f"at least {needed} (the worst of n bounds the share doing worse below 3/n)"
        )
    return calibration, validation, gate


def stated_gate(
    base: Gate | None,
    processing: Processing | None,
    outputs: Sequence[TensorSpec],
    labelled: bool,
    stated: Sequence[str],
) -> Gate:
    """The gate: `--gate` settings over the network's gate, else one that fits the outputs: top-1 agreement for a
    classifier's output (as its processing says, or the first output where the validation set has labels), and the
    other outputs at MIN_COSINE."""
    settings = _parse_gate(stated)
    names = [t.name for t in outputs]
    if "top1" in settings:
        top1 = tuple(name for name in settings["top1"].split(",") if name)
        unknown = [name for name in top1 if name not in names]
        if unknown:
            raise PrecisionError(f"--gate top1={settings['top1']}: no output {unknown[0]!r}; the outputs are {names}")
    elif base is not None:
        top1 = base.top1
    else:
        top1 = default_gate(processing, outputs).top1 or (tuple(names[:1]) if labelled else ())
    others = [name for name in names if name not in top1]
    absolute: dict[str, Any] = {}
    if "max-abs" in settings:
        absolute = dict.fromkeys(others, settings["max-abs"])
    elif base is not None and "min-cosine" not in settings:
        absolute = {name: tolerance for name, tolerance in base.max_abs_diff.items() if name in others}
    cosine = dict.fromkeys([name for name in others if name not in absolute], settings.get("min-cosine", MIN_COSINE))
    default = base or Gate()
    return Gate(
        top1=top1,
        min_agreement=float(settings.get("agreement", default.min_agreement)),
        max_abs_diff={k: float(v) for k, v in absolute.items()},
        min_cosine={k: float(v) for k, v in cosine.items()},
        max_accuracy_drop=float(settings.get("accuracy-drop", default.max_accuracy_drop)),
    )


def _parse_gate(stated: Sequence[str]) -> dict[str, str]:
    """`--gate key=value` flags as a dict; errors quote the flag and say what is accepted."""
    settings: dict[str, str] = {}
    for text in stated:
        key, equals, value = (part.strip() for part in text.partition("="))
        if not equals or key not in GATE_KEYS or not value:
            choices = "; ".join(f"{k} ({meaning})" for k, meaning in GATE_KEYS.items())
            raise PrecisionError(f"--gate {text!r}: expected key=value, one of {choices}")
        if key in GATE_RANGES:
            within, accepted = GATE_RANGES[key]
            try:
                number = float(value)
            except ValueError:
                raise PrecisionError(f"--gate {text!r}: {value!r} is not a number") from None
            if not (math.isfinite(number) and within(number)):
                raise PrecisionError(f"--gate {text!r}: {key} must be {accepted}")
        settings[key] = value
    return settings


def _check_shapes(inputs: Inputs, signature: Signature, batch: int) -> None:
    for spec, array in zip(signature.inputs, inputs, strict=True):
        want = signature.shape(spec, batch)
        if list(array.shape) != want:
            raise PrecisionError(
                f"calibration input {spec.name!r} has shape {list(array.shape)}; the model takes {want}"
            )


class CalibrationInputs:
    """ONNX Runtime's CalibrationDataReader over the calibration samples, one at a time."""

    def __init__(self, samples: Samples, signature: Signature) -> None:
        self.signature = signature
        self.batches = samples.batches(1)

    def get_next(self) -> dict[str, np.ndarray] | None:
        batch = next(self.batches, None)
        if batch is None:
            return None
        return {spec.name: array for spec, array in zip(self.signature.inputs, batch[0], strict=True)}


def average_pools_as_depthwise_convs(model: onnx.ModelProto) -> int:
    """Rewrite in place each AveragePool that a depthwise Conv computes exactly; return how many.

    ONNX Runtime's int8 average pool (QLinearAveragePool) is a slow kernel: in Inception V3 at batch 8 its 9
    pools took 35% of the int8 time (71 of 200 ms) against 55% for all 94 convolutions. A depthwise int8 Conv
    runs on the vectorised convolution kernels, and loses nothing: a window's average, zero padding counted,
    is a convolution with weights 1/(kh*kw), which per-channel int8 holds exactly (63 at scale 1/(63*kh*kw) in the
    7-bit weights `quantize_int8` writes). Pools that exclude padding from the count, round up, or whose channels
    are unknown are left as they are.
    """
    model.CopyFrom(onnx.shape_inference.infer_shapes(model))
    graph = model.graph
    shapes = {v.name: v.type.tensor_type.shape for v in [*graph.input, *graph.value_info]}
    nodes, rewritten = [], 0
    for node in graph.node:
        channels = _depthwise_channels(node, shapes) if node.op_type == "AveragePool" else None
        if channels is None:
            nodes.append(node)
            continue
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        kernel = list(attrs["kernel_shape"])
        weights = onnx.numpy_helper.from_array(
            np.full((channels, 1, *kernel), 1 / (kernel[0] * kernel[1]), dtype=np.float32), f"{node.output[0]}.box"
        )
        graph.initializer.append(weights)
        conv = onnx.helper.make_node(
            "Conv",
            [node.input[0], weights.name],
            list(node.output),
            name=node.name,
            group=channels,
            kernel_shape=kernel,
            pads=list(attrs.get("pads", [0, 0, 0, 0])),
            strides=list(attrs.get("strides", [1, 1])),
        )
        nodes.append(conv)
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return rewritten


def _depthwise_channels(pool: onnx.NodeProto, shapes: dict[str, onnx.TensorShapeProto]) -> int | None:
    """The channel count of a 2-D AveragePool that a depthwise Conv computes exactly, else None."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in pool.attribute}
    shape = shapes.get(pool.input[0])
    exact = (
        shape is not None
        and len(shape.dim) == 4
        and shape.dim[1].HasField("dim_value")
        and len(attrs.get("kernel_shape", [])) == 2
        and attrs.get("auto_pad", b"NOTSET") == b"NOTSET"
        and not attrs.get("ceil_mode", 0)
        and (attrs.get("count_include_pad", 0) or not any(attrs.get("pads", [])))
        and all(d == 1 for d in attrs.get("dilations", [1, 1]))
    )
    return int(shape.dim[1].dim_value) if exact and shape is not None else None


@contextmanager
def prepared_for_int8(fp32: Path, pools_as_convs: bool = True) -> Iterator[Path]:
    """`fp32` as ONNX Runtime's quantizer wants it (shapes inferred, foldable nodes folded), average pools rewritten
    as depthwise convolutions unless `pools_as_convs` is False (to measure what the rewrite is worth)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="inferop-quantize-") as work:
        prepared = Path(work) / "prepared.onnx"
        quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
        model = onnx.load(str(prepared))
        if pools_as_convs and average_pools_as_depthwise_convs(model):
            onnx.save_model(model, str(prepared))
        yield prepared


def quantize_int8(
    fp32: Path,
    target: Path,
    calibration: Samples,
    signature: Signature,
    pools_as_convs: bool = True,
    fp32_nodes: Sequence[str] = (),
) -> None:
    """`target`: `fp32` statically quantized to int8 (QDQ, per-channel weights), its activation ranges calibrated
    on `calibration`, but for the compute nodes named in `fp32_nodes`, which stay fp32 (see `prepared_for_int8`)."""
    with prepared_for_int8(fp32, pools_as_convs) as prepared:
        quantize_prepared(prepared, target, calibration, signature, fp32_nodes)


def quantize_prepared(
    prepared: Path, target: Path, calibration: Samples, signature: Signature, fp32_nodes: Sequence[str] = ()
) -> None:
    """Static quantization of a model `prepared_for_int8`, the compute nodes in `fp32_nodes` left in fp32.

    Weights take 7 bits of the 8 (`reduce_range`): on a CPU without VNNI, ONNX Runtime multiplies uint8 by int8 with
    an instruction (VPMADDUBSW) whose sums of pairs saturate at 16 bits (255 x 127 x 2 does not fit; 255 x 63 x 2
    does), so a full-range model would answer differently there than where its gate ran. A trained classifier lost
    nothing measurable: agreement 99.5% against 99.4%, accuracy 95.7% against 95.8% with 8-bit weights."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationInputs, CalibrationDataReader):
        pass

    quantize_static(
        str(prepared),
        str(target),
        Reader(calibration, signature),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
        reduce_range=True,
        nodes_to_exclude=list(fp32_nodes),
    )


@dataclass(frozen=True)
class Attempt:
    """One quantization behind the gate: the compute nodes it left in fp32, why those, and how it kept fp32's
    answers."""

    fp32_nodes: tuple[str, ...]
    why: str
    gate: GateResult
    path: Path

    def as_dict(self) -> dict[str, Any]:
        return {"fp32Nodes": list(self.fp32_nodes), "why": self.why, "passed": self.gate.passed,
                "summary": self.gate.describe()}  # fmt: skip


def int8_with_fallback(
    fp32: Path,
    work: Path,
    calibration: Samples,
    validation: Samples,
    signature: Signature,
    gate: Gate,
    batch: int,
    budget: int,
    fallback: bool = True,
    say: Callable[[str], None] = lambda _: None,
) -> list[Attempt]:
    """int8 with every compute node quantized; then, while the gate fails and `fallback` allows, the standard
    remedies, at most MAX_FALLBACKS more quantizations and never more than half the compute nodes (rounded up) in
    fp32: the nodes that add the most quantization noise (`sensitive_nodes`), measured again on each failed attempt
    and doubled in number each time, and last the first and last compute nodes. The gate runs `batch` samples
    through each model at once, and no run of the noise measure holds more than `budget` bytes. The attempts in order;
    the last passed if any did."""
    attempts: list[Attempt] = []
    with prepared_for_int8(fp32) as prepared:
        nodes = compute_nodes(onnx.load(str(prepared)))
        limit = math.ceil(len(nodes) / 2)

        def attempt(keep: Sequence[str], why: str) -> bool:
            path = work / f"int8-{len(attempts)}.onnx"
            quantize_prepared(prepared, path, calibration, signature, keep)
            result = run_gate("int8", fp32, path, validation, signature, gate, batch)
            attempts.append(Attempt(tuple(keep), why, result, path))
            say(f"{why}: {'passes' if result.passed else 'fails'} ({result.describe()})")
            return result.passed

        if attempt((), "every compute node int8") or not fallback:
            return attempts
        keep: list[str] = []
        while len(attempts) < MAX_FALLBACKS and len(keep) < limit:  # the last one kept for the first and last
            ranked = sensitive_nodes(prepared, attempts[-1].path, validation, signature, nodes, budget)
            keep += [name for name in ranked if name not in keep][: min(max(1, len(keep)), limit - len(keep))]
            if attempt(keep, f"{len(keep)} compute node(s) adding the most quantization noise in fp32"):
                return attempts
        ends = (nodes[0], nodes[-1])
        if 2 <= limit < len(nodes) and set(ends) - set(keep):
            attempt(ends, "first and last compute nodes in fp32")
    return attempts


def compute_nodes(model: onnx.ModelProto) -> list[str]:
    """The nodes int8 computes (convolutions and matrix products), named, in graph order."""
    return [node.name for node in model.graph.node if node.op_type in QUANTIZED_OPS and node.name]


def sensitive_nodes(
    prepared: Path, quantized: Path, validation: Samples, signature: Signature, nodes: Sequence[str], budget: int
) -> list[str]:
    """`nodes` by the quantization noise each adds, most first: the relative noise power of what it hands on less
    that of what it takes, the int8 model's tensors against fp32's on the first SENSITIVITY_SAMPLES validation
    samples. Both run without graph optimisations, int8 as quantize-dequantize in float, so its tensors are there
    to read: what a node takes before its own input is quantized, what it hands on after its output is (the
    quantizer folds a ReLU into that, so the fp32 side is followed through such a node). No run holds more than
    `budget` bytes of tensors (`noise_powers`)."""
    fp32_model = onnx.load(str(prepared))
    fp32_graph = fp32_model.graph
    by_name = {node.name: node for node in fp32_graph.node}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for node in fp32_graph.node:
        for tensor in node.input:
            consumers.setdefault(tensor, []).append(node)
    int8_model = onnx.load(str(quantized))
    produced = {output for node in int8_model.graph.node for output in node.output}
    given = {t.name for t in signature.inputs}

    def took(tensor: str) -> tuple[str, str] | None:
        for read in (tensor, f"{tensor}{DEQUANTIZED}"):
            if read in produced or read in given:
                return tensor, read
        return None

    def handed_on(tensor: str) -> tuple[str, str] | None:
        for _ in range(FOLLOWED_NODES + 1):
            for read in (f"{tensor}{DEQUANTIZED}", tensor):
                if read in produced:
                    return tensor, read
            after = consumers.get(tensor, [])
            if len(after) != 1 or len(after[0].output) != 1:
                return None
            tensor = after[0].output[0]
        return None

    ends = {name: (took(by_name[name].input[0]), handed_on(by_name[name].output[0])) for name in nodes}
    pairs = sorted({pair for end in ends.values() for pair in end if pair is not None and pair[0] not in given})
    powers = noise_powers(fp32_model, int8_model, pairs, validation, signature, budget)

    def noise(pair: tuple[str, str] | None) -> float:
        if pair is None:
            return math.nan
        return 0.0 if pair[0] in given else powers[pair]  # the model's own input is the same in both

    added = {name: noise(ends[name][1]) - noise(ends[name][0]) for name in nodes}
    return sorted(nodes, key=lambda name: math.inf if math.isnan(added[name]) else -added[name])


def noise_powers(
    fp32: onnx.ModelProto,
    int8: onnx.ModelProto,
    pairs: Sequence[tuple[str, str]],
    samples: Samples,
    signature: Signature,
    budget: int,
) -> dict[tuple[str, str], float]:
    """For each (fp32 tensor, int8 tensor) pair, the int8 tensor's noise power relative to fp32's signal on the
    first SENSITIVITY_SAMPLES of `samples` (NaN where the shapes differ), both models without graph optimisations.

    The sums of squares are accumulated run by run, and no run holds more than about `budget` bytes of tensors
    (`noise_runs`): holding every tensor of both models for every sample took Inception V3's export past 24 GB."""
    sizes, activation = tensor_sizes(fp32, signature.input_shapes(1))
    error, power = dict.fromkeys(pairs, 0.0), dict.fromkeys(pairs, 0.0)
    for group, per_run in noise_runs(pairs, sizes, activation, budget):
        fp32_names, int8_names = sorted({f for f, _ in group}), sorted({q for _, q in group})
        fp32_session, int8_session = _unoptimised(fp32, fp32_names), _unoptimised(int8, int8_names)
        seen = 0
        for inputs, _ in samples.batches(per_run):
            take = min(len(inputs[0]), SENSITIVITY_SAMPLES - seen)
            feeds = {spec.name: array[:take] for spec, array in zip(signature.inputs, inputs, strict=True)}
            reference = dict(zip(fp32_names, fp32_session.run(fp32_names, feeds), strict=True))
            compared = dict(zip(int8_names, int8_session.run(int8_names, feeds), strict=True))
            for pair in group:
                want, got = reference[pair[0]], compared[pair[1]]
                if want.shape != got.shape:
                    error[pair] = math.nan
                    continue
                for start in range(0, want.size, SQUARES_CHUNK):  # float64 sums, their temporaries kept small
                    reference_part = want.reshape(-1)[start : start + SQUARES_CHUNK].astype(np.float64)
                    difference = got.reshape(-1)[start : start + SQUARES_CHUNK] - reference_part
                    error[pair] += float(difference @ difference)
                    power[pair] += float(reference_part @ reference_part)
            seen += take
            if seen >= SENSITIVITY_SAMPLES:
                break
    return {pair: error[pair] / max(power[pair], 1e-30) for pair in pairs}


def noise_runs(
    pairs: Sequence[tuple[str, str]], sizes: dict[str, int], activation: int, budget: int
) -> list[tuple[list[tuple[str, str]], int]]:
    """The noise measure's runs: groups of pairs, each with the samples a run of it takes, so that a run holds at
    most `budget` bytes. A sample of a group holds both sides of each pair (their bytes in `sizes`; an int8 tensor
    has its fp32 twin's shape, and one of unknown size counts as the whole budget) and the `activation` bytes the
    model computes beside them. A group takes as many pairs as fit, a run as many samples, at least one: a tensor
    larger than the budget is measured alone, one sample at a time."""
    runs: list[tuple[list[tuple[str, str]], int]] = []

    def held(members: Sequence[tuple[str, str]]) -> int:
        twins = {q: f for f, q in members}
        tensors = [*{f for f, _ in members}, *twins.values()]
        return activation + sum(sizes.get(name, budget) for name in tensors)

    def close(members: list[tuple[str, str]]) -> None:
        runs.append((members, max(1, min(SENSITIVITY_SAMPLES, budget // held(members)))))

    group: list[tuple[str, str]] = []
    for pair in pairs:
        if group and held([*group, pair]) > budget:
            close(group)
            group = []
        group.append(pair)
    if group:
        close(group)
    return runs


def _unoptimised(model: onnx.ModelProto, outputs: Sequence[str]) -> Any:
    """An ONNX Runtime session on `model` that answers the tensors named in `outputs`, without graph optimisations
    (which would fuse some of them away)."""
    import onnxruntime as ort

    del model.graph.output[:]
    model.graph.output.extend(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in outputs
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    # Without the arena what a run asked for is freed with it: Inception V3's measure took 275 MB, with it 446.
    options.enable_cpu_mem_arena = False
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_gate(
    precision: str, fp32: Path, reduced: Path, validation: Samples, signature: Signature, gate: Gate, batch: int
) -> GateResult:
    """Both models on the held-out `validation` samples, `batch` at a time, counted against `gate`."""
    import onnxruntime as ort

    sessions = [ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]) for path in (fp32, reduced)]
    names = [t.name for t in signature.outputs]
    comparison = Comparison(gate)
    for inputs, labels in validation.batches(batch):
        feeds = {spec.name: array for spec, array in zip(signature.inputs, inputs, strict=True)}
        want, got = ({n: o for n, o in zip(names, s.run(names, feeds), strict=True)} for s in sessions)
        comparison.add(want, got, len(inputs[0]), labels)
    return comparison.result(precision)

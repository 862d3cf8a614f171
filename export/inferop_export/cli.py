"""`inferop export NETWORK|onnx|torch …`: export, verify, profile, and optionally write a manifest.

NETWORK is any network in the registry (`inferop_export.networks`); `onnx` takes a user's ONNX file and
`torch` a user's PyTorch module from an importable factory. The serving flags are the spec's own fields,
with the spec's defaults: what they write is what the operator would render.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inferop_core.errors import InferopError
from inferop_core.processing import Processing
from inferop_core.storagecli import add_endpoint_arguments, endpoint_from
from inferop_export.data import FORMS
from inferop_export.pipeline import PIPELINES
from inferop_export.precision import GATE_BATCH, GATE_KEYS, PRECISIONS
from inferop_operator.spec import Batching, Pipeline, Serving, SpecError, Threads, Timeouts


@dataclass(frozen=True)
class ServingFlag:
    """A command-line flag that sets one field of the spec's serving settings."""

    flag: str
    path: tuple[str, ...]  # the field's camelCase path in the spec
    section: type[Any]  # the spec model that owns the field, for its description and default
    field: str
    kind: Callable[[str], Any] = int  # what argparse parses the value as: the spec field's own type and unit

    def help(self) -> str:
        info = self.section.model_fields[self.field]
        shown = "derived" if info.default is None else f"{info.default:g}"
        return f"{info.description} (spec.{'.'.join(self.path)}; default: {shown})"


SERVING_FLAGS = (
    ServingFlag("--max-batch-size", ("batching", "maxBatchSize"), Batching, "max_batch_size"),
    ServingFlag("--instances", ("instances",), Serving, "instances"),
    ServingFlag("--intra-op-threads", ("threads", "intraOp"), Threads, "intra_op"),
    ServingFlag("--inter-op-threads", ("threads", "interOp"), Threads, "inter_op"),
    ServingFlag(
        "--max-queue-delay-us", ("batching", "maxQueueDelayMicroseconds"), Batching, "max_queue_delay_microseconds"
    ),
    ServingFlag("--max-queue-size", ("batching", "maxQueueSize"), Batching, "max_queue_size"),
    ServingFlag("--request-timeout-seconds", ("timeouts", "requestSeconds"), Timeouts, "request_seconds", float),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from inferop_export.networks import registered_networks

    sources = parser.add_subparsers(dest="source", required=True, metavar="NETWORK|onnx|torch")
    for name, contract in registered_networks().items():
        sub = sources.add_parser(name, help=contract.help, description=contract.help)
        contract.add_arguments(sub)
        sub.set_defaults(build=contract.build)
        _add_common(sub)

    onnx = sources.add_parser("onnx", help="your own ONNX file", description="Serve your own ONNX file.")
    onnx.add_argument("file", type=Path, help="the .onnx file (weights inside it, or beside it as external data)")
    onnx.add_argument("--name", help="model name (the URL path); default: the file's name without .onnx")
    onnx.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME=DIMS",
        help="fix an input's open dims, e.g. tokens=128 (without the batch axis); repeat per input",
    )
    onnx.add_argument("--tolerance", type=float, help="max |ONNX Runtime - ONNX reference| accepted (default 1e-3)")
    _add_user_model(onnx)
    _add_common(onnx)

    module = sources.add_parser(
        "torch", help="your own PyTorch module", description="Serve your own PyTorch module, built by a factory."
    )
    module.add_argument("target", help="package.module:factory, a callable that returns the torch.nn.Module")
    module.add_argument(
        "--input",
        action="append",
        default=[],
        required=True,
        metavar="NAME=DIMS[:DTYPE]",
        help="each argument of forward, in order, e.g. images=3,224,224 or ids=16:INT64 (dims without the batch "
        "axis; dtype FP32 unless given)",
    )
    module.add_argument("--output", action="append", default=[], metavar="NAME", help="output names, in order")
    module.add_argument("--name", help="model name (the URL path); default: the module's name")
    module.add_argument("--app-dir", type=Path, default=Path("."), help="directory to import the factory from")
    module.add_argument("--weights", type=Path, help="a state dict (.pth) to load into the module")
    module.add_argument("--tolerance", type=float, help="max |ONNX Runtime - PyTorch| accepted (default 1e-3)")
    _add_user_model(module)
    _add_common(module)


def _add_user_model(parser: argparse.ArgumentParser) -> None:
    """What a built-in network declares itself and a user's model is told: how callers use it, its classes."""
    parser.add_argument(
        "--processing",
        metavar="JSON",
        help="how callers make inputs and read outputs, as the spec's model.processing, e.g. "
        '\'{"kind": "imageClassification", "resizeRatio": 1.14, "mean": [0.485, 0.456, 0.406], "std": [0.229, '
        "0.224, 0.225]}' (default: plain tensors); an image classifier's --calibration and --validation may then be "
        "folders of images",
    )
    parser.add_argument(
        "--labels",
        type=Path,
        metavar="FILE",
        help="class names of the first output, one a line: served for Triton's classification extension, and the "
        "names of an image folder's class subfolders",
    )


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path("model_repo"), help="model repository (default model_repo)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and test inputs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp32",
        help="int8: static quantization (QDQ, per-channel weights) calibrated on --calibration, written only if it "
        "keeps fp32's answers on --validation as its gate says; a built-in network may use its own generated inputs "
        "and gate (default fp32)",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="PATH",
        help=f"int8's calibration samples: {FORMS}",
    )
    parser.add_argument(
        "--validation",
        type=Path,
        metavar="PATH",
        help="held-out samples the gate compares int8 with fp32 on (with 'labels', accuracy too), as --calibration",
    )
    parser.add_argument(
        "--gate",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set the accuracy gate; repeat per key: " + "; ".join(f"{k}: {v}" for k, v in GATE_KEYS.items()),
    )
    parser.add_argument(
        "--no-fallback",
        dest="fallback",
        action="store_false",
        help="int8 with every compute node quantized or nothing; by default, where that fails the gate, the first and "
        "last compute nodes, then those that add the most quantization noise, are tried in fp32 (at most half)",
    )
    parser.add_argument(
        "--gate-batch",
        type=int,
        default=GATE_BATCH,
        metavar="N",
        help="samples int8's gate runs through fp32 and int8 at once; the memory an int8 export needs grows with it, "
        f"and the noise measure of the fallback asks for no more at a time (default {GATE_BATCH})",
    )
    parser.add_argument(
        "--pipeline",
        choices=PIPELINES,
        help="serve an image classifier behind its pipeline (spec.pipeline): callers send the ensemble NAME the bytes "
        "of a JPEG or PNG and read the top labels; the model is written as NAME_model beside the stages NAME_pre and "
        "NAME_post, the stages' cost measured here, and photographs are sent through all of it on tritonserver",
    )
    parser.add_argument(
        "--top-k",
        type=int,
        metavar="K",
        help=f"with --pipeline: labels, with their probabilities, in each answer (spec.pipeline.topK; default "
        f"{Pipeline.model_fields['top_k'].default})",
    )
    parser.add_argument("--manifest", type=Path, help="also write a ready-to-apply InferenceService to this file")
    parser.add_argument(
        "--storage-uri",
        help="the manifest's model.storageUri (pvc://claim/path, hostpath:///path, oci://image, s3://bucket/path, "
        "https://host/model.tar.gz); default: hostpath:// of the exported model directory",
    )
    parser.add_argument(
        "--upload",
        action="store_true",
        help="push the exported model directory to --storage-uri (s3://) once it passed its checks, as inferop push",
    )
    parser.add_argument(
        "--credentials-secret",
        metavar="SECRET",
        help="the manifest's model.storage.credentialsSecret: the Secret in the service's namespace that holds "
        "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY for an s3:// storage URI",
    )
    add_endpoint_arguments(parser)  # --endpoint, --region, --addressing: for --upload and model.storage
    serving = parser.add_argument_group("serving settings (the InferenceService spec's fields and defaults)")
    for flag in SERVING_FLAGS:
        serving.add_argument(flag.flag, type=flag.kind, help=flag.help())
    serving.add_argument(
        "--gpu-memory",
        metavar="QUANTITY",
        help="serve on one GPU with this much device memory, e.g. 16Gi (spec.gpu.memory, with a limit of one "
        "nvidia.com/gpu): the instances run on it, each under its share as gpu_mem_limit; default: CPU",
    )


def serving_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The serving flags that were given, as a spec's camelCase sections; the spec model fills the rest."""
    settings: dict[str, Any] = {}
    for flag in SERVING_FLAGS:
        value = getattr(args, flag.flag.removeprefix("--").replace("-", "_"))
        if value is not None:
            *sections, leaf = flag.path
            target = settings
            for section in sections:
                target = target.setdefault(section, {})
            target[leaf] = value
    return settings


def build_source(args: argparse.Namespace) -> Any:
    """What the subcommand names: a registered network, a user's ONNX file, or a user's module."""
    from inferop_export.signature import parse_input_flag
    from inferop_export.sources import DEFAULT_TOLERANCE, OnnxFile, model_name, torch_module

    flags = [parse_input_flag(text) for text in getattr(args, "input", [])]
    tolerance = args.tolerance if getattr(args, "tolerance", None) is not None else DEFAULT_TOLERANCE
    if args.source not in ("onnx", "torch"):
        return args.build(args)
    processing, labels = parse_processing(args.processing), read_labels(args.labels)  # what a user's model is
    if args.source == "onnx":
        if not args.file.is_file():
            raise FileNotFoundError(f"{args.file}: no such file")
        name = model_name(args.name or args.file.stem, "--name" if args.name else "the file's name")
        overrides = {flag.name: flag for flag in flags}
        return OnnxFile(name, args.file, tolerance, overrides, labels=labels, processing=processing)
    module = args.target.partition(":")[0].rpartition(".")[2]
    name = model_name(args.name or module, "--name" if args.name else "the module's name")
    source = torch_module(
        args.target, flags, name, args.app_dir, args.output, args.weights, tolerance=tolerance, seed=args.seed
    )
    return dataclasses.replace(source, labels=labels, processing=processing)


def pipeline_settings(args: argparse.Namespace) -> Pipeline | None:
    """spec.pipeline from --pipeline and --top-k, checked as the spec checks it."""
    from pydantic import ValidationError

    from inferop_operator.spec import format_errors

    if args.pipeline is None:
        if args.top_k is not None:
            raise InferopError("--top-k is for --pipeline image")
        return None
    try:
        return Pipeline.model_validate({"input": args.pipeline, **({} if args.top_k is None else {"topK": args.top_k})})
    except ValidationError as error:
        raise SpecError(f"--top-k {args.top_k}: {format_errors(error).replace('spec.', 'spec.pipeline.')}") from None


def parse_processing(text: str | None) -> Processing | None:
    """`--processing` as the spec's model.processing (camelCase JSON), an error naming the flag otherwise."""
    from pydantic import ValidationError

    if text is None:
        return None
    try:
        return Processing.model_validate_json(text)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'value'}: {str(e['msg']).removeprefix('Value error, ')}"
            for e in error.errors()
        )
        raise InferopError(f"--processing {text!r}: {problems}") from None


def read_labels(path: Path | None) -> list[str] | None:
    """`--labels`: one class name a line, blank lines at the end ignored."""
    if path is None:
        return None
    try:
        names = path.read_text().rstrip("\n").split("\n")
    except OSError as error:
        raise InferopError(f"--labels {path}: {error.strerror or error}") from None
    blank = [number for number, name in enumerate(names, 1) if not name.strip()]
    if blank or len(set(names)) != len(names):
        why = f"line {blank[0]} is blank" if blank else "a name appears twice"
        raise InferopError(f"--labels {path}: {why}; give one class name a line, in the output's order")
    return names


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from inferop_export.exporter import Cost, VerificationError, export_model
    from inferop_export.memory import peak_resident_bytes
    from inferop_export.precision import UserData
    from inferop_operator.spec import parse_serving

    started = time.perf_counter()
    try:
        storage = object_storage(args)
        serving = parse_serving(serving_settings(args))
        pipeline = pipeline_settings(args)
        report = export_model(
            build_source(args),
            args.repo,
            serving=serving,
            seed=args.seed,
            quiet=args.json,
            storage_uri=args.storage_uri,
            storage=storage,
            precision=args.precision,
            gpu_memory=args.gpu_memory,
            data=UserData(args.calibration, args.validation, tuple(args.gate)),
            fallback=args.fallback,
            gate_batch=args.gate_batch,
            started=started,
            pipeline=pipeline,
        )
    except VerificationError as error:
        print(f"verification failed: {error}", file=sys.stderr)
        print(f"  {Cost(round(time.perf_counter() - started, 3), peak_resident_bytes()).describe()}", file=sys.stderr)
        return 1
    except (InferopError, ValueError, ValidationError, FileNotFoundError) as error:  # bad input of any kind
        print(f"error: {error}", file=sys.stderr)
        return 2

    if args.upload:
        from inferop_core.objectstore import StorageError, push

        try:
            written = push(args.repo / report.spec.model.name, args.storage_uri, endpoint_from(args))
        except StorageError as error:
            print(f"error: --upload: {error.with_reason()}", file=sys.stderr)
            return 1
        print(f"uploaded {len(written)} objects to {args.storage_uri}", file=sys.stderr)
    if args.manifest:
        from inferop_export.manifest import write_manifest

        try:
            write_manifest(report.spec, args.manifest)
        except (InferopError, ValueError) as error:
            print(f"error: --manifest: {error}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(format_report(report.as_dict()))
    return 0


# model.storage's fields that export's options set, and the options.
STORAGE_OPTIONS = {
    "endpoint": "--endpoint",
    "region": "--region",
    "addressing": "--addressing",
    "credentialsSecret": "--credentials-secret",
}


def object_storage(args: argparse.Namespace) -> dict[str, Any] | None:
    """model.storage for the manifest, from the endpoint options and --credentials-secret where the storage URI is
    s3:// (checked as the spec checks it, before anything is exported); --upload needs an s3:// URI."""
    from pydantic import ValidationError

    from inferop_operator.spec import ObjectStorage

    s3 = (args.storage_uri or "").startswith("s3://")
    if args.upload and not s3:
        raise InferopError(f"--upload needs --storage-uri s3://bucket/path, got {args.storage_uri!r}")
    given = {
        "endpoint": args.endpoint,
        "region": args.region,
        "addressing": None if args.addressing == "auto" else args.addressing,
        "credentialsSecret": args.credentials_secret,
    }
    storage = {key: value for key, value in given.items() if value is not None}
    if storage and not s3:
        flags = ", ".join(STORAGE_OPTIONS[key] for key in storage)
        raise InferopError(f"{flags}: only for an s3:// --storage-uri, got {args.storage_uri!r}")
    try:
        ObjectStorage.model_validate(storage)
    except ValidationError as error:
        problems = [
            f"{STORAGE_OPTIONS[key]} {storage[key]!r}: {item['msg']}"
            for item in error.errors()
            if (key := str(item["loc"][0])) in STORAGE_OPTIONS
        ]
        raise InferopError("; ".join(problems) or str(error)) from None
    return storage or None


def format_report(report: dict[str, Any]) -> str:
    profile, serving = report["profile"], report["serving"]
    lines = [f"{report['model']}: {report['modelPath']}", f"  onnx.checker: {report['checker']}"]
    if report["parity"]:
        worst = max(report["parity"], key=lambda p: p["maxAbsDiff"])
        lines.append(
            f"  ONNX Runtime vs {report['parityAgainst']}: max |diff| {worst['maxAbsDiff']:.3g} (batch "
            f"{worst['batch']}, {worst['output']}) within tolerance {report['tolerance']:g} at batches "
            f"{sorted({p['batch'] for p in report['parity']})}"
        )
    if report["gate"]:
        lines.append(f"  precision {report['gate']['summary']}")
    if report["fp32Nodes"]:
        lines.append(f"  left in fp32: {', '.join(report['fp32Nodes'])} ({report['attempts'][-1]['why']})")
    if report["speedVerdict"]:
        lines.append(f"  speed: {report['speedVerdict']} (ONNX Runtime, one thread, both measured here)")
    tensors = (
        ", ".join(f"{t['name']} {t['datatype']} {t['dims']}" for t in serving["inputs"])
        + " -> "
        + ", ".join(f"{t['name']} {t['datatype']} {t['dims']}" for t in serving["outputs"])
    )
    lines += [
        f"  tensors: {tensors} (max_batch_size {serving['max_batch_size']})",
        f"  parameters: {profile['parameters']:,}",
        f"  multiply-accumulates per sample: {profile['macs_per_sample']:,} ({profile['macs_per_sample'] / 1e9:.3f} G)",
        f"  weight bytes: {profile['weight_bytes']:,} ({profile['weight_bytes'] / 2**20:.1f} MiB)",
        f"  activation bytes per sample (peak live): {profile['activation_bytes_per_sample']:,} "
        f"({profile['activation_bytes_per_sample'] / 2**20:.2f} MiB)",
        f"  capacity: {profile['samples_per_cpu_second']:.1f} samples per CPU-second "
        f"(ONNX Runtime, one thread, batch {max(serving['max_batch_size'], 1)}); "
        f"queue bound {serving['max_queue_size']}",
        f"  weights: {serving['weights']}",
        f"  config: {report['configPath']}",
        f"  {report['cost']['summary']}",
    ]
    if report["pipeline"]:
        lines.append(f"  pipeline: {report['pipeline']}")
    lines += [f"  note: {note}" for note in report["notes"]]
    return "\n".join(lines)

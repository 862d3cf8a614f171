"""`inferop export conv_net|inception_v3 …`: export, verify, profile, and optionally write a manifest."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from inferop.threads import local_cpus, plan_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    networks = parser.add_subparsers(dest="network", required=True, metavar="NETWORK")
    conv = networks.add_parser("conv_net", help="AlphaZero-style policy/value convolutional network")
    conv.add_argument("--rows", type=int, default=8, help="board rows (default 8)")
    conv.add_argument("--cols", type=int, default=7, help="board columns (default 7)")
    conv.add_argument("--depth", type=int, default=10, help="3x3 convolutions in the torso (default 10)")
    conv.add_argument("--hidden", type=int, default=128, help="channels in the torso (default 128)")
    conv.add_argument("--moves", type=int, default=7, help="policy outputs (default 7)")
    inception = networks.add_parser("inception_v3", help="torchvision Inception V3, 299x299 images, 1000 classes")
    inception.add_argument(
        "--weights", type=Path, help="torchvision-layout state dict (.pth); default: seeded random weights"
    )
    for sub in (conv, inception):
        _add_common(sub)


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repo", type=Path, default=Path("model_repo"), help="model repository (default model_repo)")
    parser.add_argument("--seed", type=int, default=0, help="seed for random weights and test inputs")
    parser.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    parser.add_argument("--manifest", type=Path, help="also write a ready-to-apply InferenceService to this file")
    parser.add_argument(
        "--storage-uri",
        help="the manifest's model.storageUri (pvc://claim/path, hostpath:///path, oci://image); "
        "default: hostpath:// of the exported model directory",
    )
    serving = parser.add_argument_group("serving settings written to config.pbtxt")
    serving.add_argument("--max-batch-size", type=int, default=8)
    serving.add_argument("--instances", type=int, default=1, help="model instances (each has its own threads)")
    serving.add_argument("--intra-op-threads", type=int, help="default: floor(CPUs / instances) of this machine")
    serving.add_argument("--inter-op-threads", type=int, default=1)
    serving.add_argument("--max-queue-delay-us", type=int, default=2000, help="dynamic batching wait")
    serving.add_argument(
        "--max-queue-size",
        type=int,
        help="requests queued before rejecting (default: derived from the measured capacity and the timeout)",
    )
    serving.add_argument(
        "--request-timeout-ms", type=int, default=10_000, help="queue time after which a request is rejected"
    )


def run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from inferop_export import catalog
    from inferop_export.exporter import VerificationError, export_network

    threads = plan_threads(local_cpus(), args.instances, args.intra_op_threads, args.inter_op_threads)
    serving = {
        "max_batch_size": args.max_batch_size,
        "instances": args.instances,
        "intra_op_threads": threads.intra_op,
        "inter_op_threads": threads.inter_op,
        "max_queue_delay_microseconds": args.max_queue_delay_us,
        "request_timeout_microseconds": args.request_timeout_ms * 1000,
    }
    if args.max_queue_size is not None:
        serving["max_queue_size"] = args.max_queue_size
    try:
        if args.network == "conv_net":
            network = catalog.conv_net(args.rows, args.cols, args.depth, args.hidden, args.moves, seed=args.seed)
        else:
            if args.weights is not None and not args.weights.is_file():
                print(f"error: --weights {args.weights}: no such file", file=sys.stderr)
                return 2
            network = catalog.inception_v3(weights=args.weights, seed=args.seed)
        report = export_network(network, args.repo, serving=serving, seed=args.seed, quiet=args.json)
    except (ValueError, ValidationError) as error:  # bad sizes, bad weights file, bad serving settings
        print(f"error: {error}", file=sys.stderr)
        return 2
    except VerificationError as error:
        print(f"verification failed: {error}", file=sys.stderr)
        return 1

    if args.manifest:
        from inferop_export.manifest import write_manifest

        storage_uri = args.storage_uri or f"hostpath://{Path(report.config_path).parent.resolve()}"
        try:
            write_manifest(report.serving, report.profile, storage_uri, args.manifest, queue_size=args.max_queue_size)
        except (ValueError, ValidationError) as error:
            print(f"error: --manifest: {error}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(format_report(report.as_dict()))
    return 0


def format_report(report: dict) -> str:
    profile = report["profile"]
    worst = max(report["parity"], key=lambda p: p["maxAbsDiff"])
    lines = [
        f"{report['model']}: {report['modelPath']}",
        f"  onnx.checker: {report['checker']}",
        f"  ONNX Runtime vs PyTorch: max |diff| {worst['maxAbsDiff']:.3g} (batch {worst['batch']}, "
        f"{worst['output']}) within tolerance {report['tolerance']:g} at batches "
        f"{sorted({p['batch'] for p in report['parity']})}",
        f"  parameters: {profile['parameters']:,}",
        f"  multiply-accumulates per sample: {profile['macs_per_sample']:,} ({profile['macs_per_sample'] / 1e9:.3f} G)",
        f"  weight bytes: {profile['weight_bytes']:,} ({profile['weight_bytes'] / 2**20:.1f} MiB)",
        f"  activation bytes per sample (peak live): {profile['activation_bytes_per_sample']:,} "
        f"({profile['activation_bytes_per_sample'] / 2**20:.2f} MiB)",
        f"  capacity: {profile['samples_per_cpu_second']:.1f} samples per CPU-second "
        f"(ONNX Runtime, one thread, batch {report['serving']['max_batch_size']}); "
        f"queue bound {report['serving']['max_queue_size']}",
        f"  weights: {report['serving']['weights']}",
        f"  config: {report['configPath']}",
    ]
    return "\n".join(lines)

"""The `inferop` command line.

Each subcommand lives in its own module with `add_parser(subparsers)` and a `run(args) -> int`; modules are
imported lazily so `inferop operator` never pays for torch and `inferop --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> (module, one-line help). The module defines add_arguments(parser) and run(args) -> int.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "export": ("inferop_export.cli", "export a network to ONNX in a Triton model repository, verified"),
    "serve": ("inferop.serving.cli", "serve a model repository with a local tritonserver"),
    "infer": ("inferop.client", "call a Triton endpoint with the HTTP client"),
    "bench": ("inferop.bench", "measure latency and throughput against concurrency"),
    "cluster": ("inferop.cluster.cli", "a local Kubernetes control plane: up, down, status"),
    "operator": ("inferop_operator.cli", "run the InferenceService operator"),
}


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="inferop", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub = subparsers.add_parser(name, help=help_text, description=help_text)
        if name == chosen:  # only the chosen command's module is imported
            module = importlib.import_module(module_name)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

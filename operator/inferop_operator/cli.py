"""`inferop operator`: run the InferenceService operator against the current KUBECONFIG (or in-cluster)."""

from __future__ import annotations

import argparse
import asyncio


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (the default)")
    parser.add_argument(
        "--liveness", default=None, help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("--log-format", choices=["plain", "json"], help="default: INFEROP_LOG_FORMAT or plain")
    parser.add_argument("--verbose", action="store_true", help="debug logging")


def run(args: argparse.Namespace) -> int:
    import kopf

    from inferop_operator import handlers

    log_format = (
        kopf.LogFormat.JSON if (args.log_format or handlers.SETTINGS.log_format) == "json" else kopf.LogFormat.PLAIN
    )
    kopf.configure(verbose=args.verbose, log_format=log_format)
    settings = kopf.OperatorSettings()
    # Exact namespaces need no watching of Namespaces and CRDs across the cluster, nor RBAC for it.
    settings.scanning.disabled = bool(args.namespace)
    asyncio.run(
        kopf.operator(
            # One replica with a Recreate strategy: no peering needed to avoid two operators at once.
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=args.liveness,
            settings=settings,
        )
    )
    return 0

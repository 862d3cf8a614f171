"""The command-line options that `inferop fetch`, `inferop push` and `inferop serve --repo s3://...` share: where
the S3 API answers and how long and how much a fetch may take. Credentials come from AWS_ACCESS_KEY_ID and
AWS_SECRET_ACCESS_KEY (the SDK reads them; they are never printed)."""

from __future__ import annotations

import argparse

from inferop_core.errors import InferopError
from inferop_core.objectstore import FetchLimits, S3Endpoint
from inferop_core.quantity import parse_quantity


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("S3 endpoint", "for s3:// URIs; credentials from AWS_ACCESS_KEY_ID/SECRET")
    group.add_argument("--endpoint", help="an S3-compatible server, http(s)://host:port (default: AWS by --region)")
    group.add_argument("--region", help="the bucket's region (default: the server's, or us-east-1)")
    group.add_argument(
        "--addressing",
        choices=("auto", "path", "virtual"),
        default="auto",
        help="path-style (host/bucket/key) or virtual-hosted (bucket.host/key); auto: virtual for AWS only",
    )


def endpoint_from(args: argparse.Namespace) -> S3Endpoint:
    return S3Endpoint(url=args.endpoint, region=args.region, addressing=args.addressing)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("download limits")
    group.add_argument(
        "--download-timeout", type=float, default=300.0, help="seconds for the whole download (default 300)"
    )
    group.add_argument("--attempts", type=int, default=5, help="tries per request, backing off (default 5)")
    group.add_argument("--max-size", help="refuse more than this many bytes: 2Gi, 500Mi (default: no limit)")


def limits_from(args: argparse.Namespace) -> FetchLimits:
    if args.download_timeout <= 0:
        raise StorageArgumentError(f"--download-timeout: {args.download_timeout:g} must be more than 0 seconds")
    if args.attempts < 1:
        raise StorageArgumentError(f"--attempts: {args.attempts} must be at least 1")
    try:
        max_bytes = None if args.max_size is None else int(parse_quantity(args.max_size, "--max-size"))
    except ValueError as error:
        raise StorageArgumentError(str(error)) from error
    if max_bytes is not None and max_bytes < 1:
        raise StorageArgumentError(f"--max-size: {args.max_size!r} must be at least one byte")
    return FetchLimits(timeout_seconds=args.download_timeout, attempts=args.attempts, max_bytes=max_bytes)


class StorageArgumentError(InferopError, ValueError):
    """A limit or endpoint given on the command line that cannot be used; the message names the flag."""

"""`inferop fetch`: a model directory from object storage into a folder, checked against its digest.

What a pod runs before Triton starts (the operator's init container), and what `inferop serve --repo s3://...` does
first. On failure it exits 1 and, given --termination-log, writes the reason first so that the pod's status carries
it (`<reason>: <message>`).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from inferop_core.objectstore import StorageError, fetch
from inferop_core.storagecli import (
    StorageArgumentError,
    add_endpoint_arguments,
    add_limit_arguments,
    endpoint_from,
    limits_from,
)
from inferop_core.tritonconfig import SHA256_PATTERN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("uri", help="s3://bucket/path (a model directory or a repository), or http(s)://...tar.gz")
    parser.add_argument("destination", type=Path, help="the folder to fetch into (replaced when complete)")
    parser.add_argument(
        "--sha256", help="the model file's SHA-256 as export recorded it (default: the digest in the fetched config)"
    )
    parser.add_argument(
        "--termination-log",
        type=Path,
        help="on failure, write '<reason>: <message>' here (a pod's /dev/termination-log, read back into its status)",
    )
    add_endpoint_arguments(parser)
    add_limit_arguments(parser)


def run(args: argparse.Namespace) -> int:
    if args.sha256 is not None and not re.fullmatch(SHA256_PATTERN, args.sha256):
        raise StorageArgumentError(f"--sha256: {args.sha256!r} is not 64 lower-case hexadecimal digits")
    try:
        fetched = fetch(args.uri, args.destination, endpoint_from(args), limits_from(args), args.sha256)
    except StorageError as error:
        if args.termination_log is not None:
            args.termination_log.write_text(error.with_reason())
        print(f"inferop fetch: {error.with_reason()}", file=sys.stderr)
        return 1
    print(fetched.summary(args.uri), file=sys.stderr)
    return 0

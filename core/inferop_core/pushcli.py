"""`inferop push`: an exported model directory into a bucket, where `inferop fetch` and the operator find it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from inferop_core.objectstore import StorageError, push
from inferop_core.storagecli import add_endpoint_arguments, endpoint_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("folder", type=Path, help="an exported model directory (or a repository of them)")
    parser.add_argument("uri", help="s3://bucket/path to write it to")
    add_endpoint_arguments(parser)


def run(args: argparse.Namespace) -> int:
    try:
        written = push(args.folder, args.uri, endpoint_from(args))
    except StorageError as error:
        print(f"inferop push: {error.with_reason()}", file=sys.stderr)
        return 1
    for uri in written:
        print(uri)
    return 0

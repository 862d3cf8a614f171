"""The `--drills`/`--scenarios` option of the drill commands: a comma-separated subset of named parts."""

from __future__ import annotations

import argparse
from collections.abc import Iterable


def add_subset_option(parser: argparse.ArgumentParser, option: str, names: Iterable[str]) -> None:
    """`option` takes a comma-separated subset of `names` (default: all, in their order); an unknown name is a usage
    error that lists the choices."""
    known = list(names)

    def subset(text: str) -> list[str]:
        chosen = [name.strip() for name in text.split(",") if name.strip()]
        unknown = sorted(set(chosen) - set(known))
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(unknown)}; choose from {', '.join(known)}")
        return chosen

    parser.add_argument(option, type=subset, default=list(known), help=f"comma-separated, of {', '.join(known)}")

"""The `inferop` command line.

Each installed distribution registers its subcommands in the entry-point group `inferop.commands` (see
`inferop_core.commands`). Only the chosen command's module is imported, so `inferop operator` never pays for torch
and `inferop --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from inferop_core.commands import PROVIDERS, Command, CommandNotInstalled, installed, missing
from inferop_core.errors import InferopError


def build_parser(argv: list[str], commands: dict[str, Command] | None = None) -> argparse.ArgumentParser:
    commands = installed() if commands is None else commands
    absent = missing(commands)
    epilog = None
    if absent:
        names = ", ".join(f"{name} ({PROVIDERS[name].distribution})" for name in absent)
        epilog = f"not installed here: {names}"
    parser = argparse.ArgumentParser(prog="inferop", description=__doc__.splitlines()[0], epilog=epilog)
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    chosen = _chosen(argv)
    for name, command in commands.items():
        sub = subparsers.add_parser(name, help=command.help, description=command.help)
        if name == chosen:  # only the chosen command's module is imported
            module = importlib.import_module(command.module)
            module.add_arguments(sub)
            sub.set_defaults(handler=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    commands = installed()
    chosen = _chosen(argv)
    if chosen in PROVIDERS and chosen not in commands:
        print(f"inferop: {CommandNotInstalled(chosen)}", file=sys.stderr)
        return 2
    try:
        args = build_parser(argv, commands).parse_args(argv)
        return int(args.handler(args) or 0)
    except InferopError as error:  # ours, with a message a user can act on: no traceback
        print(f"inferop: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _chosen(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


if __name__ == "__main__":
    sys.exit(main())

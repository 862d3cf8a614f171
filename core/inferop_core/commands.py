"""The `inferop` subcommands, found through the entry-point group `inferop.commands`.

Each distribution registers its own commands in its `pyproject.toml`: the local runtime (inferop) `serve`, `infer`
and `bench`, inferop-operator `operator`, inferop-export `export` and `tune`, inferop-devtools `cluster`. So the core
names no module of another distribution, and an install holds exactly the commands of what it installed (the
operator image has no `export` and no `serve`). An entry point names a `Command`, a module path and a help line
kept in a module that imports nothing heavy, so `inferop --help` imports no command module and only the chosen
command's module is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import entry_points

from inferop_core.errors import InferopError

GROUP = "inferop.commands"


@dataclass(frozen=True)
class Command:
    """A subcommand: `module` defines `add_arguments(parser)` and `run(args) -> int`, imported only when chosen."""

    module: str
    help: str


@dataclass(frozen=True)
class Provider:
    """The distribution that registers a command, and the folder pip installs it from in a checkout of inferop."""

    distribution: str
    folder: str


# The core's own: what a pod runs before Triton starts, and its counterpart for whoever exports.
FETCH = Command("inferop_core.fetchcli", "fetch a model directory from s3:// or http(s):// and check its digest")
PUSH = Command("inferop_core.pushcli", "put an exported model directory into an s3:// bucket")


# Only names, so a command whose distribution is not installed can say which to install; the core imports none
# of them (an import-linter contract in `make check`).
PROVIDERS: dict[str, Provider] = {
    "fetch": Provider("inferop-core", "./core"),
    "push": Provider("inferop-core", "./core"),
    "serve": Provider("inferop", "."),
    "infer": Provider("inferop", "."),
    "bench": Provider("inferop", "."),
    "operator": Provider("inferop-operator", "./operator"),
    "plan": Provider("inferop-operator", "./operator"),
    "rollout": Provider("inferop-operator", "./operator"),
    "export": Provider("inferop-export", "./export"),
    "tune": Provider("inferop-export", "./export"),
    "cluster": Provider("inferop-devtools", "./devtools"),
}


class CommandNotInstalled(InferopError):
    """`inferop NAME` where the distribution that provides NAME is not installed."""

    def __init__(self, name: str) -> None:
        provider = PROVIDERS[name]
        super().__init__(
            f"inferop {name} is provided by {provider.distribution}, which is not installed here: "
            f"pip install {provider.distribution} (from a checkout of inferop: pip install {provider.folder})"
        )


def installed() -> dict[str, Command]:
    """The commands that the installed distributions register, by name."""
    commands: dict[str, Command] = {}
    for entry in sorted(entry_points(group=GROUP), key=lambda entry: entry.name):
        command = entry.load()
        if not isinstance(command, Command):
            raise TypeError(f"entry point {entry.name} = {entry.value} in group {GROUP} is not an inferop Command")
        commands.setdefault(entry.name, command)
    return commands


def missing(commands: dict[str, Command]) -> list[str]:
    """Known commands whose distribution is not installed, in the order of `PROVIDERS`."""
    return [name for name in PROVIDERS if name not in commands]

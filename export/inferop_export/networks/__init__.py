"""The networks `inferop export NAME` knows: one module each, found through one registry.

A network module defines `NETWORK`, a `NetworkContract`: its command-line arguments and how it builds a
`TorchModule` from them, which declares its input tensors, its verification tolerance, how test inputs are
made, and the client's pre- and post-processing. Built-in networks and plug-ins are registered alike, as
entry points in the group `inferop.networks` (`name = "package.module:NETWORK"`), so a third network is one
module and its tests, and a plug-in is a package that declares one entry point.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points

from inferop_core.errors import InferopError
from inferop_export.sources import TorchModule

ENTRY_POINT_GROUP = "inferop.networks"
# Names `inferop export` uses for a user's own model; no network may take them.
RESERVED_NAMES = frozenset({"onnx", "torch"})


class RegistryError(InferopError):
    """A registered network cannot be loaded or clashes with another; the message names the entry point."""


@dataclass(frozen=True)
class NetworkContract:
    """One network: how `inferop export NAME` parses its arguments and builds the module to export."""

    name: str
    help: str  # one line for `inferop export --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]  # network-specific flags (sizes, weights)
    build: Callable[[argparse.Namespace], TorchModule]  # args also carry `seed`


def registered_networks() -> dict[str, NetworkContract]:
    """Every network of the group, by name, in name order; a broken or clashing entry point is an error that
    names it, rather than a network that silently goes missing."""
    networks: dict[str, NetworkContract] = {}
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            contract = entry.load()
        except Exception as error:  # a plug-in's import failed: name it, with its reason
            raise RegistryError(f"network {entry.name!r} ({entry.value}) cannot be loaded: {error}") from error
        if not isinstance(contract, NetworkContract):
            raise RegistryError(
                f"network {entry.name!r} ({entry.value}) is a {type(contract).__name__}, not a NetworkContract"
            )
        if contract.name != entry.name:
            raise RegistryError(f"network {entry.name!r} ({entry.value}) calls itself {contract.name!r}")
        if entry.name in RESERVED_NAMES or entry.name in networks:
            raise RegistryError(f"network {entry.name!r} ({entry.value}) clashes with another command of the same name")
        networks[entry.name] = contract
    return networks

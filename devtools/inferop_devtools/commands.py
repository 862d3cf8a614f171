"""The command this distribution registers in the entry-point group `inferop.commands` (see `inferop.commands`)."""

from inferop.commands import Command

CLUSTER = Command("inferop_devtools.cluster.cli", "a local Kubernetes control plane: up, down, status")

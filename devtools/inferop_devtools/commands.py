"""The command this distribution registers in the entry-point group `inferop.commands` (see `inferop_core.commands`)."""

from inferop_core.commands import Command

CLUSTER = Command("inferop_devtools.cluster.cli", "a local Kubernetes control plane: up, down, status")

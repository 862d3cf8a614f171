"""The command this distribution registers in the entry-point group `inferop.commands` (see `inferop_core.commands`)."""

from inferop_core.commands import Command

OPERATOR = Command("inferop_operator.cli", "run the InferenceService operator")

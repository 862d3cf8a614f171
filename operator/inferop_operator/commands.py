"""The command this distribution registers in the entry-point group `inferop.commands` (see `inferop.commands`)."""

from inferop.commands import Command

OPERATOR = Command("inferop_operator.cli", "run the InferenceService operator")

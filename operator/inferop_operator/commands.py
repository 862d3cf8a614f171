"""The commands this distribution registers in the entry-point group `inferop.commands` (`inferop_core.commands`)."""

from inferop_core.commands import Command

OPERATOR = Command("inferop_operator.cli", "run the InferenceService operator")
PLAN = Command("inferop_operator.plancli", "what the operator decides for an InferenceService, offline")
ROLLOUT = Command("inferop_operator.rolloutcli", "see and steer the rollout of an InferenceService")
